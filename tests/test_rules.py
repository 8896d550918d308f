"""Editable reward rules: the library on literal cases, the sandbox's limits, versions and diffs."""
import pytest

from studio import queries
from studio.rewards import ARITHMETIC_V1, diagnostics, diff_views, reward_models, rewardlib, rules
from studio.rewards.sandbox import Limits, RuleSourceError, check_source, source_sha
from studio.tasks import Step, get_task

TASK = get_task("arithmetic")


# -- the library ------------------------------------------------------------------------------

def test_library_on_literal_cases():
    p = TASK.parse_prompt("Q: 23+48-7=")
    good = TASK.parse_completion(p, "23+48=71;71-7=64;A:64")
    wrong = TASK.parse_completion(p, "23+48=71;71-7=54;A:54")
    assert rewardlib.answer_correct(good, p.gold, TASK) == 1.0 and rewardlib.answer_correct(wrong, p.gold, TASK) == 0.0
    assert rewardlib.answer_correct(good, p.gold) == 1.0  # numeric match without the task
    assert rewardlib.format_ok(good) == 1.0 and rewardlib.format_ok(TASK.parse_completion(p, "64")) == 0.0
    assert rewardlib.steps_correct(list(wrong.steps)) == 0.5
    assert rewardlib.numeric_match("1/2", "0.5") == 1.0 and rewardlib.numeric_match("0.5", "0.51") == 0.0
    assert rewardlib.length_penalty(120, 100, 0.005) == pytest.approx(-0.1)
    assert rewardlib.length_penalty(1000, 100, 0.01, cap=0.5) == -0.5
    assert rewardlib.repetition_penalty("aaaa", n=2) == pytest.approx(-2 / 3)


def test_composition_and_gating_on_literal_cases():
    assert rewardlib.weighted({"a": 1.0, "f": 1.0, "s": 0.5}, {"f": 0.1, "s": 0.25}) == pytest.approx(1.225)
    assert rewardlib.gated(1.0, [0.2, 0.3], tau=1.0) == pytest.approx(0.5)
    assert rewardlib.gated(0.99, [0.2, 0.3], tau=1.0) == 0.0  # the outcome misses tau: steps do not count
    assert rewardlib.clip(1.7, -1, 1) == 1 and rewardlib.bounded(100.0, 2.0) == pytest.approx(2.0)
    assert rewardlib.sigmoid(0.0) == 0.5 and rewardlib.centered(0.8, 1.0) == pytest.approx(-0.2)


def test_default_source_scores_exactly_like_the_built_in_rule(seeded_store):
    res = rules.apply_rule_sync(seeded_store, rules.DEFAULT_SOURCE, "arithmetic-src")
    assert res.status == "done" and res.scored == 512 and res.failed == 0
    built_in = ARITHMETIC_V1.version_id
    d = rules.diff(seeded_store, built_in, res.rule_version_id)
    assert len(d.rows) == 512 and d.changed.empty and d.sign_flips.empty
    comps = queries.components(seeded_store, [d.rows.iloc[0]["rollout_id"]], res.rule_version_id)
    assert set(next(iter(comps.values()))) == {"accuracy", "format", "steps", "total"}


# -- source checks (parsing only) -------------------------------------------------------------

def test_source_problems_point_at_their_line():
    problems = check_source("def reward(prompt, completion, gold, steps, **ctx):\n    x = (1 +\n")
    assert problems and problems[0].line >= 2 and "never closed" in problems[0].message
    assert "a rule defines `def reward" in str(check_source("def score(x): return 1")[0])
    assert str(check_source("def reward(prompt):\n    return 1")[0]) == "line 1: reward takes (prompt, completion, gold, steps, **ctx)"
    with pytest.raises(RuleSourceError, match="line 1"):
        rules.apply_rule_sync(None, "def reward(:", "bad")  # refused before the store is touched


