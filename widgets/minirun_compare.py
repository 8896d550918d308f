"""Mini-runs side by side: the overlaid runs' summary table and legend, and :class:`RunComparison`,
two picked runs compared (e.g. with and without a mismatch correction).

:class:`RunComparison` shows what differs in the two runs' settings, their curves overlaid — reward,
accuracy and the training-inference mismatch (``mismatch/*``, ``is/*``: the sampler's log-probs
against the trainer's, :mod:`studio.runs.training.correction`) — and their held-out results beside
each other (each run's last checkpoint, evaluated once and stored as its ``heldout/*`` metrics).
"""
from __future__ import annotations

import json

import pandas as pd
import panel as pn
import param

from studio.queries import lookups
from studio.runs import minirun
from studio.runs.training import TrainConfigError

from .base.jobs import Job, failure
from .base.lazy import LazyView
from .base.plots import holoviews, plot_opts, step_ticks
from .base.state import StudioState
from .base.style import CSS, banner, esc

LABELS = {"reward_mean": "reward (mean)", "accuracy": "accuracy", "entropy": "entropy (nats/token)",
          "kl": "KL to reference", "clip_frac": "clipped share", "completion_len": "completion length",
          "all_equal_share": "all-equal groups", "grad_norm": "grad norm", "step_s": "seconds per step",
          "agent/turns": "turns per trajectory", "agent/tool_calls": "tool calls per trajectory",
          "agent/tool_errors": "failed tool calls per trajectory",
          "mismatch/k3": "mismatch k3 (KL behaviour ‖ train)", "mismatch/abs_delta_mean": "mean |Δ| log-prob",
          "mismatch/abs_delta_max": "max |Δ| log-prob", "is/clipped_share": "IS clipped share (TIS)",
          "is/masked_share": "IS masked share (MIS, ICEPOP)", "is/weight_mean": "mean IS weight"}
SHORT = {"reward_mean": "reward", "entropy": "entropy", "kl": "KL", "completion_len": "length",
         "all_equal_share": "all-equal", "step_s": "s / step", "agent/turns": "turns",
         "agent/tool_calls": "tool calls", "agent/tool_errors": "tool fails"}
RUN_CSS = """
table.diff { border-collapse:collapse; width:100%; font-size:12px; font-variant-numeric:tabular-nums; }
table.diff th { text-align:left; color:#868e96; font-weight:600; font-size:11px; padding:2px 6px; }
table.diff td { padding:2px 6px; border-top:1px solid #f1f3f5; white-space:nowrap; }
table.diff td.run { font-weight:600; }
.swatch { display:inline-block; width:10px; height:10px; border-radius:2px; margin-right:6px; vertical-align:-1px; }
.delta { color:#868e96; font-size:11px; }
.muted { color:#868e96; font-weight:400; }
.scroll-x { overflow-x:auto; max-width:100%; }
"""
PALETTE = ("#3b5bdb", "#e8590c", "#2b8a3e", "#c2255c", "#5f3dc4", "#0b7285", "#d9480f", "#495057")
# the comparison's curves, those the two runs have (a run without a bfloat16 sampler or a correction has fewer)
COMPARED = ("reward_mean", "accuracy", "mismatch/k3", "mismatch/abs_delta_mean", "mismatch/abs_delta_max",
            "is/clipped_share", "is/masked_share", "is/weight_mean")
# the settings named first in the comparison's settings line (then any other that differs)
KEY_SETTINGS = ("correction", "is_cap", "is_low", "sampler_precision", "overlap")
# the comparison's plot titles (short: four plots share a row of the tab)
TITLES = {"reward_mean": "reward", "accuracy": "accuracy", "mismatch/k3": "mismatch k3",
          "mismatch/abs_delta_mean": "mean |Δ|", "mismatch/abs_delta_max": "max |Δ|", "is/clipped_share": "IS clipped",
          "is/masked_share": "IS masked", "is/weight_mean": "IS weight"}
HELDOUT_FIGURES = ("accuracy", "pass@4", "greedy_accuracy", "mean_length", "entropy")
PLOT_H = 180


