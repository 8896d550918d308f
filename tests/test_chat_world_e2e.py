"""The realistic sample world end to end, as a researcher walks it: a chat policy on word problems.

Generate (drawn from the prompt set's test split, through the chat template) → the token strip
(the conversation, the reasoning band) → a fork → a branch → a rule using ``math_match``
applied and diffed → a 20-step mini-run that raises accuracy on its pool → pairs →
conversational and standard exports → one TRL DPO step and one KTO step on what ``datasets`` loads.
"""
from __future__ import annotations

import json
from html import escape

import numpy as np
import pytest

from sample_data import CHAT_POLICY_DIR, CHAT_ROLLOUTS_DIR, WORDPROBLEMS_TASK
from studio.face.api import Studio
from studio.rewards import MATH_V1
from studio.rewards.rules import apply_rule_sync, diff
from studio.store import Store

pytestmark = pytest.mark.slow

LENGTH_RULE = '''"""math-verify on the boxed answer, minus a length penalty: short right answers win."""
from studio.rewardlib import format_ok, length_penalty, math_match, weighted


def reward(prompt, completion, gold, steps, **ctx):
    parts = {"accuracy": math_match(ctx["parsed"].answer, gold.get("answer")), "format": format_ok(ctx["parsed"]),
             "length": -length_penalty(ctx["n_chars"], 40, per_unit=0.005)}
    parts["total"] = weighted(parts, {"accuracy": 1.0, "format": 0.1, "length": 1.0})
    return parts
'''


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    path = tmp_path_factory.mktemp("chat") / "s.duckdb"
    s = Studio(Store.open(path, seed_dir=CHAT_ROLLOUTS_DIR), CHAT_POLICY_DIR)
    yield s
    s.close()


@pytest.fixture(scope="module")
def generated(world):
    res = world.generate(task=WORDPROBLEMS_TASK, draw=6, split="test", group_size=6, max_new_tokens=128, seed=7)
    assert res.status == "done", res.error
    return res


def test_the_seeded_world_has_its_prompt_set_and_rollouts(world):
    tasks = world.tasks().set_index("name")
    assert tasks.loc[WORDPROBLEMS_TASK, "n_prompts"] >= 2000
    assert set(tasks.loc[WORDPROBLEMS_TASK, "splits"]) == {"train", "test"}
    acc = world.store.scalar("SELECT avg(correct::INT) FROM rollouts ro JOIN runs r USING (run_id) WHERE r.kind = 'sample'")
    assert 0.2 < acc < 0.9  # competent, with real slips


def test_generate_templates_the_chat_and_verifies_the_answers(world, generated):
    rows = world.store.df("""SELECT ro.text, ro.prompt_text, ro.answer, ro.correct, p.text AS prompt, p.gold
                             FROM rollouts ro JOIN prompts p USING (prompt_id) WHERE ro.run_id = ?""",
                          [generated.run_id])
    assert len(rows) == 36
    assert rows["prompt_text"].str.startswith("<|im_start|>").all()  # rendered by the policy's template, once
    assert all(t.count("<|im_start|>assistant") == 1 for t in rows["prompt_text"])
    assert not rows["prompt"].str.contains("<|im_start|>").any()  # the plain question is the prompt
    assert rows["text"].str.contains("<think>").mean() > 0.8 and rows["text"].str.contains(r"\\boxed\{").mean() > 0.8
    checked = rows[rows["correct"].notna()]
    assert len(checked) >= 30
    golds = [json.loads(g)["answer"] for g in checked["gold"]]
    assert [a == g for a, g in zip(checked["answer"], golds, strict=True)] == checked["correct"].tolist()


