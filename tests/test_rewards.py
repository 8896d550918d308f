"""Built-in reward rules on literal completions (values worked out by hand)."""
import pandas as pd

from studio.rewards import ARITHMETIC_V1, Rule, format_ok, score_frame
from studio.tasks import get_task

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