def summary_html(df: pd.DataFrame, colors: dict[str, str]) -> str:
    """The overlaid runs side by side: settings, then each metric's mean over the last steps
    with its change since the first ones (``minirun.summary``; the swatch is the run's
    curve colour)."""
    if df.empty:
        return ""
    cols = [m for m in minirun.SUMMARY if df[m].notna().any()]
    head = "".join(f'<th title="{esc(LABELS.get(m, m))}">{esc(SHORT.get(m, m))}</th>' for m in cols)
    rows = []
    for r in df.to_dict("records"):
        cells = []
        for m in cols:
            v, v0 = r[m], r[f"{m}_start"]
            if v != v:
                cells.append("<td>–</td>")
                continue
            delta = "" if m == "step_s" or v0 != v0 else f' <span class="delta">{v - v0:+.3f}</span>'
            cells.append(f"<td>{v:.3f}{delta}</td>")
        sw = f'<span class="swatch" style="background:{colors.get(r["run_id"], "#868e96")}"></span>'
        rows.append(f'<tr class="summary-row"><td class="run">{sw}{esc(r["name"])} <span class="muted">· '
                    f'{esc(r["run_id"][-6:])}</span></td><td>{esc(r["status"])}</td><td>{r["steps"]}/{r["total"]}</td>'
                    f'<td>{esc(r["estimator"] or "–")}</td><td>{r["learning_rate"] or 0:g}</td>'
                    f'<td class="muted">{esc((r["reward"] or "–")[:28])}</td>{"".join(cells)}</tr>')
    return ('<div class="meta-line"><b>runs side by side</b><span>each metric: mean of the last 5 steps (of the '
            'last half in shorter runs), and its change since the first ones</span></div>'
            # wider than the tab with many metrics: it scrolls sideways in its box, the page does not
            '<div class="scroll-x"><table class="diff summary-table"><tr><th>run</th><th>status</th>'
            f'<th>steps</th><th>estimator</th><th>lr</th><th>reward</th>{head}</tr>{"".join(rows)}</table></div>')


def legend_html(runs: list[tuple[str, str, str]]) -> str:
    """The overlaid runs' colours, named once above their curves (``runs``: name, run id, colour)."""
    items = "".join(f'<span><span class="swatch" style="background:{color}"></span>{esc(name)} '
                    f'<span class="muted">· {esc(rid[-6:])}</span></span>' for name, rid, color in runs)
    return f'<div class="meta-line run-legend">{items}</div>'


def settings_diff(a: dict, b: dict) -> list[tuple[str, object, object]]:
    """The settings two run configs differ in: ``(name, a's, b's)``, the correction's first."""
    names = [k for k in KEY_SETTINGS if k in a or k in b] + sorted((a.keys() | b.keys()) - set(KEY_SETTINGS))
    return [(k, a.get(k, "–"), b.get(k, "–")) for k in names if a.get(k) != b.get(k)]


def heldout_html(df: pd.DataFrame, ids: tuple[str, str], names: dict[str, str]) -> str:
    """Both runs' newest held-out figures beside each other, with B − A (``minirun.heldout``'s rows)."""
    vals = {(r.run_id, r.figure): (r.value, r.train_step) for r in df.itertuples()}
    a, b = ids
    figs = [f for f in HELDOUT_FIGURES if (a, f) in vals or (b, f) in vals]
    if not figs:
        return ('<div class="empty">No held-out results yet: evaluate both runs\' last checkpoints '
                '(the figures are stored with the runs).</div>')

    def cell(rid, f):
        return f"{vals[(rid, f)][0]:.3f}" if (rid, f) in vals else "–"

    def diff(f):
        return f"<b>{vals[(b, f)][0] - vals[(a, f)][0]:+.3f}</b>" if (a, f) in vals and (b, f) in vals else "–"

    step = {rid: next((v[1] for (r, _), v in vals.items() if r == rid), None) for rid in ids}
    head = "".join(f'<th>{k}: {esc(names.get(rid, rid))} <span class="muted">(step {step[rid] if step[rid] is not None else "–"})'
                   f"</span></th>" for k, rid in zip("AB", ids, strict=True))
    rows = "".join(f"<tr><td>{esc(f)}</td><td>{cell(a, f)}</td><td>{cell(b, f)}</td><td>{diff(f)}</td></tr>"
                   for f in figs)
    return f'<table class="diff compare-heldout-table"><tr><th>held out</th>{head}<th>B − A</th></tr>{rows}</table>'


