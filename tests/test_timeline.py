"""Timeline and run diff: a small imported multi-step run written row by row, with every
expected number worked out by hand; the paired statistics on literal cases and against scipy."""
from __future__ import annotations

import math
from datetime import datetime

import numpy as np
import pandas as pd
import pytest

from studio.queries import timeline as tl
from studio.queries.timeline import Side
from studio.signals import stats as st
from studio.store import Store

VERSION = "imported@test"
T0 = datetime(2026, 1, 1)

# (run, step, prompt) -> rewards of the group's completions; correct (and accuracy 1) where the reward is 1.
#   run "ra": P1 at steps 1, 2, 3; P2 at 1 and 3; P3 only at 2; P4 only at 1; P5 only at 3.
#   run "rb": P1 at 1, P2 at 2 (both at a single step each), P6 at 2.
GROUPS = {
    ("ra", 1, "P1"): [0.0, 0.0],  # all equal
    ("ra", 2, "P1"): [0.0, 1.0],
    ("ra", 3, "P1"): [1.0, 1.0],
    ("ra", 1, "P2"): [1.0, 0.5],
    ("ra", 3, "P2"): [0.5, 0.0],
    ("ra", 2, "P3"): [1.0, 1.0],
    ("ra", 1, "P4"): [0.0, 0.0],
    ("ra", 3, "P5"): [1.0, 0.0],
    ("rb", 1, "P1"): [1.0, 1.0],
    ("rb", 2, "P2"): [0.5, 0.5],
    ("rb", 2, "P6"): [0.0, 1.0],
}
# entropies of each completion's tokens (steps 1 and 2 of run ra); step 3 and run rb: no tokens.
# P1 step 1: (0.5 + 1.5 + 2.0) / 3 = 4/3 over all tokens (the mean of per-completion means would be 1.5)
TOKENS = {("ra", 1, "P1"): [[0.5, 1.5], [2.0]], ("ra", 2, "P1"): [[1.0, 1.0], [0.0, 2.0]],
          ("ra", 1, "P2"): [[0.2], [0.4]], ("ra", 2, "P3"): [[0.3], [0.3]], ("ra", 1, "P4"): [[1.0], [1.0]]}
LENGTH_NO_TOKENS = 5  # n_tokens of completions stored without tokens (as an importer without logprobs writes them)


def write_run(store: Store) -> None:
    """Runs, prompts, rollouts, rewards and tokens shaped like an importer's rows."""
    runs = pd.DataFrame([{"run_id": r, "kind": "import", "name": f"run {r}", "created_at": T0, "status": "done"}
                         for r in ("ra", "rb")])
    prompts = pd.DataFrame([{"prompt_id": p, "task": "arithmetic", "text": f"Q: <{p}> 1+{i}="}
                            for i, p in enumerate(["P1", "P2", "P3", "P4", "P5", "P6"])])
    ro, rw, tk = [], [], []
    n = 0
    for (run, step, prompt), rewards in GROUPS.items():
        gid = f"g-{run}-{step}-{prompt}"
        toks = TOKENS.get((run, step, prompt))
        for i, r in enumerate(rewards):
            rid = f"r{n:04d}"
            n += 1
            ents = toks[i] if toks else None
            ro.append({"rollout_id": rid, "run_id": run, "train_step": step, "prompt_id": prompt, "group_id": gid,
                       "sample_idx": i, "text": f"answer {r}", "n_tokens": len(ents) if ents else LENGTH_NO_TOKENS,
                       "finish_reason": "stop", "created_at": T0, "correct": r == 1.0})
            rw += [{"rollout_id": rid, "rule_version_id": VERSION, "component": "total", "value": r},
                   {"rollout_id": rid, "rule_version_id": VERSION, "component": "accuracy", "value": float(r == 1.0)}]
            for pos, e in enumerate(ents or []):
                tk.append({"rollout_id": rid, "pos": pos, "token_id": pos, "token_text": "x", "entropy": e})
    store.write({"runs": runs, "prompts": prompts, "rule_versions": pd.DataFrame([
        {"rule_version_id": VERSION, "name": "imported", "created_at": T0}]),
        "rollouts": pd.DataFrame(ro), "rewards": pd.DataFrame(rw), "tokens": pd.DataFrame(tk)})


