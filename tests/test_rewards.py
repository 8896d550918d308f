"""Built-in reward rules on literal completions (values worked out by hand)."""
from __future__ import annotations

import json

import pandas as pd

from studio.rewards import ARITHMETIC_V1, Rule, format_ok, score_frame
from studio.tasks import ParsedCompletion, Prompt, Step, Task, get_task

task = get_task("arithmetic")
p = task.parse_prompt("Q: 23+48-7=")


def test_perfect_completion_earns_every_component():
    # accuracy 1, format 1, both steps right: total = 1.0*1 + 0.1*1 + 0.25*1 = 1.35
    assert ARITHMETIC_V1.score(task, p, "23+48=71;71-7=64;A:64") == {
        "accuracy": 1.0, "format": 1.0, "steps": 1.0, "total": 1.35}


def test_wrong_step_and_answer():
    # second step wrong (71-7=65): accuracy 0, format 1, steps 1/2 -> total 0.1 + 0.125
    s = ARITHMETIC_V1.score(task, p, "23+48=71;71-7=65;A:65")
    assert s["accuracy"] == 0.0 and s["format"] == 1.0 and s["steps"] == 0.5
    assert abs(s["total"] - 0.225) < 1e-12


def test_right_answer_after_a_wrong_step_still_counts_as_correct():
    # 23+48=70 is wrong, 70-7=64 is wrong arithmetic too, answer 64 matches gold
    s = ARITHMETIC_V1.score(task, p, "23+48=70;70-7=64;A:64")
    assert s["accuracy"] == 1.0 and s["steps"] == 0.0


def test_unreadable_completion_scores_zero():
    assert ARITHMETIC_V1.score(task, p, "blah") == {"accuracy": 0.0, "format": 0.0, "steps": 0.0, "total": 0.0}


def test_rule_version_follows_code_and_weights_not_docs():
    def acc_a(prompt, completion, gold, steps, *, parsed, **ctx):
        """Version one of the docs."""
        return 1.0 if parsed.answer == gold["answer"] else 0.0

    def acc_b(prompt, completion, gold, steps, *, parsed, **ctx):
        """Entirely rewritten docs, same code."""
        # and a comment
        return 1.0 if parsed.answer == gold["answer"] else 0.0

    def acc_c(prompt, completion, gold, steps, *, parsed, **ctx):
        """Version one of the docs."""
        return 1.0 if parsed.answer == gold["solution"] else 0.0

    def vid(fn):
        return Rule("r", {"accuracy": fn}).version_id

    assert vid(acc_a).startswith("r@") and vid(acc_a) == vid(acc_b) != vid(acc_c)
    heavier = Rule("arithmetic", ARITHMETIC_V1.components, {**ARITHMETIC_V1.weights, "format": 0.5})
    assert heavier.version_id != ARITHMETIC_V1.version_id
    assert "def format_ok" in ARITHMETIC_V1.source()


def test_a_raising_component_is_recorded_not_fatal():
    def broken(prompt, completion, gold, steps, **ctx):
        raise RuntimeError("boom")

    rule = Rule("broken", {"format": format_ok, "bad": broken})
    df = score_frame(rule, task, [("r1", p, "23+48=71;71-7=64;A:64"), ("r2", p, "23+48=71;A:71")])
    assert isinstance(df, pd.DataFrame) and len(df) == 6  # 2 rollouts x (format, bad, total)
    r1 = df[df.rollout_id == "r1"].set_index("component")
    assert r1.loc["format", "value"] == 1.0 and pd.isna(r1.loc["format", "error"])  # kept
    assert pd.isna(r1.loc["bad", "value"]) and r1.loc["bad", "error"] == "RuntimeError: boom"
    assert pd.isna(r1.loc["total", "value"]) and "bad failed" in r1.loc["total", "error"]


# -- the built-in rule before it was rebuilt on rewardlib: the reference it must equal ------------
# Verbatim (annotations too: the version id hashes the code), so their hash is the version id
# every store holds its rewards under.

def accuracy_v1(prompt: str, completion: str, gold: dict, steps: list[Step], *, parsed: ParsedCompletion,
                task: Task, **ctx) -> float:
    return 1.0 if task.is_correct(Prompt(prompt, gold), parsed.answer) else 0.0


def format_v1(prompt: str, completion: str, gold: dict, steps: list[Step], *, parsed: ParsedCompletion, **ctx) -> float:
    return 1.0 if parsed.well_formed else 0.0


def steps_v1(prompt: str, completion: str, gold: dict, steps: list[Step], **ctx) -> float:
    if not steps:
        return 0.0
    return sum(1 for s in steps if s.correct) / len(steps)


LEGACY = Rule("arithmetic", {"accuracy": accuracy_v1, "format": format_v1, "steps": steps_v1}, ARITHMETIC_V1.weights)


def test_built_in_rule_keeps_the_version_id_of_the_code_it_replaced():
    assert LEGACY.version_id == ARITHMETIC_V1.version_id == "arithmetic@52029205d6"
    assert LEGACY.sha256 == ARITHMETIC_V1.sha256 != ARITHMETIC_V1.code_sha256
    # an edit of the rebuilt rule is a new version: the pin holds for its code as it is only
    edited = Rule("arithmetic", {**ARITHMETIC_V1.components, "steps": steps_v1}, ARITHMETIC_V1.weights,
                  ARITHMETIC_V1.replaces)
    assert edited.version_id not in (ARITHMETIC_V1.version_id, LEGACY.version_id)


def test_built_in_rule_scores_every_sample_rollout_bit_for_bit_like_the_code_it_replaced(seeded_store):
    rows = seeded_store.df("""SELECT ro.rollout_id, p.text AS prompt, p.gold, ro.text AS completion
                              FROM rollouts ro JOIN prompts p USING (prompt_id) ORDER BY ro.rollout_id""")
    items = [(r.rollout_id, Prompt(r.prompt, json.loads(r.gold) if isinstance(r.gold, str) else r.gold), r.completion)
             for r in rows.itertuples()]
    extra = [(f"x{i}", p, c) for i, c in enumerate(["", "blah", "A:", "A:64", "23+48=71;A:064", "23+48=71;;A:-0",
                                                    "23+48=71;71-7=64;A:64;A:64", "٣+٤=٧;A:٦٤", "x" * 500])]
    new, old = score_frame(ARITHMETIC_V1, task, items + extra), score_frame(LEGACY, task, items + extra)
    assert len(rows) == 512 and len(new) == 4 * (512 + len(extra))
    assert [float(v).hex() for v in new["value"]] == [float(v).hex() for v in old["value"]]
    assert new.drop(columns="value").equals(old.drop(columns="value"))
    # and like the rewards the sample store holds under that version
    stored = seeded_store.df("SELECT rollout_id, component, value FROM rewards WHERE rule_version_id = ?",
                             [ARITHMETIC_V1.version_id])
    mine = new[new["rollout_id"].isin(rows["rollout_id"])]
    def keyed(df):
        return {(r.rollout_id, r.component): float(r.value).hex() for r in df.itertuples()}

    assert keyed(stored) == keyed(mine)