def test_version_ids_ignore_comments_and_docstrings():
    a = 'def reward(prompt, completion, gold, steps, **ctx):\n    return 1.0\n'
    b = '"""doc"""\n# a comment\ndef reward(prompt, completion, gold, steps, **ctx):\n    """why"""\n    return 1.0  # one\n'
    c = a.replace("1.0", "2.0")
    assert source_sha(a) == source_sha(b) != source_sha(c)
    assert rules.version_id("r", a) == rules.version_id("r", b)


# -- the sandbox --------------------------------------------------------------------------------

HOSTILE = '''
def reward(prompt, completion, gold, steps, **ctx):
    kind = sum(map(ord, completion)) % 5
    if kind == 0:
        while True:
            pass
    if kind == 1:
        block = bytearray(10 * 1024 ** 3)  # 10 GB
    if kind == 2:
        return float("nan")
    if kind == 3:
        return {"ok": "yes"}
    return 1 / 0
'''


def test_sandbox_contains_loops_memory_nan_wrong_types_and_exceptions(seeded_store):
    flt = queries.RolloutFilter(prompt_contains="Q: 2")  # 24 rollouts keep the loops short, all five kinds occur
    rows = queries.rollout_table(seeded_store, flt)
    kinds = {r.rollout_id: sum(map(ord, r.completion)) % 5 for r in rows.itertuples()}
    res = rules.apply_rule_sync(seeded_store, HOSTILE, "hostile", scope=flt, limits=Limits(call_s=0.3, memory_mb=1024))
    assert res.status == "done" and res.scored == len(rows) and res.failed == len(rows)
    err = dict(seeded_store.df("SELECT rollout_id, error FROM rewards WHERE rule_version_id = ? AND component = 'total'",
                               [res.rule_version_id]).itertuples(index=False))
    expected = {0: "timed out: scoring one rollout took over 0.3 s", 1: "MemoryError", 2: "non-finite value",
                3: "component 'ok' is str", 4: "ZeroDivisionError: division by zero"}
    seen = set()
    for rid, kind in kinds.items():
        assert expected[kind] in err[rid], (kind, err[rid])
        seen.add(kind)
    assert seen == set(expected)  # every kind of failure occurred
    assert "line 13, in reward" in err[next(r for r, k in kinds.items() if k == 4)]  # the rule's own frame


def test_a_spent_budget_or_cancel_stores_nothing(seeded_store):
    import threading

    before = seeded_store.counts()
    n_versions = len(rules.versions(seeded_store))
    slow = 'import time\ndef reward(prompt, completion, gold, steps, **ctx):\n    time.sleep(0.05)\n    return 1.0\n'
    res = rules.apply_rule_sync(seeded_store, slow, "slow", limits=Limits(budget_s=1.0))
    assert res.status == "failed" and "budget" in res.message and "nothing was stored" in res.message
    cancel = threading.Event()
    res = rules.apply_rule_sync(seeded_store, slow, "slow2", cancel=cancel,
                                on_progress=lambda d, t: cancel.set())
    assert res.status == "cancelled"
    assert seeded_store.counts() == before and len(rules.versions(seeded_store)) == n_versions
    assert seeded_store.scalar("SELECT count(*) FROM rewards WHERE rule_version_id LIKE 'slow%'") == 0


def test_a_rule_that_fails_to_load_fails_every_rollout_plainly(seeded_store):
    res = rules.apply_rule_sync(seeded_store, "import no_such_module\ndef reward(p, c, g, s, **k):\n    return 1\n",
                                "broken", scope=queries.RolloutFilter(prompt_contains="Q: 2"))
    assert res.status == "done" and res.failed == res.scored > 0
    assert "the rule failed to load" in res.errors[0][1] and "No module named 'no_such_module'" in res.errors[0][1]


# -- versions, steps and diffs ----------------------------------------------------------------