class RunComparison(LazyView):
    """Two mini-runs compared: settings that differ, curves overlaid, held-out results beside each other."""

    state = param.ClassSelector(class_=StudioState, doc="Shared studio state.")
    run_a = param.Selector(default=None, objects=[], allow_None=True, doc="Run A (e.g. without correction).")
    run_b = param.Selector(default=None, objects=[], allow_None=True, doc="Run B (e.g. with correction).")

    def __init__(self, can_run: bool = True, **params):
        super().__init__(**params)
        self._ids: dict[str, str] = {}
        self._can_run = can_run
        self._diff = pn.pane.HTML("", stylesheets=[CSS, RUN_CSS], sizing_mode="stretch_width",
                                  css_classes=["compare-settings"])
        self._curves = pn.pane.HoloViews(None, sizing_mode="stretch_width", height=PLOT_H + 8,
                                         css_classes=["compare-curves"])
        self._heldout = pn.pane.HTML("", stylesheets=[CSS, RUN_CSS], sizing_mode="stretch_width",
                                     css_classes=["compare-heldout"])
        self._eval = pn.widgets.Button(name="Evaluate both runs' last checkpoints", width=280, disabled=not can_run,
                                       css_classes=["compare-eval"])
        self._eval.on_click(self._on_eval)
        self._job = Job(on_running=lambda on: setattr(self._eval, "disabled", on or not self._can_run))
        pickers = pn.FlexBox(pn.widgets.Select.from_param(self.param.run_a, name="Run A", width=270,
                                                          css_classes=["compare-a"]),
                             pn.widgets.Select.from_param(self.param.run_b, name="Run B", width=270,
                                                          css_classes=["compare-b"]),
                             flex_wrap="wrap", sizing_mode="stretch_width")
        self._layout = pn.Column(
            pn.pane.HTML('<div class="meta-line"><b>compare two runs</b><span>e.g. without and with a mismatch '
                         'correction: their curves overlaid (A blue, B orange) and their held-out results</span></div>',
                         stylesheets=[CSS]),
            pickers, self._diff, self._curves, pn.Row(self._eval), self._heldout,
            sizing_mode="stretch_width", css_classes=["run-compare"])

    def sync(self, run_ids: dict[str, str]) -> None:
        """The runs to pick from (label -> run id, newest first); with none picked yet, the two newest, the
        one without a correction as A."""
        self._ids = dict(run_ids)
        labels = list(run_ids)
        with param.parameterized.batch_call_watchers(self):
            self.param.run_a.objects = labels
            self.param.run_b.objects = labels
            if self.run_a not in labels or self.run_b not in labels:
                two = labels[:2]
                two.sort(key=lambda lab: self._config(run_ids[lab]).get("correction", "none") != "none")
                self.run_a, self.run_b = (two + [None, None])[:2]

    def _config(self, run_id: str) -> dict:
        raw = lookups.run_state(self.state.store, run_id)
        try:
            return json.loads(raw["config"]) if raw is not None else {}
        except (TypeError, ValueError):
            return {}

    def refresh(self) -> None:
        """Draw again (a live run stored a step)."""
        self._render()

    def picked(self) -> tuple[str, str] | None:
        a, b = self._ids.get(self.run_a), self._ids.get(self.run_b)
        return (a, b) if a and b else None

    @param.depends("run_a", "run_b", watch=True)
    def _render(self) -> None:
        if self._defer():
            return
        ids = self.picked()
        if ids is None:
            self._diff.object = '<div class="empty">Pick two mini-runs to compare.</div>'
            self._curves.object, self._heldout.object = None, ""
            return
        names = {rid: lab.rsplit(" · ", 1)[0] for lab, rid in self._ids.items()}
        diff = settings_diff(self._config(ids[0]), self._config(ids[1]))
        self._diff.object = (
            '<div class="meta-line compare-diff"><span>settings that differ:</span>'
            + ("".join(f"<span><b>{esc(k)}</b> {esc(str(va))} → {esc(str(vb))}</span>" for k, va, vb in diff)
               if diff else "<span>none</span>") + "</div>")
        self._curves.object = self._plots(minirun.metrics(self.state.store, list(ids)), ids)
        self._heldout.object = heldout_html(minirun.heldout(self.state.store, list(ids)), ids, names)

    def _plots(self, df: pd.DataFrame, ids: tuple[str, str]):
        hv = holoviews()
        step = ("train_step", "training step")
        plots = []
        for m in COMPARED:
            sub = df[df["metric"] == m]
            layers = [hv.Curve(sub[sub["run_id"] == r], step, ("value", LABELS[m]), label=k).opts(color=c, line_width=2)
                      for k, r, c in zip("AB", ids, PALETTE, strict=False) if (sub["run_id"] == r).any()]
            if layers:
                plots.append(hv.Overlay(layers).opts(**plot_opts(title=TITLES[m], xlabel="training step", ylabel="",
                                                                 height=PLOT_H, show_legend=False, **step_ticks())))
        if not plots:
            return None
        self._curves.height = (PLOT_H + 14) * -(-len(plots) // 4) + 4
        return hv.Layout(plots).cols(4).opts(shared_axes=False)

    async def _on_eval(self, event=None) -> None:
        ids = self.picked()
        if ids is None:
            return
        with self._job.claim():
            self._heldout.object = banner("info", "evaluating both runs' last checkpoints on the held-out prompts…")
            try:
                for rid in ids:
                    await minirun.evaluate_run(self.state.store, rid)
            except TrainConfigError as exc:
                self._heldout.object = banner("error", str(exc))
                return
            except Exception as exc:  # a deleted or broken checkpoint folder: say which
                self._heldout.object = banner("error", failure("evaluation", exc))
                return
        self._render()

    def __panel__(self):
        return self._layout
