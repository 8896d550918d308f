"""Entropy views: a run's entropy landscape, and where two policies' entropies differ.

The landscape shows where a run's uncertainty sits: the histogram of token entropies with
the fork threshold and the share of tokens at or above it, mean entropy by position and by
reasoning step, and forks per rollout for correct versus incorrect completions.

The comparison teacher-forces the shown rollouts through a second policy (in the worker,
``studio.runs.compare.score_with``) and lists the tokens whose entropy changed most: with an
earlier checkpoint as the second policy, that is where training moved the model.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import panel as pn
import param

from sample_data import EARLY_POLICY_DIR
from studio import queries
from studio.queries import forks, lookups
from studio.runs.compare import score_with
from studio.runs.registry import known_policies
from studio.store import StoreError

from .base.clickable import ClickableHTML
from .base.jobs import Job
from .base.lazy import LazyView
from .base.pickers import run_choices
from .base.plots import BAD_COLOR, ENTROPY_COLOR, OK_COLOR, THRESHOLD_COLOR, holoviews, plot_opts
from .base.state import StudioState
from .base.style import CSS, SCALES, banner, chip, esc
from .token_text import VISIBLE_WS, num, token_display

COMPARE_CSS = """
table.dh { border-collapse:collapse; width:100%; font-size:12px; }
table.dh th { text-align:left; color:#868e96; font-weight:600; font-size:11px; padding:2px 6px; }
table.dh td { padding:2px 6px; border-top:1px solid #f1f3f5; }
table.dh tr.dh-row { cursor:pointer; } table.dh tr.dh-row:hover { background:#edf2ff; }
td.ctx { font-family:'DejaVu Sans Mono', monospace; color:#868e96; white-space:pre; }
td.ctx b { color:#212529; background:#fff3bf; padding:0 2px; border-radius:2px; }
"""


def landscape_plots(ls: forks.Landscape):
    """Four HoloViews plots of a :class:`studio.queries.forks.Landscape`."""
    hv = holoviews()
    thr = ls.threshold.value
    counts = np.where(ls.hist_counts > 0, ls.hist_counts, np.nan)  # an empty bin is no bar (log axis)
    top = float(np.nanmax(counts)) if np.isfinite(counts).any() else 1.0
    hist = hv.Histogram((ls.hist_edges, counts), kdims=["entropy (nats)"], vdims=["tokens"]).opts(
        # the log axis starts under one token: bars grow from there, not from 0 (which a log axis cannot show)
        **plot_opts(color=ENTROPY_COLOR, line_color="white", logy=True, ylim=(0.5, top * 2),
                    title="Token entropies (log count)"))
    if thr is not None:
        hist = hist * hv.VLine(thr).opts(color=THRESHOLD_COLOR, line_dash="dashed", line_width=2)
    pos = hv.Curve(ls.by_pos, "pos", "mean_entropy").opts(
        **plot_opts(color=ENTROPY_COLOR, line_width=2, title="Mean entropy by token position", ylabel="nats"))
    steps = ls.by_step.assign(step=[f"step {int(i) + 1}" for i in ls.by_step["step_idx"]])
    step = hv.Bars(steps, "step", ["mean_entropy", "n"]).opts(
        **plot_opts(color=ENTROPY_COLOR, title="Mean entropy by reasoning step", ylabel="nats"))
    per = ls.per_rollout
    summ = (per.assign(outcome=np.where(per["correct"], "correct", "incorrect"))
            .groupby("outcome").agg(mean_forks=("forks", "mean"), rollouts=("forks", "size")).reset_index())
    forks_bar = hv.Bars(summ, "outcome", ["mean_forks", "rollouts"]).opts(
        **plot_opts(color="outcome", cmap={"correct": OK_COLOR, "incorrect": BAD_COLOR}, show_legend=False,
                title="Forks per rollout", ylabel="mean forks"))
    return hist, pos, step, forks_bar


def landscape_summary(ls: forks.Landscape) -> str:
    thr = ls.threshold
    if thr.value is None or not ls.n_tokens:
        return '<div class="empty">This run has no token entropies.</div>'
    per = ls.per_rollout
    ok, bad = per[per["correct"]], per[~per["correct"]]
    mass = "" if ls.mass_above is None else f'<span>they carry <b>{ls.mass_above:.0%}</b> of all entropy</span>'
    return (f'<div class="meta-line"><span><b>{thr.share:.1%}</b> of {thr.n_tokens:,} tokens are forks '
            f'(entropy ≥ <b>{thr.value:.4g}</b> nats: {esc(thr.rule.describe())})</span>{mass}'
            f'<span>forks per rollout: correct <b class="ok">{ok["forks"].mean():.2f}</b> ({len(ok)}), '
            f'incorrect <b class="bad">{bad["forks"].mean() if len(bad) else float("nan"):.2f}</b> ({len(bad)})</span></div>')


class EntropyLandscape(LazyView):
    """A run's entropy landscape under the session's fork rule."""

    state = param.ClassSelector(class_=StudioState, doc="Shared studio state.")
    run = param.Selector(default=None, objects=[], allow_None=True, doc="The run to describe.")

    def __init__(self, **params):
        super().__init__(**params)
        self._run_ids: dict[str, str] = {}
        self._summary = pn.pane.HTML("", stylesheets=[CSS], sizing_mode="stretch_width", css_classes=["landscape-summary"])
        # the panes are made once and given new plots: a pane created inside a callback can
        # get its stylesheet URLs pointed at a CDN by Panel (no document yet), and the
        # studio must not request anything from the network
        self._panes = [pn.pane.HoloViews(None, sizing_mode="stretch_width", min_height=220) for _ in range(4)]
        self._plots = pn.GridBox(*self._panes, ncols=4, sizing_mode="stretch_width", css_classes=["landscape-plots"])
        picker = pn.widgets.Select.from_param(self.param.run, name="Run", width=420)
        self._layout = pn.Column(picker, self._summary, self._plots, sizing_mode="stretch_width")
        self._refresh_runs()

    @param.depends("state.refresh", watch=True)
    def _refresh_runs(self) -> None:
        self._run_ids = run_choices(self.state.store)
        runs = queries.runs(self.state.store)
        labels = list(self._run_ids)
        current = self.run
        self.param.run.objects = labels
        if current in labels:
            self._render()
        else:
            # the largest run is the most telling default (the shipped sample run at first)
            biggest = max(runs.itertuples(), key=lambda r: r.rollouts, default=None)
            self.run = next((lab for lab, rid in self._run_ids.items() if biggest and rid == biggest.run_id), None)

    @param.depends("run", "state.fork_mode", "state.fork_q", "state.fork_min", "state.fork_abs", watch=True)
    def _render(self) -> None:
        if self._defer():  # a hidden tab: drawn when it is opened
            return
        run_id = self._run_ids.get(self.run)
        if not run_id:
            self._summary.object = '<div class="empty">No runs with rollouts yet.</div>'
            for pane in self._panes:
                pane.object = None
            return
        try:
            ls = forks.landscape(self.state.store, run_id, self.state.fork_rule())
        except StoreError as exc:
            self._summary.object = banner("error", str(exc))
            return
        self._summary.object = landscape_summary(ls)
        for pane, plot in zip(self._panes, landscape_plots(ls)):
            pane.object = plot

    def __panel__(self):
        return self._layout


def distinct_changes(df: pd.DataFrame, n: int = 20) -> pd.DataFrame:
    """The ``n`` largest entropy changes, one row per token in its context: a group's rollouts
    share their first tokens, so the same token at the same place with the same change would
    otherwise fill the table; ``rollouts`` counts how many rollouts have it."""
    if df.empty:
        return df.assign(rollouts=pd.Series(dtype=int))
    key = ["pos", "context", "token_text", df["delta"].round(4).rename("d4")]
    first = df.groupby(key, sort=False, dropna=False)
    out = first.head(1).copy()
    out["rollouts"] = first["rollout_id"].transform("size").loc[out.index].to_numpy()
    return out.head(n)


def changes_html(df: pd.DataFrame) -> str:
    """Tokens with the largest entropy change (:func:`distinct_changes`) as a clickable table
    (click: open the first rollout with it at that token)."""
    if df.empty:
        return '<div class="empty">No re-scored tokens in this scope yet.</div>'
    rows = []
    for r in df.itertuples(index=False):
        tok = esc(token_display(r.token_text)[0].translate(VISIBLE_WS))
        ctx = esc((r.context if isinstance(r.context, str) else "")[-12:])  # the first token has none
        rows.append(f'<tr class="dh-row" data-click="token" data-value="{esc(r.rollout_id)}:{int(r.pos)}">'
                    f'<td class="ctx">…{ctx}<b>{tok}</b></td><td>{int(r.pos)}</td><td>{int(r.rollouts)}</td>'
                    f'<td>{num(r.entropy_a)}</td><td>{num(r.entropy_b)}</td>'
                    f'<td>{chip(r.delta, SCALES["advantage"])}</td><td>{num(np.exp(r.logprob_a))} → {num(np.exp(r.logprob_b))}</td></tr>')
    return ('<table class="dh"><tr><th>token in context</th><th>position</th><th>rollouts</th>'
            '<th>entropy A</th><th>entropy B</th>'
            '<th>change B − A</th><th>p(token) A → B</th></tr>' + "".join(rows) + "</table>")


class PolicyCompare(LazyView):
    """Teacher-force stored rollouts through a second policy; show where entropy moved."""

    state = param.ClassSelector(class_=StudioState, doc="Shared studio state.")
    policy = param.String(default=str(EARLY_POLICY_DIR) if (EARLY_POLICY_DIR / "config.json").exists() else "",
                          doc="Folder of the second policy (B). The stored statistics are policy A's.")
    scope = param.Selector(default="selected group", objects=["selected group", "selected rollout's run"],
                           doc="Which rollouts to compare.")

    def __init__(self, can_run: bool = True, **params):
        super().__init__(**params)
        self._can_run = can_run
        self._version: str | None = None
        self._go = pn.widgets.Button(name="Score with policy B", color="primary", width=170,
                                     css_classes=["compare-button"], disabled=not can_run)
        if can_run:  # browse-only sessions get no callback that could start a model
            self._go.on_click(self._on_score)
        self._job = Job(on_running=lambda on: setattr(self._go, "disabled", on or not self._can_run))
        self._status = pn.pane.HTML("", stylesheets=[CSS], sizing_mode="stretch_width", css_classes=["compare-status"])
        self._summary = pn.pane.HTML("", stylesheets=[CSS], sizing_mode="stretch_width")
        self._plot = pn.pane.HoloViews(None, width=400, height=310)  # made once: see EntropyLandscape
        self._table = ClickableHTML(object="", stylesheets=[CSS, COMPARE_CSS], sizing_mode="stretch_width",
                                    css_classes=["compare-table"])
        self._table.on_click(self._on_click)
        self._pick = pn.widgets.Select(name="Policy B", options={}, width=260, css_classes=["compare-pick"])
        self._policies_at: int | None = None
        self._pick.param.watch(lambda e: e.new and self.param.update(policy=e.new), "value")
        controls = pn.FlexBox(
            self._pick,
            pn.widgets.TextInput.from_param(self.param.policy, name="or any policy folder", width=340,
                                            css_classes=["compare-policy"]),
            pn.widgets.Select.from_param(self.param.scope, name="Rollouts", width=200),
            pn.Column(pn.Spacer(height=18), self._go, margin=0),
            flex_wrap="wrap", align_items="flex-start", sizing_mode="stretch_width",
        )
        note = pn.pane.HTML('<div class="meta-line"><span>A = the policy that sampled each rollout (stored statistics); '
                            'B = the folder above, teacher-forced on the same tokens. The shipped early checkpoint '
                            '(1,200 training steps) against the final sample policy shows where training moved the '
                            'model.</span></div>', stylesheets=[CSS], sizing_mode="stretch_width")
        self._layout = pn.Column(note, controls, self._status, self._summary,
                                 pn.Row(self._plot, self._table, sizing_mode="stretch_width"),
                                 sizing_mode="stretch_width")

    def _rollout_ids(self) -> list[str]:
        st = self.state
        if self.scope == "selected group":
            if not st.group_id:
                return []
            return lookups.rollouts_of_group(st.store, st.group_id)
        if not st.rollout_id:
            return []
        return lookups.rollouts_of_same_run(st.store, st.rollout_id)

    async def _on_score(self, event) -> None:
        if not self._can_run:
            return
        ids = self._rollout_ids()
        if not ids:
            self._status.object = banner("warn", "Select a rollout in the table first (its group or run is compared).")
            return
        folder = Path(self.policy.strip()).expanduser()
        with self._job.claim():
            self._status.object = banner("info", f"scoring {len(ids)} rollouts with {folder.name}…")
            try:
                self._version = await score_with(self.state.store, folder, ids)
            except Exception as exc:  # missing folder, unloadable model, dead worker: say which
                self._status.object = banner("error", f"could not score with {folder}: {exc}")
                return
        self._status.object = banner("info", f"{len(ids)} rollouts scored by {self._version}.")
        self._render()

    def _sync_policies(self) -> None:
        """The picker offers the bundled policies and every mini-run checkpoint in the store."""
        opts = {"(a folder typed on the right)": ""} | known_policies(self.state.store)
        self._pick.options = opts
        self._pick.value = self.policy if self.policy in opts.values() else ""

    @param.depends("state.group_id", "state.rollout_id", "state.refresh", "scope", watch=True)
    def _render(self) -> None:
        if self._defer():  # a hidden tab: drawn when it is opened
            return
        if self._policies_at != self.state.refresh:  # new checkpoints only come with a refresh
            self._policies_at = self.state.refresh
            self._sync_policies()
        if self._version is None:
            versions = forks.scored_versions(self.state.store)
            if not versions:
                self._summary.object = '<div class="empty">Pick policy B and score: nothing compared yet.</div>'
                return
            self._version = versions[-1]
        ids = self._rollout_ids()
        try:
            df = forks.entropy_changes(self.state.store, self._version, rollout_ids=ids, limit=100_000)
        except StoreError as exc:
            self._summary.object = banner("error", str(exc))
            return
        if df.empty:
            self._summary.object = (f'<div class="empty">These rollouts are not scored by {esc(self._version)} yet: '
                                    'press "Score with policy B".</div>')
            self._table.object, self._plot.object = "", None
            return
        big = (df["delta"].abs() >= 0.1).mean()
        self._summary.object = (
            f'<div class="meta-line"><span>B = <b>{esc(self._version)}</b></span><span>{len(df):,} tokens of '
            f'{df["rollout_id"].nunique()} rollouts</span><span>mean entropy A <b>{df["entropy_a"].mean():.3f}</b> → '
            f'B <b>{df["entropy_b"].mean():.3f}</b> nats</span><span><b>{big:.1%}</b> of tokens moved by ≥ 0.1 nats</span></div>')
        hv = holoviews()
        lim = float(max(df["entropy_a"].max(), df["entropy_b"].max(), 0.1))
        sc = hv.Scatter(df, ("entropy_a", "entropy A"), [("entropy_b", "entropy B"), ("delta", "change B − A"),
                                                        ("token_text", "token"), ("pos", "position")]).opts(
            **plot_opts(color="delta", cmap=list(SCALES["advantage"].stops), clim=(-2, 2), size=5, alpha=0.7,
                    xlabel="entropy A (stored), nats", ylabel="entropy B, nats", title="Per-token entropy, A vs B",
                    colorbar=True, height=300, width=380, responsive=False))
        diag = hv.Curve([(0, 0), (lim, lim)]).opts(color="#adb5bd", line_dash="dotted")
        self._plot.object = sc * diag
        self._table.object = changes_html(distinct_changes(df))

    def _on_click(self, kind: str, value: str) -> None:
        if kind != "token" or ":" not in value:
            return
        rid, pos = value.rsplit(":", 1)
        if pos.isdigit():
            self.state.open_rollout(rid, int(pos))

    def __panel__(self):
        return self._layout
