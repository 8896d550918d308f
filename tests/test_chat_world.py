"""The second sample world: GSM8K-shaped word problems and the tiny chat policy trained on them."""
import json
import random
import re

import pandas as pd
import pytest

from sample_data.build_chat_policy import CHAT_POLICY_DIR, boxed_answer, prompt_text
from sample_data.wordproblems import OUT_DIR, apply, make_problem, make_split, make_splits


def _read_gsm8k(split: str) -> pd.DataFrame:
    with open(OUT_DIR / "gsm8k" / f"{split}.jsonl") as f:
        return pd.DataFrame([json.loads(line) for line in f])


def test_generator_is_deterministic_and_its_arithmetic_is_right():
    a, b = make_split(200, seed=7), make_split(200, seed=7)
    assert a == b and a != make_split(200, seed=8)
    for p in a:
        assert 2 <= len(p["steps"]) <= 4 and p["level"] == f"Level {len(p['steps']) - 1}"
        for x, op, y, r in p["steps"]:
            assert apply(x, op, y) == r and 0 <= r <= 200
            if op == "/":
                assert x == r * y  # exact division
        assert p["steps"][-1][3] == p["final"]
        lines = [f"{x} {op} {y} = {r}" for x, op, y, r in p["steps"]]
        assert p["completion"] == "<think>\n" + "\n".join(lines) + "\n</think>\n\\boxed{" + str(p["final"]) + "}"
        assert p["answer"].endswith(f"\n#### {p['final']}") and p["solution"].endswith(f"\\boxed{{{p['final']}}}$.")


def test_generator_varies_its_scenarios_and_sizes():
    ps = [make_problem(random.Random(s)) for s in range(300)]
    assert len({p["question"].split()[0] for p in ps}) > 15  # names and openings vary
    assert {p["level"] for p in ps} == {"Level 1", "Level 2", "Level 3"}
    assert {s[1] for p in ps for s in p["steps"]} == {"+", "-", "*", "/"}


def test_shipped_files_have_the_dataset_columns_and_agree():
    train, test = make_splits()
    for split, rows in (("train", train), ("test", test)):
        gsm, math = _read_gsm8k(split), pd.read_parquet(OUT_DIR / "math" / f"{split}.parquet")
        assert list(gsm.columns) == ["question", "answer"] and list(math.columns) == ["problem", "solution", "level", "type"]
        assert gsm["question"].tolist() == [r["question"] for r in rows]  # the files are the generator's output
        hashes = gsm["answer"].str.extract(r"#### (\d+)$")[0]
        boxed = math["solution"].str.extract(r"\\boxed\{(\d+)\}")[0]
        assert hashes.notna().all() and (hashes == boxed).all()
        assert (gsm["question"] == math["problem"]).all()
    assert not set(_read_gsm8k("train")["question"]) & set(_read_gsm8k("test")["question"])


@pytest.fixture(scope="module")
def chat_policy():
    from backends.policy import load_policy

    if not (CHAT_POLICY_DIR / "config.json").exists():
        pytest.fail(f"chat policy missing at {CHAT_POLICY_DIR}: run `python -m sample_data.build_chat_policy`")
    return load_policy(CHAT_POLICY_DIR, device="cpu")


def test_chat_template_renders_system_user_and_thinking_switch(chat_policy):
    tok = chat_policy.tokenizer
    user = [{"role": "user", "content": "How many?"}]
    assert tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>user\nHow many?<|im_end|>\n<|im_start|>assistant\n")
    system = [{"role": "system", "content": "Think step by step."}] + user
    assert tok.apply_chat_template(system, tokenize=False, add_generation_prompt=False) == (
        "<|im_start|>system\nThink step by step.<|im_end|>\n<|im_start|>user\nHow many?<|im_end|>\n")
    no_think = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>" and tok.padding_side == "left"
    assert [len(tok(t, add_special_tokens=False)["input_ids"]) for t in ("<think>", "</think>", "<|im_start|>")] == [1, 1, 1]
    assert tok.tokenize("2024") == ["2", "0", "2", "4"]  # every digit its own token


def test_chat_policy_is_small_and_samples_well_formed_completions(chat_policy):
    assert sum(p.stat().st_size for p in CHAT_POLICY_DIR.iterdir()) < 10 * 2**20
    test = make_split(16, seed=2)
    prompts = [prompt_text(chat_policy.tokenizer, p["question"]) for p in test]
    gens = chat_policy.sample(prompts, n=1, temperature=1.0, max_new_tokens=96, seed=0)
    shape = re.compile(r"<think>\n(.+\n)+</think>\n\\boxed\{\d+\}")
    assert sum(g.finish_reason == "stop" and bool(shape.fullmatch(g.text)) for g in gens) >= 14
    g = gens[0]
    assert g.token_texts[-1] == "<|im_end|>" and len(g.logprobs) == len(g.token_ids) == len(g.entropies)
    assert (g.logprobs <= 0).all()
    assert any(boxed_answer(g.text) == str(p["final"]) for p, g in zip(test, gens))