@pytest.fixture()
def store(tmp_path):
    s = Store.open(tmp_path / "timeline.duckdb")
    write_run(s)
    yield s
    s.close()


# -- pickers and the timeline ------------------------------------------------------------------

def test_runs_with_steps_and_prompts_seen_at_two_steps(store):
    runs = tl.runs_with_steps(store)
    assert set(runs["run_id"]) == {"ra", "rb"}
    ra = runs.set_index("run_id").loc["ra"]
    assert (ra.steps, ra.first_step, ra.last_step, ra.rollouts) == (3, 1, 3, 16)
    assert tl.run_steps(store, "ra")["train_step"].tolist() == [1, 2, 3]
    ps = tl.prompts_across_steps(store, "ra")
    # P1 (3 steps) before P2 (2 steps); P3, P4, P5 are seen at one step only
    assert ps["prompt_id"].tolist() == ["P1", "P2"]
    p1, p2 = ps.iloc[0], ps.iloc[1]
    assert (p1.steps, p1.first_step, p1.last_step, p1.rollouts) == (3, 1, 3, 6)
    assert (p1.reward_first, p1.reward_last) == (0.0, 1.0)
    assert (p2.reward_first, p2.reward_last) == pytest.approx((0.75, 0.25))
    assert tl.prompts_across_steps(store, "ra", search="<p2>")["prompt_id"].tolist() == ["P2"]  # case-insensitive
    assert tl.prompts_across_steps(store, "ra", search="%")["prompt_id"].tolist() == []  # a character, no wildcard
    assert tl.prompts_across_steps(store, "rb").empty  # each prompt of rb at one step
    assert tl.prompts_across_steps(store, "ra", limit=1)["prompt_id"].tolist() == ["P1"]


def test_prompt_timeline_per_step_with_null_entropy_without_tokens(store):
    df = tl.prompt_timeline(store, "P1", "ra")
    assert df["train_step"].tolist() == [1, 2, 3]
    assert df["n"].tolist() == [2, 2, 2]
    assert df["reward_mean"].tolist() == [0.0, 0.5, 1.0]
    assert df["reward_min"].tolist() == [0.0, 0.0, 1.0] and df["reward_max"].tolist() == [0.0, 1.0, 1.0]
    assert df["accuracy"].tolist() == [0.0, 0.5, 1.0]
    assert df["all_equal"].tolist() == [True, False, True]
    # mean over all the step's tokens: (0.5 + 1.5 + 2.0) / 3, then (1 + 1 + 0 + 2) / 4; step 3 has none
    assert df["entropy"].iloc[0] == pytest.approx(4 / 3) and df["entropy"].iloc[1] == pytest.approx(1.0)
    assert pd.isna(df["entropy"].iloc[2]) and df["with_tokens"].tolist() == [2, 2, 0]
    assert df["length"].tolist() == [1.5, 2.0, LENGTH_NO_TOKENS]
    both = tl.prompt_timeline(store, "P1")  # every run: ra's three steps, then rb's one
    assert list(zip(both["run_id"], both["train_step"])) == [("ra", 1), ("ra", 2), ("ra", 3), ("rb", 1)]
    assert both["run"].iloc[-1] == "run rb"
    assert tl.prompt_timeline(store, "P1", "ra", rule_version_id=VERSION).equals(df)
    unscored = tl.prompt_timeline(store, "P1", "ra", rule_version_id="other@1")
    assert unscored["reward_mean"].isna().all()  # no reward under a version that never scored them ...
    assert unscored["accuracy"].tolist() == df["accuracy"].tolist()  # ... but correctness is the rollouts' own
    assert unscored["all_equal"].isna().all() and unscored["n"].tolist() == [2, 2, 2]
    assert tl.prompt_timeline(store, "nope").empty


