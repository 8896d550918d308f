"""The Mismatch tab's drawing, without a page: what each section shows for given frames."""
from __future__ import annotations

from collections import namedtuple

import numpy as np
import pandas as pd

from widgets import mismatch_plots as mp

Cause = namedtuple("Cause", "name evidence fix")  # the fields of studio.signals.mismatch.Cause


def worst_frame() -> pd.DataFrame:
    return pd.DataFrame({"rollout_id": ["r1", "r2"], "pos": [0, 7], "token_text": ["4", " +"],
                         "delta": [-1.2, 0.4], "logprob": [np.log(0.5), np.log(0.2)],
                         "train_logprob": [np.log(0.5) - 1.2, np.log(0.2) + 0.4],
                         "before": ["", "2 + 2 ="], "after": ["2", " 3"]})


def test_worst_tokens_open_their_rollout_at_the_token_and_show_both_probabilities():
    html = mp.worst_html(worst_frame())
    assert 'data-click="token" data-value="r1:0"' in html and 'data-value="r2:7"' in html
    assert "0.5" in html and "0.151" in html  # p behaviour and p train = 0.5 · e^-1.2
    assert "2␣+␣2␣=" in html  # the tokens before it, in context (spaces shown)
    twice = mp.worst_html(pd.concat([worst_frame(), worst_frame().assign(rollout_id=["r3", "r4"])]))
    assert twice.count('class="mm-row"') == 2 and "<td>2</td>" in twice  # one row per token in context, 2 rollouts


def test_shares_highlight_the_sidebars_correction_and_say_what_a_method_does_not_do():
    df = pd.DataFrame({"preset": ["verl token TIS (threshold 2)", "sidebar: MIS, [0.5, 2]"],
                       "clipped": [0.031, np.nan], "masked": [np.nan, 0.052], "rejected": [np.nan, np.nan]})
    html = mp.shares_html(df, own="sidebar: MIS, [0.5, 2]")
    assert '<tr class="own"><td>sidebar: MIS, [0.5, 2]</td>' in html
    assert "3.1%" in html and "5.2%" in html and "<td>–</td>" in html
    assert all(s in html for s in ("clipped", "masked", "rejected"))  # the legend


def test_steps_are_clickable_and_the_picked_one_marked():
    df = pd.DataFrame({"step": [1, 2], "mean_abs_delta": [0.01, 0.05], "k3": [1e-4, 2e-3], "p99": [0.1, 0.4],
                       "tokens": [900, 950]})
    html = mp.steps_html(df, picked=2)
    assert 'data-click="step" data-value="1"' in html and 'class="mm-step own" data-click="step" data-value="2"' in html
    mp.drift(df)  # three lines with a legend; an empty frame gives a titled empty plot
    assert mp.steps_html(df.iloc[:0], None) == ""


def test_engines_name_each_cause_with_its_evidence_and_fix_or_say_none_shows():
    engines = pd.DataFrame({"engine": ["torch 2.13.0 cpu bfloat16"], "train_engine": ["torch 2.13.0 cpu float32"],
                            "rollouts": [64], "tokens": [4000], "mean_delta": [-0.3], "mean_abs_delta": [0.3]})
    cause = Cause("constant offset", "Δ is −0.30 ± 0.01 on 98% of tokens", "sample without top-p/top-k truncation")
    html = mp.engines_html(engines, [cause])
    assert "torch 2.13.0 cpu bfloat16" in html and "torch 2.13.0 cpu float32" in html
    assert "constant offset" in html and "98% of tokens" in html and "What to do: sample without" in html
    assert "No known cause" in mp.engines_html(engines, [])


def test_plots_of_an_empty_scope_say_so_instead_of_failing():
    hist = pd.DataFrame({"lo": [-1.0, 0.0], "hi": [0.0, 1.0], "tokens": [3, 0]})
    mp.histogram(hist)
    for plot in (mp.histogram(hist.iloc[:0]), mp.by_position(pd.DataFrame(columns=["pos", "mean_abs_delta", "tokens"])),
                 mp.by_entropy(pd.DataFrame(columns=["entropy", "mean_abs_delta", "tokens"]))):
        assert "no Δ" in plot.opts.get().kwargs["title"].replace("No", "no")
    assert "no Δ" in mp.worst_html(worst_frame().iloc[:0])


def test_the_view_reads_the_tables_scope_and_an_empty_one_says_how_to_get_recomputed_log_probs():
    from sample_data import MISMATCH_RUNS_DIR, ROLLOUTS_DIR
    from studio import queries
    from studio.queries import RolloutFilter
    from studio.store import Store
    from widgets.base.state import StudioState
    from widgets.mismatch_panel import MismatchPanel

    store = Store.open(":memory:", seed_dir=[ROLLOUTS_DIR, MISMATCH_RUNS_DIR])
    state = StudioState(store=store)
    view = MismatchPanel(state=state, can_run=False)  # a browse-only user
    view.shown = True
    assert "tokens with Δ" in view._summary.object and view._body.visible
    assert not any("rescore-form" in o.css_classes for o in view._layout.objects)  # nothing that starts a model
    assert "Worst tokens" in view._worst.object and "data-click=\"step\"" in view._steps.object
    runs = queries.runs(store)
    plain = runs[~runs["run_id"].isin(store.df("SELECT DISTINCT run_id FROM rollouts WHERE train_engine IS NOT NULL")
                                      ["run_id"])]["run_id"].iloc[0]
    state.table_filter = RolloutFilter(run_id=plain)  # the arithmetic world: sampled, never recomputed
    assert "No recomputed log-probs" in view._summary.object and "Rescore" in view._summary.object
    assert not view._body.visible
