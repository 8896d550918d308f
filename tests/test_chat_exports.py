"""Chat prompts from store to trainer: imports keep the messages and the templated string apart,
exports give TRL the messages (conversational) or the plain prompt (standard), never a templated
string, and a real ``DPOTrainer`` / ``KTOTrainer`` step runs on what ``datasets`` loads."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from sample_data import CHAT_POLICY_DIR, POLICY_DIR
from studio import curation
from studio.curation import PairRule, build_pairs
from studio.ingest.formats import ColumnMapping
from studio.ingest.importers import import_run
from studio.store import Store
from studio.store.records import now
from studio.tasks.chat import END_OF_TURN, MARKERS
from tests.fixtures import trl_log, verl_dump, write_jsonl

V = "chat@1"
SYSTEM = "Be brief."
CHAT = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "2+2?"}]


def chatml(messages: list[dict], generation: bool = True) -> str:
    """What a ChatML template (Qwen's) renders."""
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if generation else "")


# (prompt id, text, stored messages, the text each rollout continued, [(completion, correct), ...])
PROMPTS = [
    # a chat prompt: messages with a system prompt, the policy saw them through ChatML
    ("p-chat", "2+2?", CHAT, chatml(CHAT), [("4", 1.0), ("5<|im_end|>", 0.0), ("3", 0.0)]),
    # an older store's import: the templated string as the prompt's text, no messages
    ("p-old", chatml([{"role": "system", "content": "Add."}, {"role": "user", "content": "1+2?"}]), None, None,
     [("3", 1.0), ("4", 0.0)]),
    # a plain prompt of a policy without a chat template
    ("p-plain", "3+3?", None, None, [("6", 1.0), ("7", 0.0)]),
]
PLAIN = {"p-chat": "2+2?", "p-old": "1+2?", "p-plain": "3+3?"}


def chat_store(path: Path) -> Store:
    """Hand-made rollouts of :data:`PROMPTS`, every one scored by ``V`` (total = accuracy), correct where it is 1."""
    store = Store.open(path)
    t = now()
    rollouts = [(f"r-{pid}-{i}", pid, f"g-{pid}", seen, text, acc)
                for pid, _, _, seen, sides in PROMPTS for i, (text, acc) in enumerate(sides)]
    store.write({
        "runs": pd.DataFrame([{"run_id": "run1", "kind": "import", "name": "chat", "policy": "lit", "task": "import",
                               "created_at": t, "status": "done"}]),
        "prompts": pd.DataFrame([{"prompt_id": pid, "task": "import", "text": text, "gold": "{}",
                                  "messages": json.dumps(msgs) if msgs else None}
                                 for pid, text, msgs, _, _ in PROMPTS]),
        "rule_versions": pd.DataFrame([{"rule_version_id": V, "name": "chat", "source": "# literal", "sha256": "0",
                                        "created_at": t, "note": ""}]),
        "rollouts": pd.DataFrame([{"rollout_id": rid, "run_id": "run1", "prompt_id": pid, "group_id": gid,
                                   "sample_idx": i, "text": text, "n_tokens": len(text), "created_at": t,
                                   "prompt_text": seen, "correct": acc >= 1.0}
                                  for i, (rid, pid, gid, seen, text, acc) in enumerate(rollouts)]),
        "rewards": pd.DataFrame([(r[0], V, c, r[5]) for r in rollouts for c in ("total", "accuracy")],
                                columns=["rollout_id", "rule_version_id", "component", "value"]),
    })
    res = build_pairs(store, PairRule("correct_vs_incorrect"), rule_version_id=V)
    curation.accept(store, build_id=res.build_id)
    return store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = chat_store(tmp_path_factory.mktemp("chat") / "chat.duckdb")
    yield s
    s.close()


def load(path: Path, filetype: str, cache: Path):
    import datasets

    if filetype == "datasets":
        return datasets.load_from_disk(str(path))
    return datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(cache))


def no_markers(rows) -> bool:
    text = json.dumps(list(rows), ensure_ascii=False)
    return not any(m in text for m in MARKERS + END_OF_TURN)


# ---------------------------------------------------------------------------- exports