def test_timeline_rollouts_of_one_step(store):
    df = tl.timeline_rollouts(store, "P1", "ra", 2)
    assert df["reward"].tolist() == [0.0, 1.0] and df["sample_idx"].tolist() == [0, 1]
    assert df["advantage"].iloc[0] < 0 < df["advantage"].iloc[1]  # GRPO within the group
    assert df["entropy"].tolist() == [1.0, 1.0]  # (1 + 1) / 2 and (0 + 2) / 2
    no_tokens = tl.timeline_rollouts(store, "P1", "ra", 3)
    assert len(no_tokens) == 2 and no_tokens["entropy"].isna().all()
    assert tl.timeline_rollouts(store, "P1", "ra", 9).empty
    assert len(tl.timeline_rollouts(store, "P1", "ra", 2, limit=1)) == 1
    place = tl.rollout_place(store, df["rollout_id"].iloc[1])
    assert place == {"prompt_id": "P1", "run_id": "ra", "train_step": 2}
    assert tl.rollout_place(store, "missing") is None


# -- the diff --------------------------------------------------------------------------------

def test_run_diff_of_two_steps(store):
    d = tl.run_diff(store, Side("ra", 1), Side("ra", 3))
    # shared: P1 (A 0, B 1: +1) and P2 (A 0.75, B 0.25: -0.5); P4 only at step 1, P5 only at step 3
    assert d.per_prompt["prompt_id"].tolist() == ["P1", "P2"]
    assert d.per_prompt["delta"].tolist() == [1.0, -0.5]
    assert d.per_prompt["prompt"].tolist() == ["Q: <P1> 1+0=", "Q: <P2> 1+1="]
    assert (d.shared, d.n, d.only_a, d.only_b) == (2, 2, 1, 1)
    assert d.mean_a == pytest.approx(0.375) and d.mean_b == pytest.approx(0.625)
    assert d.mean_delta == pytest.approx(0.25)
    assert (d.wins, d.ties, d.losses) == (1, 0, 1)
    assert d.p_sign == 1.0  # 2 * P(X <= 1 | n = 2) = 1.5, capped
    # accuracy: P1 0 -> 1, P2 0 -> 0 (its rewards 1 and 0.5 count one of two correct at step 1: 0.5)
    assert d.accuracy_a == pytest.approx((0.0 + 0.5) / 2) and d.accuracy_b == pytest.approx((1.0 + 0.0) / 2)
    assert d.per_prompt[["n_a", "n_b"]].to_numpy().tolist() == [[2, 2], [2, 2]]
    assert d.per_prompt["length_a"].tolist() == [1.5, 1.0]
    assert d.ci_method == "bootstrap" and -0.5 <= d.ci_lo <= d.ci_hi <= 1.0
    m = d.movers(5)
    assert m[["prompt_id", "direction"]].values.tolist() == [["P1", "up"], ["P2", "down"]]


def test_run_diff_of_two_whole_runs(store):
    d = tl.run_diff(store, Side("ra"), Side("rb"))
    # P1: A = (0+0+0+1+1+1)/6 = 0.5, B = 1 -> +0.5; P2: A = (1+0.5+0.5+0)/4 = 0.5, B = 0.5 -> tie
    assert d.per_prompt.set_index("prompt_id")["delta"].to_dict() == {"P1": 0.5, "P2": 0.0}
    assert (d.only_a, d.only_b) == (3, 1)  # P3, P4, P5 / P6
    assert (d.wins, d.ties, d.losses) == (1, 1, 0)
    assert d.p_wilcoxon == pytest.approx(1.0)  # one non-zero difference: W+ = 1 of {0, 1}, exact p = 1
    assert d.movers(3)["prompt_id"].tolist() == ["P1"]  # the tie moved neither way