LENGTHY = '''
from studio.rewardlib import answer_correct, gated, length_penalty

def reward(prompt, completion, gold, steps, **ctx):
    acc = answer_correct(ctx["parsed"], gold, ctx["task"])
    return {"accuracy": acc, "length": length_penalty(len(completion), 20, 0.05)}

def step_reward(prompt, step, gold, **ctx):
    return 1.0 if step.correct else 0.0
'''


def test_versions_steps_and_diff(seeded_store):
    base = rules.apply_rule_sync(seeded_store, rules.DEFAULT_SOURCE, "arithmetic-src")
    new = rules.apply_rule_sync(seeded_store, LENGTHY, "lengthy", note="penalise length")
    again = rules.apply_rule_sync(seeded_store, LENGTHY + "\n# same rule\n", "lengthy")
    assert again.status == "unchanged" and again.rule_version_id == new.rule_version_id
    vs = rules.versions(seeded_store).set_index("rule_version_id")
    assert vs.loc[new.rule_version_id, "rollouts"] == 512 and vs.loc[new.rule_version_id, "note"] == "penalise length"
    assert rules.source_of(seeded_store, new.rule_version_id) == LENGTHY
    # totals: accuracy + length penalty, and the sum when no total is given
    r = seeded_store.df("SELECT ro.text, rw.component, rw.value FROM rewards rw JOIN rollouts ro USING (rollout_id) "
                        "WHERE rw.rule_version_id = ?", [new.rule_version_id])
    wide = r.pivot_table(index="text", columns="component", values="value", aggfunc="first")
    assert ((wide["accuracy"] + wide["length"] - wide["total"]).abs() < 1e-9).all()
    text = wide.index[0]
    assert wide.loc[text, "length"] == pytest.approx(-0.05 * max(0, len(text) - 20))
    # step rewards keyed by the version, spanning the step's tokens
    sr = seeded_store.df("SELECT * FROM step_rewards WHERE source = ?", [new.rule_version_id])
    assert len(sr) > 512 and set(sr["value"]) <= {0.0, 1.0} and (sr["end_pos"] >= sr["start_pos"]).all()
    # the diff
    d = rules.diff(seeded_store, base.rule_version_id, new.rule_version_id)
    assert len(d.rows) == 512 and len(d.changed) > 0
    assert (d.changed["delta"].abs() > 0).all()
    sign = lambda x: (x > 0) - (x < 0)  # noqa: E731
    assert len(d.sign_flips) > 0
    for r in d.rows.itertuples():
        assert r.sign_flip == (sign(r.advantage_a) != sign(r.advantage_b))
    # nothing is overwritten: the earlier version's rewards are all still there
    assert seeded_store.scalar("SELECT count(*) FROM rewards WHERE rule_version_id = ? AND component = 'total'",
                               [base.rule_version_id]) == 512
    # any view can show either version
    t_new = queries.rollout_table(seeded_store, rule_version_id=new.rule_version_id)
    t_base = queries.rollout_table(seeded_store, rule_version_id=base.rule_version_id)
    assert not t_new.set_index("rollout_id")["reward"].equals(t_base.set_index("rollout_id")["reward"])


def test_rules_load_from_a_file_or_a_dotted_path(tmp_path, monkeypatch):
    f = tmp_path / "my_rule.py"
    f.write_text(LENGTHY)
    assert rules.load_source(str(f)) == LENGTHY
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "def step_reward" in rules.load_source("my_rule")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        rules.load_source(str(tmp_path / "nope.py"))
    with pytest.raises(ValueError, match="defines no reward function"):
        rules.load_source("json")


def test_step_values_in_the_library_match_the_step_rule():
    steps = [Step("2+3=5", 0, 5, True), Step("5-1=3", 6, 11, False)]
    assert rewardlib.gated(1.0, [1.0 if s.correct else 0.0 for s in steps]) == 1.0


