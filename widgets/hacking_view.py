"""Reward hacking diagnostics: is a reward source paying for length, which component drives
it, and where do two sources (two rule versions, or a rule and a reward model) disagree.

It opens on the two most recent versions that scored the same rollouts (B the newer), or says
to pick two when there is no such pair; the plots and lists wrap to the page's width.
"""
from __future__ import annotations

import numpy as np
import panel as pn
import param

from studio.rewards import diagnostics, rules
from studio.store import StoreError

from .base.clickable import ClickableHTML
from .base.lazy import LazyView
from .base.plots import holoviews, plot_opts
from .base.state import StudioState
from .base.style import CSS, banner, esc
from .rule_diff import DIFF_CSS
from .rule_panel import pair_labels, pick_two

MATRIX_CSS = """
table.matrix { border-collapse:collapse; font-size:13px; margin:4px 0 8px 0; }
table.matrix th, table.matrix td { border:1px solid #dee2e6; padding:4px 12px; text-align:center; }
table.matrix th { background:#f8f9fa; font-weight:600; }
table.matrix td.agree { background:#ebfbee; } table.matrix td.fp { background:#fff5f5; } table.matrix td.fn { background:#fff4e6; }
"""


def matrix_html(d: diagnostics.Disagreement, limit: int = 15) -> str:
    """A and B thresholded: how often they agree, the pass / fail matrix, and the first ``limit``
    rollouts each way they disagree (a click opens one)."""
    m = d.matrix
    total = int(m.to_numpy().sum())
    if not total:
        return (f'<div class="empty pick-two">{esc(d.a)} and {esc(d.b)} scored no rollout in common: pick two '
                'versions that scored the same rollouts.</div>')
    agree = int(m.loc["A pass", "B pass"] + m.loc["A fail", "B fail"])
    head = (f'<div class="meta-line"><span>A = <b>{esc(d.a)}</b></span><span>B = <b>{esc(d.b)}</b></span>'
            f'<span>agree on <b>{agree / total:.1%}</b> of {total:,}</span></div>')
    table = (f'<table class="matrix"><tr><th></th><th>B pass</th><th>B fail</th></tr>'
             f'<tr><th>A pass</th><td class="agree">{m.loc["A pass", "B pass"]:,}</td>'
             f'<td class="fn">{m.loc["A pass", "B fail"]:,}<br><small>false negatives</small></td></tr>'
             f'<tr><th>A fail</th><td class="fp">{m.loc["A fail", "B pass"]:,}<br><small>false positives</small></td>'
             f'<td class="agree">{m.loc["A fail", "B fail"]:,}</td></tr></table>')

    def rows(df, title):
        if df.empty:
            return ""
        body = "".join(f'<tr class="diff-row" data-click="open" data-value="{esc(r.rollout_id)}">'
                       f'<td class="mono" title="{esc(r.prompt)}">{esc(r.prompt)}</td>'
                       f'<td class="mono" title="{esc(r.completion)}">{esc(r.completion)}</td>'
                       f'<td>{r.reward_a:.3f}</td><td>{r.reward_b:.3f}</td></tr>' for r in df.head(limit).itertuples())
        return (f'<div class="meta-line"><b>{esc(title)}</b> ({len(df):,}, first {min(limit, len(df))})</div>'
                f'<table class="diff fit"><colgroup><col style="width:40%"><col style="width:40%"><col style="width:10%">'
                f'<col style="width:10%"></colgroup><tr><th>prompt</th><th>completion</th><th>A</th><th>B</th></tr>'
                f'{body}</table>')
    return head + table + rows(d.false_positives, "B passes, A fails") + rows(d.false_negatives, "B fails, A passes")