def test_run_diff_with_nothing_shared_or_nothing_scored(store):
    d = tl.run_diff(store, Side("ra", 2), Side("rb", 1))  # P1, P3 against P1: P1 shared
    assert (d.shared, d.only_a, d.only_b) == (1, 1, 0)
    none = tl.run_diff(store, Side("ra", 2), Side("rb", 2))  # P1, P3 against P2, P6
    assert (none.shared, none.n, none.only_a, none.only_b) == (0, 0, 2, 2)
    assert math.isnan(none.mean_delta) and none.movers(5).empty
    unscored = tl.run_diff(store, Side("ra", 1), Side("ra", 3), rule_version_id="other@1")
    assert unscored.shared == 2 and unscored.n == 0 and math.isnan(unscored.mean_delta)
    same = tl.run_diff(store, Side("ra", 1), Side("ra", 1))
    assert same.mean_delta == 0 and (same.wins, same.ties, same.losses) == (0, 3, 0)
    assert (same.ci_lo, same.ci_hi) == (0.0, 0.0) and same.p_wilcoxon == 1.0 and same.p_sign == 1.0


def test_movers_order_on_a_literal_frame():
    per = pd.DataFrame({"prompt_id": ["a", "b", "c", "d", "e", "f"], "prompt": list("ABCDEF"),
                        "reward_a": [0, 0, 0, 1, 1, 0.5], "reward_b": [1, 0.5, 1, 0, 0.25, 0.5]})
    per["delta"] = per["reward_b"] - per["reward_a"]  # +1, +0.5, +1, -1, -0.75, 0
    d = tl.RunDiff(Side("x"), Side("y"), None, per, 0, 0)
    m = d.movers(2)
    # up: biggest rise first, equal rises by prompt id (a before c); down: biggest fall first; f (0) is neither
    assert m[["prompt_id", "direction"]].values.tolist() == [["a", "up"], ["c", "up"], ["d", "down"], ["e", "down"]]
    assert d.movers(1)["prompt_id"].tolist() == ["a", "d"]


# -- paired statistics on literal cases -------------------------------------------------------

def test_sign_test_literal_cases():
    assert st.sign_test_p(8, 2) == pytest.approx(112 / 1024)  # 2 * (1 + 10 + 45) / 2**10
    assert st.sign_test_p(10, 0) == pytest.approx(2 / 1024)  # 2 * 1 / 2**10
    assert st.sign_test_p(0, 10) == pytest.approx(2 / 1024)  # symmetric
    assert st.sign_test_p(5, 5) == 1.0 and st.sign_test_p(0, 0) == 1.0
    assert st.sign_test_p(60, 40) == pytest.approx(0.056887933640115, rel=1e-9)  # scipy.stats.binomtest(60, 100)


def test_wilcoxon_literal_cases():
    d = [0.5, -0.2, 0.3, 0.1]  # |d| ranks 4, 2, 3, 1: W+ = 4 + 3 + 1 = 8
    # exact: 3 of the 16 sign patterns have W+ >= 8 ({4,3,1}, {4,3,2}, {4,3,2,1}); two-sided 6/16
    assert st.wilcoxon_p(d) == pytest.approx(6 / 16)
    # normal: mu = 4*5/4 = 5, var = 4*5*9/24 = 7.5, z = 3/sqrt(7.5) = 1.0954, p = erfc(z / sqrt 2) = 0.27332
    assert st.wilcoxon_normal_p(d) == pytest.approx(0.273321678, rel=1e-6)
    # ties: |d| = 1, 1, 1, 2 -> ranks 2, 2, 2, 4; W+ = 8; var = 7.5 - (27 - 3)/48 = 7; z = 3/sqrt(7)
    assert st.wilcoxon_normal_p([1, 1, -1, 2]) == pytest.approx(math.erfc(3 / math.sqrt(7) / math.sqrt(2)))
    assert st.wilcoxon_normal_p([0.0, 0.0]) == 1.0 and st.wilcoxon_p([0.0, 0.0]) == 1.0  # no change at all
    assert st.wilcoxon_normal_p([0.0, 1.0, 2.0]) == st.wilcoxon_normal_p([1.0, 2.0])  # zeros dropped