@pytest.mark.parametrize("filetype", ["jsonl", "datasets"])
@pytest.mark.parametrize("fmt", ["preference", "unpaired"])
def test_conversational_exports_are_the_stored_messages_never_a_templated_string(store, tmp_path, fmt, filetype):
    from trl.data_utils import is_conversational

    out = curation.export(store, tmp_path / ("out.jsonl" if filetype == "jsonl" else "out"), fmt, "conversational")
    ds = load(out.path, filetype, tmp_path / "cache")
    assert len(ds) == out.rows > 0 and all(is_conversational(r) for r in ds)
    assert no_markers(ds)  # no template marker anywhere: the trainer's template is the only one
    prompts = {r["prompt"][-1]["content"]: r["prompt"] for r in ds}
    assert prompts == {
        "2+2?": CHAT,  # the stored messages, the system prompt first
        "1+2?": [{"role": "system", "content": "Add."}, {"role": "user", "content": "1+2?"}],  # read back
        "3+3?": [{"role": "user", "content": "3+3?"}],
    }
    sides = ("chosen", "rejected") if fmt == "preference" else ("completion",)
    said = {r[k][0]["content"] for r in ds for k in sides}
    assert all(len(r[k]) == 1 and r[k][0]["role"] == "assistant" for r in ds for k in sides)
    assert said == {"4", "5", "3", "6", "7"}  # "5<|im_end|>": the template closes the turn itself
    if fmt == "preference":
        assert {(r["prompt"][-1]["content"], r["chosen"][0]["content"], r["rejected"][0]["content"]) for r in ds} \
            == {("2+2?", "4", "5"), ("2+2?", "4", "3"), ("1+2?", "3", "4"), ("3+3?", "6", "7")}
    else:
        assert sum(r["label"] for r in ds) == 3 and len(ds) == 7


@pytest.mark.parametrize("filetype", ["jsonl", "datasets"])
def test_standard_exports_use_the_plain_prompt(store, tmp_path, filetype):
    out = curation.export(store, tmp_path / ("std.jsonl" if filetype == "jsonl" else "std"), "preference")
    ds = load(out.path, filetype, tmp_path / "cache")
    assert no_markers(ds)  # prompts.text, never rollouts.prompt_text; an old store's templated text read back
    assert sorted({r["prompt"] for r in ds}) == sorted(PLAIN.values())
    assert all(isinstance(r["chosen"], str) for r in ds)


# ---------------------------------------------------------------------------- imports

def test_verl_chatml_prompts_are_stored_as_messages_and_the_exact_string(tmp_path):
    store = Store.open(tmp_path / "v.duckdb")
    system = [{"role": "system", "content": "Answer in a box."}]
    a, b = ([*system, {"role": "user", "content": q}] for q in ("2+2?", "3+3?"))
    inputs = [chatml(a)] * 2 + [chatml(b)] * 2
    verl_dump(tmp_path / "dumps", 1, inputs, ["\\boxed{4}", "\\boxed{5}", "\\boxed{6}", "\\boxed{7}"],
              ["4", "4", "6", "6"], [1.0, 0.0, 1.0, 0.0], {"acc": [1.0, 0.0, 1.0, 0.0]})
    import_run(store, tmp_path / "dumps", "verl")
    prompts = store.df("SELECT prompt_id, text, messages FROM prompts ORDER BY text")
    assert prompts["text"].tolist() == ["2+2?", "3+3?"]  # the last user message
    assert [json.loads(m) for m in prompts["messages"]] == [a, b]
    seen = store.df("SELECT p.text, ro.prompt_text FROM rollouts ro JOIN prompts p USING (prompt_id) ORDER BY 1")
    assert seen["prompt_text"].tolist() == inputs  # exactly what the policy continued
    assert store.scalar("SELECT count(DISTINCT group_id) FROM rollouts") == 2
    res = build_pairs(store, PairRule("correct_vs_incorrect"))
    curation.accept(store, build_id=res.build_id)
    rows = [json.loads(x) for x in curation.export(store, tmp_path / "c.jsonl", style="conversational")
            .path.read_text().splitlines()]
    assert no_markers(rows) and sorted(r["prompt"][-1]["content"] for r in rows) == ["2+2?", "3+3?"]
    assert all(r["prompt"][0] == system[0] for r in rows)
    store.close()