class HackingView(LazyView):
    """Length correlation, component dominance and a disagreement matrix."""

    state = param.ClassSelector(class_=StudioState, doc="Shared studio state.")
    source_a = param.Selector(default=None, objects=[], allow_None=True, doc="Reference reward source (A).")
    source_b = param.Selector(default=None, objects=[], allow_None=True, doc="Reward source under suspicion (B).")
    threshold_a = param.Number(default=0.5, doc="A passes a rollout at or above this reward.")
    threshold_b = param.Number(default=0.5, doc="B passes a rollout at or above this reward.")

    def __init__(self, **params):
        super().__init__(**params)
        self._ids: dict[str, str] = {}
        self._known: set[str] = set()
        self._length = pn.pane.HoloViews(None, sizing_mode="stretch_width", height=260)
        self._dominance = pn.pane.HoloViews(None, sizing_mode="stretch_width", height=260)
        self._corr = pn.pane.HTML("", stylesheets=[CSS, DIFF_CSS], sizing_mode="stretch_width", css_classes=["length-corr"])
        self._matrix = ClickableHTML(object="", stylesheets=[CSS, DIFF_CSS, MATRIX_CSS], sizing_mode="stretch_width",
                                     css_classes=["disagreement"])
        self._matrix.on_click(self._on_click)
        self._note = pn.pane.HTML("", stylesheets=[CSS], sizing_mode="stretch_width", css_classes=["hacking-note"])
        controls = pn.FlexBox(
            pn.widgets.Select.from_param(self.param.source_a, name="Source A (reference)", width=280,
                                         css_classes=["source-a"]),
            pn.widgets.FloatInput.from_param(self.param.threshold_a, name="A passes at ≥", width=110),
            pn.widgets.Select.from_param(self.param.source_b, name="Source B", width=280, css_classes=["source-b"]),
            pn.widgets.FloatInput.from_param(self.param.threshold_b, name="B passes at ≥", width=110),
            flex_wrap="wrap", sizing_mode="stretch_width")
        # side by side while each keeps a readable width, else wrapped onto the next line
        self._layout = pn.Column(
            controls, self._note,
            pn.FlexBox(pn.Column(self._length, self._corr, styles={"flex": "1 1 380px", "min-width": "0"}),
                       pn.Column(self._dominance, styles={"flex": "1 1 300px", "min-width": "0"}),
                       pn.Column(self._matrix, styles={"flex": "1 1 440px", "min-width": "0"}),
                       flex_wrap="wrap", sizing_mode="stretch_width"),
            sizing_mode="stretch_width")
        self._refresh()

    @param.depends("state.refresh", watch=True)
    def _refresh(self) -> None:
        """Re-read the versions. A and B keep the versions picked; when versions were applied since
        the last look, or none is picked, they open on the most recent pair that scored the same
        rollouts (:func:`studio.rewards.rules.default_pair`)."""
        picked = self._ids.get(self.source_a), self._ids.get(self.source_b)
        vs = rules.versions(self.state.store)
        self._ids = {f"{v.rule_version_id} ({v.rollouts})": v.rule_version_id for v in vs.itertuples()}
        fresh = bool(self._known) and not set(self._ids.values()) <= self._known  # applied since the last look
        self._known = set(self._ids.values())
        a, b = pair_labels(self._ids, *((None, None) if fresh else picked), self.state.store)
        with param.parameterized.batch_call_watchers(self):
            self.param.source_a.objects = list(self._ids)
            self.param.source_b.objects = list(self._ids)
            self.source_a, self.source_b = a, b
        self._render()

    @param.depends("source_a", "source_b", "threshold_a", "threshold_b", watch=True)
    def _render(self) -> None:
        if self._defer():  # a hidden tab: drawn when it is opened
            return
        a, b = self._ids.get(self.source_a), self._ids.get(self.source_b)
        if not b:
            self._note.object, self._matrix.object = "", '<div class="empty">No scored rollouts yet.</div>'
            return
        try:
            tot = diagnostics.totals(self.state.store, b)
            lc = diagnostics.length_correlation(self.state.store)
            dom = diagnostics.component_dominance(self.state.store, b)
            dis = (diagnostics.disagreement(self.state.store, a, b, self.threshold_a, self.threshold_b)
                   if a and a != b else None)
        except StoreError as exc:
            self._note.object, self._matrix.object = "", banner("error", str(exc))
            return
        hv = holoviews()
        r = lc.set_index("rule_version_id")["r"].get(b, np.nan)
        self._length.object = hv.Scatter(tot, "n_tokens", "reward").opts(
            **plot_opts(title=f"B: reward vs length (r = {r:.2f})", xlabel="completion tokens", ylabel="reward",
                    size=4, alpha=0.35, color="#3b5bdb", height=250))
        self._corr.object = ('<table class="diff fit"><colgroup><col style="width:50%"><col style="width:25%">'
                             '<col style="width:25%"></colgroup>'
                             '<tr><th>version</th><th>r(reward, length)</th><th>per 10 tokens</th></tr>'
                             + "".join(f'<tr><td class="mono" title="{esc(x.rule_version_id)}">'
                                       f'{esc(x.rule_version_id)}</td><td>{x.r:+.2f}</td>'
                                       f'<td>{x.per_10_tokens:+.3f}</td></tr>' for x in lc.fillna(0).itertuples())
                             + "</table>")
        self._dominance.object = (hv.Bars(dom, "component", "share").opts(
            **plot_opts(title="B: share of reward variance", color="#3b5bdb", height=250, ylabel="share of variance"))
            if len(dom) and dom["share"].notna().any() else None)
        # under the controls, where it is seen first: why there is no disagreement matrix
        self._note.object = "" if dis is not None else pick_two(self._ids, self.state.store)
        self._matrix.object = matrix_html(dis) if dis is not None else ""

    def _on_click(self, kind: str, value: str) -> None:
        if kind == "open" and value:
            self.state.open_rollout(value)

    def __panel__(self):
        return self._layout