def test_the_token_strip_shows_the_conversation_and_the_reasoning_band(world, generated):
    from widgets.base.state import StudioState
    from widgets.token_strip import TokenStrip

    rid = world.store.scalar("SELECT rollout_id FROM rollouts WHERE run_id = ? AND text LIKE '%</think>%' "
                             "ORDER BY rollout_id LIMIT 1", [generated.run_id])
    prompt = world.store.scalar("SELECT p.text FROM rollouts ro JOIN prompts p USING (prompt_id) WHERE rollout_id = ?",
                                [rid])
    state = StudioState(store=world.store)
    strip = TokenStrip(state=state)
    state.open_rollout(rid)
    html = " ".join(p.object for p in vars(strip).values() if isinstance(getattr(p, "object", None), str))
    assert 'class="convo"' in html and escape(prompt[:40]) in html  # the user's turn, as text
    assert "think-block" in html and "reasoning" in html
    assert "&lt;|im_start|&gt;" not in html and "<|im_start|>" not in html  # never the template's markers
    assert "gold" in html and "None" not in html


def test_a_fork_is_branched_and_its_continuations_verified(world, generated):
    tokens = world.store.df("""SELECT t.rollout_id, t.pos, t.entropy FROM tokens t JOIN rollouts ro USING (rollout_id)
                               WHERE ro.run_id = ? ORDER BY t.entropy DESC LIMIT 1""", [generated.run_id])
    rid, pos = tokens["rollout_id"][0], int(tokens["pos"][0])
    res = world.branch(rid, pos, [None], n=4, seed=3)
    assert res.status == "done", res.error
    kids = world.store.df("SELECT text, correct, fork_pos FROM rollouts WHERE run_id = ?", [res.run_id])
    parent = world.store.df(f"SELECT token_text FROM {world.store.tokens_between(rid, rid)} WHERE rollout_id = ? "
                            "ORDER BY pos", [rid])["token_text"]
    prefix = "".join(parent[:pos])
    assert len(kids) == 4 and (kids["fork_pos"] == pos).all()
    assert all(t.startswith(prefix) for t in kids["text"])
    assert kids["correct"].notna().all()


def test_information_gain_teacher_forces_the_boxed_gold_answer_after_each_step(world, generated):
    from studio.queries.credit import steps_of
    from studio.runs.credit_models import answer_text, information_gain
    from studio.workers.sync import run_sync

    rid = world.store.scalar("SELECT rollout_id FROM rollouts WHERE run_id = ? AND correct ORDER BY rollout_id LIMIT 1",
                             [generated.run_id])
    steps = steps_of(world.store, rid)
    assert len(steps) >= 2 and not steps["text"].str.endswith("\n").any()
    assert answer_text(WORDPROBLEMS_TASK, {"answer": "72"}, "<think>\n48 / 2 = 24\n") == "</think>\n\\boxed{72}"
    source = run_sync(information_gain, world.store, CHAT_POLICY_DIR, [rid])
    ig = world.store.df("SELECT step_idx, value FROM step_rewards WHERE rollout_id = ? AND source = ? ORDER BY 1",
                        [rid, source])
    assert len(ig) == len(steps) and np.isfinite(ig["value"]).all()
    assert ig["value"].sum() > 0  # a right answer: the reasoning raises P(gold) overall


def test_a_rule_using_math_match_is_applied_and_diffed(world, generated):
    res = apply_rule_sync(world.store, LENGTH_RULE, name="math-short")
    assert res.status == "done" and res.failed == 0, res.message
    d = diff(world.store, MATH_V1.version_id, res.rule_version_id)
    assert len(d.rows) > 0 and len(d.changed) > 0  # the penalty moves rewards; right answers stay right
    acc = world.store.df("""SELECT ro.correct, rw.value FROM rewards rw JOIN rollouts ro USING (rollout_id)
                            WHERE rw.rule_version_id = ? AND rw.component = 'accuracy' AND ro.correct IS NOT NULL""",
                         [res.rule_version_id])
    assert (acc["value"] == acc["correct"].astype(float)).all()