def test_wilcoxon_normal_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(3)
    for n in (12, 80, 400):
        d = np.round(rng.normal(0.1, 1, n), 1)  # rounded: tied |d| values
        d = d[d != 0]
        ref = stats.wilcoxon(d, method="approx", correction=False).pvalue
        assert st.wilcoxon_normal_p(d) == pytest.approx(ref, rel=1e-9)


def test_bootstrap_interval_literal_cases(monkeypatch):
    # d = [0, 0, 3]: a resample's mean is K (the count of 3s drawn), K ~ Bin(3, 1/3):
    # P(K=0) = 8/27, P(K<=2) = 26/27 < 0.975 -> the 2.5th percentile is 0 and the 97.5th is 3
    assert st.bootstrap_ci([0, 0, 3])[:2] == (0.0, 3.0)
    assert st.bootstrap_ci([0.2] * 5)[:2] == pytest.approx((0.2, 0.2))  # no spread, no width
    assert st.bootstrap_ci([0.7]) == (0.7, 0.7, "bootstrap")
    assert st.bootstrap_ci([0, 1, 2, 5], seed=1) == st.bootstrap_ci([0, 1, 2, 5], seed=1)  # seeded
    lo, hi, method = st.bootstrap_ci([])
    assert math.isnan(lo) and math.isnan(hi) and method == "none"
    # past the draw budget: mean ± 1.96·sd/√n; d = 0..4: mean 2, sd = √2.5, half = 1.96·√2.5/√5 = 1.3859
    monkeypatch.setattr(st, "BOOT_MAX_DRAWS", 10)
    lo, hi, method = st.bootstrap_ci([0, 1, 2, 3, 4])
    assert method == "normal" and (lo, hi) == pytest.approx((2 - 1.385904, 2 + 1.385904), rel=1e-5)


def test_bootstrap_agrees_with_the_normal_interval_on_many_pairs():
    d = np.random.default_rng(0).normal(0.3, 1.0, 2000)
    lo, hi, _ = st.bootstrap_ci(d)
    half = 1.96 * d.std(ddof=1) / math.sqrt(len(d))
    assert lo == pytest.approx(d.mean() - half, abs=0.01) and hi == pytest.approx(d.mean() + half, abs=0.01)


def test_paired_stats_literal():
    s = st.paired_stats([0.0, 0.75, 0.5, 0.5], [1.0, 0.25, 0.5, 1.0])  # d = +1, -0.5, 0, +0.5
    assert s["n"] == 4 and s["mean_delta"] == pytest.approx(0.25)
    assert (s["wins"], s["ties"], s["losses"]) == (2, 1, 1)
    assert s["p_sign"] == 1.0  # 2 * P(X <= 1 | n = 3) = 2 * 4/8
    assert s["mean_a"] == pytest.approx(0.4375) and s["mean_b"] == pytest.approx(0.6875)


# -- the tab's view, without a browser ----------------------------------------------------------

