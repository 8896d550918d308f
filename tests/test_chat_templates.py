"""Chat templates: a chat prompt is rendered once by the policy's own template, a templated one never again."""
from __future__ import annotations

import json
import shutil

import pytest

from backends.chat import TemplateError, render
from sample_data import POLICY_DIR
from studio.runs.generation import GenerateConfig, generate_sync
from studio.tasks import Prompt, get_task

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and not "
          "enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}")


@pytest.fixture
def chat_policy(tmp_path):
    """The sample policy's weights with a ChatML template on its tokenizer."""
    folder = tmp_path / "chat-sample"
    shutil.copytree(POLICY_DIR, folder)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["chat_template"] = CHATML
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return folder


def _tokenizer(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def test_a_chat_is_rendered_once_with_the_generation_prompt_and_the_thinking_switch(chat_policy):
    tok = _tokenizer(chat_policy)
    chat = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]}
    text = render(tok, chat)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    assert render(tok, {**chat, "thinking": False}).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert render(tok, text) == text  # a templated string is given as it is: never templated twice


def test_a_policy_without_a_template_reads_the_last_user_message():
    tok = _tokenizer(POLICY_DIR)
    assert render(tok, {"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "Q: 2+3="}]}) \
        == "Q: 2+3="


def test_a_template_that_fails_names_the_roles(chat_policy):
    tok = _tokenizer(chat_policy)
    tok.chat_template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(TemplateError, match=r"roles \[user\].*roles must alternate"):
        render(tok, {"messages": [{"role": "user", "content": "hi"}]})


def test_an_imported_templated_prompt_is_not_templated_again():
    task = get_task("import")
    templated = task.parse_prompt("<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n")
    assert task.policy_input(templated) == templated.text
    plain = task.parse_prompt("2+2?")
    assert task.policy_input(plain) == {"messages": [{"role": "user", "content": "2+2?"}], "thinking": None}


def test_generate_stores_the_messages_and_the_rendered_text_the_policy_saw(chat_policy, empty_store):
    # the sample policy reads 96 characters: a short system prompt, a short completion
    p = Prompt("Q: 2+3=", {"answer": "5"}, {}, ({"role": "system", "content": "B"},
                                               {"role": "user", "content": "Q: 2+3="}))
    res = generate_sync(empty_store, chat_policy, [p], GenerateConfig(group_size=2, max_new_tokens=4, seed=0),
                        task="import")
    assert res.status == "done", res.error
    row = empty_store.df("SELECT p.text, p.messages, ro.prompt_text FROM rollouts ro JOIN prompts p USING (prompt_id)")
    assert set(row["text"]) == {"Q: 2+3="}
    assert json.loads(row["messages"][0])[0] == {"role": "system", "content": "B"}
    assert set(row["prompt_text"]) == {"<|im_start|>system\nB<|im_end|>\n<|im_start|>user\nQ: 2+3=<|im_end|>\n"
                                       "<|im_start|>assistant\n"}


def test_a_prompt_past_the_policy_s_context_fails_with_the_numbers(chat_policy, empty_store):
    p = Prompt("Q: 2+3=", {"answer": "5"}, {}, ({"role": "system", "content": "Be brief and exact."},
                                               {"role": "user", "content": "Q: 2+3="}))
    res = generate_sync(empty_store, chat_policy, [p], GenerateConfig(group_size=1, max_new_tokens=40, seed=0),
                        task="import")
    assert res.status == "failed"
    assert "tokens plus up to 40 new tokens runs past the policy's context of 96 positions" in res.error
    assert empty_store.scalar("SELECT count(*) FROM rollouts") == 0