def test_a_short_mini_run_raises_accuracy_on_its_pool(world):
    from studio.queries.prompts import draw_prompts
    from studio.runs import minirun
    from studio.runs.training import MiniRunConfig, evaluate_job
    from studio.tasks import get_task

    cfg = MiniRunConfig(policy=str(CHAT_POLICY_DIR), prompt_set="train", n_prompts=8, steps=20, prompts_per_step=8,
                        group_size=8, learning_rate=2e-4, max_new_tokens=96, checkpoint_every=20, seed=0, overlap=False)
    pool = draw_prompts(world.store, WORDPROBLEMS_TASK, 8, seed=0, split="train")
    spec = get_task(WORDPROBLEMS_TASK).spec
    before = evaluate_job(str(CHAT_POLICY_DIR), [p.to_json() for p in pool], spec, k=16, max_new_tokens=96, seed=1)
    run_id = minirun.start(world.store, cfg, task=WORDPROBLEMS_TASK)
    st = minirun.wait(run_id, 900)
    assert st.status == "done", st.error
    step, ckpt = minirun.last_checkpoint(world.store, run_id)
    after = evaluate_job(ckpt, [p.to_json() for p in pool], spec, k=16, max_new_tokens=96, seed=1)
    assert step == 20 and after["accuracy"] > before["accuracy"]
    stored = world.store.scalar("SELECT count(*) FROM rollouts WHERE run_id = ? AND correct IS NOT NULL", [run_id])
    assert stored == 20 * 8 * 8


@pytest.fixture(scope="module")
def accepted(world, generated):
    """The generated run's correct × incorrect pairs, built and accepted."""
    built = world.build_pairs(run=generated.run_id, name="correct_vs_incorrect")
    assert built.added > 0
    world.accept(build=built.build_id)
    return built


def test_pairs_exported_both_ways_train_one_dpo_step(world, accepted, tmp_path):
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer
    conv = world.export(tmp_path / "conv.jsonl", style="conversational")
    std = world.export(tmp_path / "std.jsonl")
    rows = [json.loads(x) for x in conv.path.read_text().splitlines()]
    assert all(r["prompt"][-1]["role"] == "user" and r["chosen"][0]["role"] == "assistant" for r in rows)
    assert not any("<|im_start|>" in json.dumps(r) for r in rows)
    plain = [json.loads(x) for x in std.path.read_text().splitlines()]
    assert all(isinstance(r["prompt"], str) and "<|im_start|>" not in r["prompt"] for r in plain)

    ds = load_dataset("json", data_files=str(conv.path), split="train", cache_dir=str(tmp_path / "cache"))
    tok = AutoTokenizer.from_pretrained(CHAT_POLICY_DIR)
    model = AutoModelForCausalLM.from_pretrained(CHAT_POLICY_DIR)
    before = [p.detach().clone() for p in model.parameters()]
    args = DPOConfig(output_dir=str(tmp_path / "dpo"), per_device_train_batch_size=4, max_steps=1, learning_rate=1e-3,
                     beta=0.1, max_length=384, logging_steps=1, report_to="none", use_cpu=True, bf16=False,
                     save_strategy="no", disable_tqdm=True, seed=0)
    trainer = DPOTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
    out = trainer.train()
    assert np.isfinite(out.training_loss)
    assert any(not np.allclose(a.numpy(), b.detach().numpy()) for a, b in zip(before, model.parameters(),
                                                                              strict=True))


def test_an_unpaired_export_trains_one_kto_step(world, accepted, tmp_path):
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import KTOConfig, KTOTrainer
    out = world.export(tmp_path / "kto.jsonl", "unpaired", "conversational")
    ds = load_dataset("json", data_files=str(out.path), split="train", cache_dir=str(tmp_path / "cache"))
    assert set(ds.column_names) == {"prompt", "completion", "label"} and len(set(ds["label"])) == 2
    tok = AutoTokenizer.from_pretrained(CHAT_POLICY_DIR)
    model = AutoModelForCausalLM.from_pretrained(CHAT_POLICY_DIR)
    args = KTOConfig(output_dir=str(tmp_path / "kto"), per_device_train_batch_size=4, max_steps=1, learning_rate=1e-3,
                     max_length=384, logging_steps=1, report_to="none", use_cpu=True, bf16=False,
                     save_strategy="no", disable_tqdm=True, seed=0)
    res = KTOTrainer(model=model, args=args, train_dataset=ds, processing_class=tok).train()
    assert np.isfinite(res.training_loss)