def test_panel_draws_only_when_shown_then_follows_the_selection(store):
    from widgets.base.state import StudioState
    from widgets.timeline_panel import TimelinePanel

    st = StudioState(store=store)
    view = TimelinePanel(state=st, shown=False)
    assert view.param.run.objects == [] and all(p.object is None for p in view._plots)  # hidden: nothing queried
    view.shown = True
    assert view.run_id() in ("ra", "rb") and len(view.param.run.objects) == 2
    view.run = next(k for k, v in view._runs.items() if v == "ra")
    assert view.prompt_id() == "P1" and view.step == "step 3"  # most steps first; the last step listed
    assert "&lt;P1&gt;" in view._prompt_info.object and "<P1>" not in view._prompt_info.object  # escaped
    assert all(p.object is not None for p in view._plots) and view._plot.visible and len(view._step_rows) == 2
    assert "no tokens" in view._step_list.object  # step 3 was stored without tokens
    # diff defaults: the newest run with steps, first step against last
    assert view.side("a").train_step is not None and view.side("b").train_step is not None
    # a completion clicked in the step list opens in the token strip
    rid = view._step_rows["rollout_id"].iloc[1]
    view._on_click("open", rid)
    assert st.rollout_id == rid and 'class="pick step-row selected"' in view._step_list.object
    # a rollout selected elsewhere (rb, step 1): the timeline moves to its run, prompt and step
    other = store.scalar("SELECT rollout_id FROM rollouts WHERE run_id = 'rb' AND prompt_id = 'P1' LIMIT 1")
    st.open_rollout(other)
    assert view.run_id() == "rb" and view.prompt_id() == "P1" and view.step == "step 1"
    # sides: ra step 1 against ra step 3, as in test_run_diff_of_two_steps; a mover opens its timeline
    ra = next(k for k, v in view._all_runs.items() if v == "ra")
    view.param.update(a_run=ra, b_run=ra)
    view.param.update(a_step="step 1", b_step="step 3")
    assert 'data-shared="2"' in view._summary.object and "+0.250" in view._summary.object
    assert "mover" in view._movers.object
    view._on_click("mover", "P2")
    assert view.run_id() == "ra" and view.prompt_id() == "P2"
    # nothing shared: said so, no plot
    view.param.update(a_step="step 2")
    rb = next(k for k, v in view._all_runs.items() if v == "rb")
    view.param.update(b_run=rb)
    view.param.update(b_step="step 2")
    assert "No prompt is on both sides" in view._summary.object and not view._scatter.visible


def test_a_run_without_a_timeline_says_why(store):
    """Run "rb" has two steps but no prompt at both: the tab says so, and for a mini-run with its
    numbers (its steps drew fewer prompts than its pool holds) and what to change."""
    from widgets.base.state import StudioState
    from widgets.timeline_html import no_timeline_text
    from widgets.timeline_panel import TimelinePanel

    view = TimelinePanel(state=StudioState(store=store), shown=True)
    view.run = next(k for k, v in view._runs.items() if v == "rb")
    assert view.prompt_id() is None and not view._plot.visible
    assert "No prompt of this run was sampled at 2+ steps: each step drew different prompts" in view._prompt_info.object
    view.search = "P2"
    assert "containing &#x27;P2&#x27;" in view._prompt_info.object
    # a mini-run of 50 steps of 8 prompts over a pool of 4,096 (the old default): 400 draws, none twice
    said = no_timeline_text(50, {"n_prompts": 4096, "prompts_per_step": 8, "steps": 50})
    assert "its 50 steps drew 400 prompts from a pool of 4,096 (n_prompts)" in said and "50 × 8 over 128" in said


def test_timeline_plots_tick_whole_steps():
    """Training steps are whole numbers on every timeline axis (no 1.5 between steps)."""
    from widgets.base.plots import holoviews
    from widgets.timeline_plots import entropy_plot, length_plot, reward_plot

    df = pd.DataFrame({"train_step": [1, 2, 3], "reward_mean": [0.1, 0.5, 0.7], "reward_min": [0.0, 0.0, 0.5],
                       "reward_max": [1.0, 1.0, 1.0], "accuracy": [0.1, 0.4, 0.6], "n": [8, 8, 8],
                       "all_equal": [False, True, None], "entropy": [1.0, np.nan, 0.5], "with_tokens": [8, 0, 8],
                       "length": [10.0, 12.0, 9.0]})
    for plot in (reward_plot(df, 2, {}), entropy_plot(df, 2, {}), length_plot(df, 2, {})):
        ticker = holoviews().render(plot).xaxis[0].ticker
        assert ticker.min_interval == 1 and ticker.num_minor_ticks == 0