def test_command_line_applies_a_rule_file(tmp_path):
    import subprocess
    import sys

    from sample_data import ROLLOUTS_DIR
    from studio.store import Store

    db = tmp_path / "cli.duckdb"
    Store.open(db, seed_dir=ROLLOUTS_DIR).close()
    f = tmp_path / "lengthy.py"
    f.write_text(LENGTHY)
    out = subprocess.run([sys.executable, "-m", "studio.rules", "--db", str(db), "--rule", str(f), "--note", "cli"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "lengthy@" in out.stdout and "done, 512 scored, 0 failed" in out.stdout
    bad = tmp_path / "bad.py"
    bad.write_text("def reward(:\n")
    out = subprocess.run([sys.executable, "-m", "studio.rules", "--db", str(db), "--rule", str(bad)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "error: line 1" in out.stderr
    store = Store.open(db)
    assert set(rules.versions(store)["note"]) >= {"cli"}
    store.close()


def test_hacking_diagnostics(seeded_store):
    base = ARITHMETIC_V1.version_id
    long = rules.apply_rule_sync(seeded_store, "def reward(prompt, completion, gold, steps, **ctx):\n"
                                               "    return {'len': len(completion) / 10.0}\n", "length-hack")
    lc = diagnostics.length_correlation(seeded_store).set_index("rule_version_id")
    assert lc.loc[long.rule_version_id, "r"] > 0.99  # reward is length (chars ~ tokens for the char tokenizer)
    assert abs(lc.loc[base, "r"]) < lc.loc[long.rule_version_id, "r"]
    dom = diagnostics.component_dominance(seeded_store, base)
    assert set(dom["component"]) == {"accuracy", "format", "steps"}
    w = dict(zip(dom["component"], dom["weight"]))
    assert w["accuracy"] == pytest.approx(1.0, abs=1e-6) and w["steps"] == pytest.approx(0.25, abs=1e-6)
    assert dom.iloc[0]["component"] == "accuracy" and dom["share"].sum() == pytest.approx(1.0, abs=1e-6)
    d = diagnostics.disagreement(seeded_store, base, long.rule_version_id, threshold_a=1.0, threshold_b=2.5)
    assert int(d.matrix.to_numpy().sum()) == 512
    assert len(d.false_positives) == d.matrix.loc["A fail", "B pass"]
    assert len(d.false_negatives) == d.matrix.loc["A pass", "B fail"]
    assert (d.false_positives["reward_b"] >= 2.5).all() and (d.false_positives["reward_a"] < 1.0).all()


def test_a_rule_reads_another_source_through_ctx(seeded_store):
    base = ARITHMETIC_V1.version_id
    src = "def reward(prompt, completion, gold, steps, **ctx):\n    return 2.0 * ctx['prev']\n"
    res = rules.apply_rule_sync(seeded_store, src, "double", sources={"prev": base})
    assert res.status == "done" and res.failed == 0
    d = rules.diff(seeded_store, base, res.rule_version_id)
    assert ((d.rows["reward_b"] - 2.0 * d.rows["reward_a"]).abs() < 1e-9).all()
    alone = rules.apply_rule_sync(seeded_store, src, "double")  # without the source: ctx has no 'prev'
    assert alone.rule_version_id != res.rule_version_id and alone.failed == 512
    assert "KeyError: 'prev'" in alone.errors[0][1]
    assert "# sources {'prev': " in rules.source_of(seeded_store, res.rule_version_id)


def test_reward_model_scores_become_a_version_a_rule_can_read(seeded_store, tmp_path):
    """A sequence-classification folder (here a randomly initialised tiny GPT-2 classifier
    with the sample policy's tokenizer) scores every rollout in the worker; its version can
    be diffed and read by a rule as ctx['rm']."""
    import numpy as np
    from transformers import AutoTokenizer, GPT2Config, GPT2ForSequenceClassification

    from backends.reward_model import load_reward_model
    from sample_data import POLICY_DIR

    tok = AutoTokenizer.from_pretrained(POLICY_DIR)
    cfg = GPT2Config(vocab_size=len(tok), n_positions=96, n_embd=32, n_layer=1, n_head=2, num_labels=1,
                     pad_token_id=tok.pad_token_id)
    folder = tmp_path / "rm"
    GPT2ForSequenceClassification(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)

    res = reward_models.score_with_reward_model_sync(seeded_store, folder)
    assert res.status == "done" and res.scored == 512 and res.rule_version_id.startswith("rm-rm@")
    vals = seeded_store.df("SELECT rollout_id, value FROM rewards WHERE rule_version_id = ?", [res.rule_version_id])
    assert len(vals) == 512 and ((vals["value"] > 0) & (vals["value"] < 1)).all()  # sigmoid of the logit
    # the stored score is the model's own, one rollout at a time
    row = queries.rollout(seeded_store, vals.iloc[0]["rollout_id"])
    direct = load_reward_model(folder, device="cpu").score_rollouts([row["prompt"]], [row["text"]])[0]
    assert vals.iloc[0]["value"] == pytest.approx(float(direct), abs=1e-5)
    assert reward_models.score_with_reward_model_sync(seeded_store, folder).status == "unchanged"
    # a rule reads it, and the disagreement matrix compares it with the built-in rule
    mixed = rules.apply_rule_sync(seeded_store, "def reward(prompt, completion, gold, steps, **ctx):\n"
                                                "    return ctx['rm'] * 10\n", "rm-x10", sources={"rm": res.rule_version_id})
    d = rules.diff(seeded_store, res.rule_version_id, mixed.rule_version_id)
    np.testing.assert_allclose(d.rows["reward_b"], 10 * d.rows["reward_a"], rtol=1e-9)
    dis = diagnostics.disagreement(seeded_store, ARITHMETIC_V1.version_id, res.rule_version_id, 1.0, 0.5)
    assert int(dis.matrix.to_numpy().sum()) == 512


def test_math_verify_answers_match_the_task_check_in_the_sandbox(seeded_store):
    """math-verify's equivalence (rewardlib.math_match) runs inside the sandbox's workers and
    agrees with the sample task's exact integer check on every stored rollout."""
    src = ("from studio.rewardlib import math_match\n\n"
           "def reward(prompt, completion, gold, steps, **ctx):\n"
           "    return math_match(ctx['parsed'].answer, gold['answer'])\n")
    exact = ("from studio.rewardlib import answer_correct\n\n"
             "def reward(prompt, completion, gold, steps, **ctx):\n"
             "    return answer_correct(ctx['parsed'], gold, ctx['task'])\n")
    mv, ex = rules.apply_rule_sync(seeded_store, src, "mv"), rules.apply_rule_sync(seeded_store, exact, "exact")
    assert mv.status == ex.status == "done" and mv.failed == ex.failed == 0
    d = rules.diff(seeded_store, ex.rule_version_id, mv.rule_version_id)
    assert len(d.rows) == 512 and d.changed.empty
    assert 0 < d.rows["reward_a"].sum() < 512  # both outcomes occur, so agreement means something


def test_a_cold_worker_loads_the_rule_before_the_per_rollout_timer(seeded_store):
    """A fresh worker runs the rule's module-level code and pays math-verify's first import (with
    sympy: seconds) before the per-rollout timer starts: with a limit far below that cost, no
    rollout of a math_match rule times out (the limit still stops slow scoring: test above)."""
    from studio.rewards import sandbox

    limits = Limits(call_s=0.75, workers=1, memory_mb=2047)  # a pool of its own, started cold here
    sandbox.kill_pool(limits)
    src = ("import time\n"
           "from studio.rewardlib import math_match\n\n"
           "time.sleep(1.0)  # module-level work: loading the rule, not scoring a rollout\n\n\n"
           "def reward(prompt, completion, gold, steps, **ctx):\n"
           "    return math_match(ctx['parsed'].answer, gold['answer'])\n")
    scope = queries.RolloutFilter(group_id=seeded_store.scalar("SELECT min(group_id) FROM rollouts"))
    try:
        res = rules.apply_rule_sync(seeded_store, src, "mv-cold", scope=scope, limits=limits)
    finally:
        sandbox.kill_pool(limits)
    assert res.status == "done" and res.scored > 0 and res.failed == 0, res.errors[:1]


def test_stored_rule_sources_import_studio_rewardlib(seeded_store):
    """The rule sources stores hold import ``studio.rewardlib`` (both ways): that name re-exports the
    whole library, and such a source scores in the sandbox exactly like the built-in rule."""
    import studio.rewardlib as alias

    assert alias.__all__ == rewardlib.__all__
    assert all(getattr(alias, name) is getattr(rewardlib, name) for name in rewardlib.__all__)
    src = ("import studio.rewardlib as rl\n"
           "from studio.rewardlib import *\n\n\n"
           "def reward(prompt, completion, gold, steps, **ctx):\n"
           "    parts = {'accuracy': answer_correct(ctx['parsed'], gold, ctx['task']),\n"
           "             'format': rl.format_ok(ctx['parsed']), 'steps': steps_correct(steps)}\n"
           "    return {**parts, 'total': weighted(parts, {'format': 0.1, 'steps': 0.25})}\n")
    scope = queries.RolloutFilter(group_id=seeded_store.scalar("SELECT max(group_id) FROM rollouts"))
    res = rules.apply_rule_sync(seeded_store, src, "stored-style", scope=scope)
    assert res.status == "done" and res.scored > 0 and res.failed == 0, res.errors[:1]
    d = rules.diff(seeded_store, ARITHMETIC_V1.version_id, res.rule_version_id)
    assert len(d.rows) == res.scored and d.changed.empty


def test_new_rollouts_join_the_version_the_views_show(seeded_store):
    """After Generate, the new run is scored with the picked version, or else the most recently
    applied one: a user rule (with a ctx source) is re-run on exactly the new rollouts."""
    from sample_data import POLICY_DIR
    from studio.runs.generation import GenerateConfig, generate_sync

    base = ARITHMETIC_V1.version_id
    src = "def reward(prompt, completion, gold, steps, **ctx):\n    return 2.0 * ctx['prev'] + len(completion)\n"
    applied = rules.apply_rule_sync(seeded_store, src, "double", sources={"prev": base})
    assert rules.active_version(seeded_store) == applied.rule_version_id
    assert rules.active_version(seeded_store, base) == base
    gen = generate_sync(seeded_store, POLICY_DIR, ["Q: 2+3=", "Q: 7-4="], GenerateConfig(group_size=2, seed=3))
    assert gen.status == "done" and gen.rollouts == 4
    msg = rules.run_sync(rules.score_new_run, seeded_store, gen.run_id)
    assert msg == f"also scored with {applied.rule_version_id}"
    got = seeded_store.df("""
        SELECT ro.text, a.value AS v, b.value AS prev FROM rollouts ro
        JOIN rewards a ON a.rollout_id = ro.rollout_id AND a.rule_version_id = ? AND a.component = 'total'
        JOIN rewards b ON b.rollout_id = ro.rollout_id AND b.rule_version_id = ? AND b.component = 'total'
        WHERE ro.run_id = ?""", [applied.rule_version_id, base, gen.run_id])
    assert len(got) == 4
    assert ((got["v"] - (2.0 * got["prev"] + got["text"].str.len())).abs() < 1e-9).all()
    assert rules.versions(seeded_store).set_index("rule_version_id").loc[applied.rule_version_id, "rollouts"] == 516
    # the built-in rule already scored them: nothing to say; an unknown version is named
    assert rules.run_sync(rules.score_new_run, seeded_store, gen.run_id, base) == ""
    assert "no rule version 'nope@1'" in rules.run_sync(rules.score_new_run, seeded_store, gen.run_id, "nope@1")


def test_new_rollouts_join_a_reward_model_version(seeded_store):
    from sample_data import POLICY_DIR, REWARD_MODEL_DIR
    from studio.runs.generation import GenerateConfig, generate_sync

    rm = reward_models.score_with_reward_model_sync(seeded_store, REWARD_MODEL_DIR)
    gen = generate_sync(seeded_store, POLICY_DIR, ["Q: 5+5="], GenerateConfig(group_size=3, seed=1))
    assert rules.run_sync(rules.score_new_run, seeded_store, gen.run_id) == f"also scored with {rm.rule_version_id}"
    vals = seeded_store.df("""SELECT value FROM rewards JOIN rollouts USING (rollout_id)
                              WHERE run_id = ? AND rule_version_id = ?""", [gen.run_id, rm.rule_version_id])["value"]
    assert len(vals) == 3 and vals.between(0, 1).all()


# -- views over a diff: filters, component changes, collapsed changes ----------------------------

def literal_diff() -> rules.Diff:
    """Seven rollouts in three groups, every case a view must sort out:
    g1 [1, 0, 0] → [1, 3, 3]: r1 keeps its reward yet its advantage turns negative; r2, r3 rise by 3
    and turn positive (three sign flips, two changes alike);
    g2 [1.1, 1.1] → [1.85, 1.85]: both rise by 0.75, all-equal before and after (A = 0: no flip);
    g3 [1, 0] → [1, 1]: becomes all-equal, so both advantages go to 0 (two flips), r7 changes.
    Components: accuracy in both (changes on r7 only), format in A only, length in B only."""
    import pandas as pd

    ids = ["r1", "r2", "r3", "r4", "r5", "r6", "r7"]
    rows = pd.DataFrame({
        "rollout_id": ids, "prompt": ["p1"] * 3 + ["p2"] * 2 + ["p3"] * 2, "completion": ids,
        "group_id": ["g1"] * 3 + ["g2"] * 2 + ["g3"] * 2,
        "reward_a": [1.0, 0.0, 0.0, 1.1, 1.1, 1.0, 0.0], "reward_b": [1.0, 3.0, 3.0, 1.85, 1.85, 1.0, 1.0],
        "advantage_a": [1.15, -0.58, -0.58, 0.0, 0.0, 0.71, -0.71],
        "advantage_b": [-1.15, 0.58, 0.58, 0.0, 0.0, 0.0, 0.0]})
    rows["delta"] = rows["reward_b"] - rows["reward_a"]
    rows["changed"] = rows["delta"].abs() > 1e-9
    rows["sign_flip"] = [True, True, True, False, False, True, True]
    groups = pd.DataFrame({"group_id": ["g1", "g2", "g3"], "prompt": ["p1", "p2", "p3"],
                           "all_equal_a": [False, True, False], "all_equal_b": [False, True, True]})
    comps = pd.DataFrame(
        [(r, "accuracy", a, 1.0 if r == "r7" else a) for r, a in zip(ids, [1, 0, 0, 1, 1, 1, 0], strict=True)]
        + [(r, "format", 1.0, None) for r in ids] + [(r, "length", None, -0.1) for r in ids],
        columns=["rollout_id", "component", "value_a", "value_b"])
    return rules.Diff("a@1", "b@2", rows, groups, comps)


def test_diff_views_filter_on_a_literal_diff():
    d = literal_diff()
    ids = lambda df: df["rollout_id"].tolist()  # noqa: E731
    assert ids(diff_views.pick(d, "changed")) == ["r2", "r3", "r4", "r5", "r7"]
    assert ids(diff_views.pick(d, "flips")) == ["r1", "r2", "r3", "r6", "r7"]  # r1, r6: reward unchanged, flipped
    assert ids(diff_views.pick(d, "all_equal")) == ["r6", "r7"]  # g3 became all-equal; g2 was and stays
    assert ids(diff_views.pick(d, "all")) == ids(d.rows)
    assert ids(diff_views.pick(d, "changed", "accuracy")) == ["r7"]
    assert ids(diff_views.pick(d, "flips", "accuracy")) == ["r7"]
    assert ids(diff_views.pick(d, "all", "length")) == ids(d.rows)  # a component B alone has changed everywhere
    with pytest.raises(ValueError, match="one of changed, flips"):
        diff_views.pick(d, "everything")
    cc = diff_views.component_changes(d).set_index("component")
    assert cc.loc["accuracy"].tolist() == [True, True, 1]
    assert cc.loc["format"].tolist() == [True, False, 7] and cc.loc["length"].tolist() == [False, True, 7]


def test_identical_changes_collapse_into_counts():
    d = literal_diff()
    lines = diff_views.collapse(diff_views.pick(d, "changed"))
    # two alike most common first, the larger change (+3) before +0.75, then the single change
    assert lines[["n", "reward_a", "reward_b", "flips"]].values.tolist() == [[2, 0.0, 3.0, 2], [2, 1.1, 1.85, 0],
                                                                              [1, 0.0, 1.0, 1]]
    assert lines["delta"].tolist() == pytest.approx([3.0, 0.75, 1.0])
    assert lines["rollout_ids"].tolist() == [["r2", "r3"], ["r4", "r5"], ["r7"]]
    assert diff_views.collapse(diff_views.pick(d, "changed").head(0)).empty


def test_diff_views_on_a_real_diff(seeded_store):
    """The lengthy rule against the built-in one: the sign-flip view holds exactly the rollouts
    whose GRPO advantage changed sign, the collapsed lines cover every changed rollout once, and
    the components say what moved (accuracy is the same check in both)."""
    base = ARITHMETIC_V1.version_id
    new = rules.apply_rule_sync(seeded_store, LENGTHY, "lengthy")
    d = rules.diff(seeded_store, base, new.rule_version_id)
    sign = lambda x: (x > 1e-9) - (x < -1e-9)  # noqa: E731
    flipped = {r.rollout_id for r in d.rows.itertuples() if sign(r.advantage_a) != sign(r.advantage_b)}
    assert flipped and set(diff_views.pick(d, "flips")["rollout_id"]) == flipped
    lines = diff_views.collapse(diff_views.pick(d, "changed"))
    assert lines["n"].sum() == len(d.changed) and len(lines) < len(d.changed)
    listed = [rid for ids in lines["rollout_ids"] for rid in ids]
    assert sorted(listed) == sorted(d.changed["rollout_id"])
    cc = diff_views.component_changes(d).set_index("component")
    assert cc.loc["accuracy", "changed"] == 0 and cc.loc["length", "changed"] == 512
    assert not cc.loc["length", "in_a"] and not cc.loc["steps", "in_b"]
    assert diff_views.pick(d, "changed", "accuracy").empty


def test_comparisons_open_on_two_versions_that_scored_the_same_rollouts(seeded_store):
    base = ARITHMETIC_V1.version_id
    assert rules.default_pair(seeded_store) == (None, base)  # one version: nothing to compare it with
    new = rules.apply_rule_sync(seeded_store, LENGTHY, "lengthy").rule_version_id
    assert rules.default_pair(seeded_store) == (base, new)
    # two newer versions over disjoint rollouts: the newest is compared with the newest that shares rollouts
    right = rules.apply_rule_sync(seeded_store, "def reward(prompt, completion, gold, steps, **ctx):\n    return 1.0\n",
                                  "right", scope=queries.RolloutFilter(correct=True)).rule_version_id
    wrong = rules.apply_rule_sync(seeded_store, "def reward(prompt, completion, gold, steps, **ctx):\n    return 0.0\n",
                                  "wrong", scope=queries.RolloutFilter(correct=False)).rule_version_id
    assert rules.overlap(seeded_store, right, wrong) == 0 and rules.overlap(seeded_store, base, new) == 512
    assert rules.default_pair(seeded_store) == (new, wrong)