@pytest.mark.parametrize("path", ["parquet", "jsonl"])  # Arrow's vectorised pass, and the record-by-record one
def test_trl_message_prompts_are_stored_as_messages(tmp_path, path):
    store = Store.open(tmp_path / "t.duckdb")
    other = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"}]
    prompts = [CHAT] * 2 + [other] * 2  # one user message, two system prompts: two prompts
    completions = [[{"role": "assistant", "content": c}] for c in ("4", "5", "4", "22")]
    if path == "parquet":
        trl_log(tmp_path / "run", 1, prompts, completions, {"accuracy_reward": [1.0, 0.0, 1.0, 0.0]})
        import_run(store, tmp_path / "run", "trl")
    else:  # a completion of several messages: its assistant's content (read line by line)
        completions[3] = [{"role": "assistant", "content": "2"}, {"role": "tool", "content": "ok"},
                          {"role": "assistant", "content": "2"}]
        rows = [{"prompt": p, "completion": c, "accuracy_reward": r}
                for p, c, r in zip(prompts, completions, [1.0, 0.0, 1.0, 0.0], strict=True)]
        import_run(store, write_jsonl(tmp_path / "run.jsonl", rows), "generic",
                   mapping=ColumnMapping(prompt="prompt", completion="completion", rewards=("accuracy_reward",)))
    got = store.df("SELECT text, messages FROM prompts")
    assert got["text"].tolist() == ["2+2?", "2+2?"]
    assert sorted(map(json.loads, got["messages"]), key=str) == sorted([CHAT, other], key=str)
    assert store.scalar("SELECT count(DISTINCT group_id) FROM rollouts") == 2
    assert store.scalar("SELECT count(*) FROM rollouts WHERE prompt_text IS NOT NULL") == 0
    assert sorted(store.df("SELECT text FROM rollouts")["text"]) == sorted(["4", "5", "4",
                                                                           "22" if path == "parquet" else "2\n2"])
    store.close()


# ---------------------------------------------------------------------------- TRL steps on the exports

# a short template (the sample policy reads 96 characters): role initial, colon, content
TEMPLATE = ("{% for m in messages %}{{ m['role'][0] + ':' + m['content'] + ';' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ 'a:' }}{% endif %}")


def model_and_tokenizer():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = CHAT_POLICY_DIR if (CHAT_POLICY_DIR / "config.json").exists() else POLICY_DIR
    tok = AutoTokenizer.from_pretrained(folder)
    if not tok.chat_template:
        tok.chat_template = TEMPLATE
    return AutoModelForCausalLM.from_pretrained(folder), tok


def moved(model, before) -> bool:
    import torch

    return any(not torch.equal(p.detach(), before[n]) for n, p in model.named_parameters())


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
def test_a_conversational_preference_export_trains_one_dpo_step(store, tmp_path):
    from trl import DPOConfig, DPOTrainer

    out = curation.export(store, tmp_path / "prefs.jsonl", style="conversational")
    ds = load(out.path, "jsonl", tmp_path / "cache")
    model, tok = model_and_tokenizer()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = DPOConfig(output_dir=str(tmp_path / "dpo"), per_device_train_batch_size=4, max_steps=1, learning_rate=1e-3,
                     beta=0.1, max_length=96, logging_steps=1, report_to="none", use_cpu=True, bf16=False,
                     save_strategy="no", disable_tqdm=True, seed=0)
    trainer = DPOTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
    # the trainer templated each prompt's messages, once: its prompts are the template's rendering of them
    tokenized = trainer.train_dataset
    ids = tokenized["prompt_ids" if "prompt_ids" in tokenized.column_names else "prompt_input_ids"]
    rendered = [tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in ds]
    assert sorted(tok.decode(x) for x in ids) == sorted(rendered)
    assert sum(r.count(SYSTEM) for r in rendered) == 2  # the chat prompt's two pairs, its system prompt once each
    result = trainer.train()
    assert trainer.state.global_step == 1 and math.isfinite(result.training_loss)
    assert moved(model, before)


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
def test_a_conversational_unpaired_export_trains_one_kto_step(store, tmp_path):
    from trl import KTOConfig, KTOTrainer

    out = curation.export(store, tmp_path / "kto", "unpaired", "conversational")
    ds = load(out.path, "datasets", tmp_path / "cache")
    model, tok = model_and_tokenizer()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = KTOConfig(output_dir=str(tmp_path / "kto-out"), per_device_train_batch_size=4, max_steps=1,
                     learning_rate=1e-3, beta=0.1, max_length=96, logging_steps=1, report_to="none", use_cpu=True,
                     bf16=False, save_strategy="no", disable_tqdm=True, seed=0)
    trainer = KTOTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
    result = trainer.train()
    assert trainer.state.global_step == 1 and math.isfinite(result.training_loss)
    assert moved(model, before)
