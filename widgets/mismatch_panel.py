"""The Mismatch tab: where the training–inference mismatch of the table's scope sits, token by token.

For the rollouts the table's filter keeps (its run, group, step...), against the sidebar's source
of recomputed log-probs and under its correction, the tab shows Δ = log π_train − log π_behaviour:

- its distribution (histogram, by position, by entropy, by token frequency);
- the worst tokens in context (a click opens the rollout in the token strip at that token, on the
  ``mismatch`` channel);
- the share of tokens each framework's preset would clip or mask and of sequences it would reject
  (the sidebar's own correction highlighted);
- for runs with training steps, mean |Δ|, k3 and p99 |Δ| per step (the drift; a click on a step
  lists its worst tokens);
- the engines that sampled and recomputed the rollouts, with the known causes the data shows
  (``studio.signals.mismatch.diagnose``);
- a *Rescore with policy …* form (teacher-forces the scope's rollouts, ``studio.runs.rescore``),
  absent for browse-only users.

Everything is read off the event loop (:class:`widgets.base.jobs.Job`); a scope without recomputed
log-probs says how to get them instead of showing empty plots.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import panel as pn
import param

from sample_data import POLICY_DIR
from studio.queries import lookups
from studio.queries import mismatch as mq
from studio.runs.registry import known_policies
from studio.runs.rescore import PRECISIONS, rescore
from studio.signals.mismatch import PRESETS
from studio.store import StoreError

from . import mismatch_plots as mp
from .base.clickable import ClickableHTML
from .base.jobs import Job
from .base.lazy import LazyView
from .base.state import StudioState
from .base.style import CSS, banner, esc

EMPTY = ('<div class="empty mismatch-empty"><b>No recomputed log-probs in this scope yet</b>, so there is no Δ to show. '
         'To get them: <b>Rescore</b> these rollouts with a policy below (teacher forcing, e.g. the sample policy in '
         'float32 against rollouts sampled in bfloat16 or through a backend); <b>import</b> a framework\'s rollouts '
         'with both columns (verl <code>rollout_log_probs</code> + <code>old_log_probs</code>, NeMo-RL '
         '<code>generation_logprobs</code> + <code>prev_logprobs</code>, or any generic pair: Import &amp; enrich); or '
         'start a <b>mini-run</b> with a bfloat16 sampler (Mini-runs), which stores both sides of every token.</div>')


@dataclass
class Reading:
    """What one read of the scope returns (made on a thread, shown in the session)."""

    n_tokens: int = 0
    plots: list = field(default_factory=list)
    worst: pd.DataFrame = field(default_factory=pd.DataFrame)
    shares: pd.DataFrame = field(default_factory=pd.DataFrame)
    own: str = ""
    steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    engines: pd.DataFrame = field(default_factory=pd.DataFrame)
    causes: list = field(default_factory=list)


class MismatchPanel(LazyView):
    """Δ of the table's scope: distributions, worst tokens, corrections, drift, engines, Rescore."""

    state = param.ClassSelector(class_=StudioState, doc="Shared studio state.")
    policy = param.String(default=str(POLICY_DIR), doc="Folder (or backend URL) of the policy Rescore teacher-forces with.")
    precision = param.Selector(default="float32", objects=list(PRECISIONS),
                               doc="Precision the rescoring policy is loaded in (auto: the device's own).")
    rescore_scope = param.Selector(default="table's scope", objects=["table's scope", "selected group"],
                                   doc="Which rollouts Rescore teacher-forces: the table filter's (its group, else "
                                       "its run, else the shown rollout's run), or the shown rollout's group.")

    def __init__(self, can_run: bool = True, **params):
        super().__init__(**params)
        self._can_run = can_run
        self._step: int | None = None
        self._steps_frame = pd.DataFrame()  # the drift's steps last shown (a step click re-marks its row)
        self._read_job = Job()
        self._step_job = Job()
        self._summary = pn.pane.HTML("", stylesheets=[CSS], sizing_mode="stretch_width", css_classes=["mismatch-summary"])
        # panes made once and given new plots (see EntropyLandscape: no CDN stylesheets from callbacks)
        self._panes = [pn.pane.HoloViews(None, sizing_mode="stretch_width", min_height=220) for _ in range(4)]
        self._drift = pn.pane.HoloViews(None, sizing_mode="stretch_width", min_height=230)
        self._worst = self._clickable("mismatch-worst")
        self._steps = self._clickable("mismatch-steps")
        self._step_worst = self._clickable("mismatch-step-worst")
        self._shares = pn.pane.HTML("", stylesheets=[CSS, mp.MISMATCH_CSS], sizing_mode="stretch_width",
                                    css_classes=["mismatch-shares"])
        self._engines = pn.pane.HTML("", stylesheets=[CSS, mp.MISMATCH_CSS], sizing_mode="stretch_width",
                                     css_classes=["mismatch-engines"])
        self._body = pn.Column(
            pn.GridBox(*self._panes, ncols=2, sizing_mode="stretch_width", css_classes=["mismatch-plots"]),
            pn.FlexBox(pn.Column(self._worst, styles={"flex": "1 1 460px", "min-width": "0"}),
                       pn.Column(self._shares, styles={"flex": "1 1 380px", "min-width": "0"}),
                       flex_wrap="wrap", sizing_mode="stretch_width"),
            # a grid, as the plots above: a responsive plot in a flex item of min-width 0 drew at width 0
            pn.GridBox(pn.Column(self._drift, self._steps, sizing_mode="stretch_width"),
                       pn.Column(self._step_worst, sizing_mode="stretch_width"),
                       ncols=2, sizing_mode="stretch_width", css_classes=["mismatch-drift"]),
            self._engines, sizing_mode="stretch_width")
        parts = [self._rescore_form()] if can_run else []  # browse-only: nothing that starts a model
        self._layout = pn.Column(*parts, self._summary, self._body, sizing_mode="stretch_width")
        self._render()  # drawn now when made shown, else when first shown

    def _clickable(self, cls: str) -> ClickableHTML:
        pane = ClickableHTML(object="", stylesheets=[CSS, mp.MISMATCH_CSS], sizing_mode="stretch_width",
                             css_classes=[cls])
        pane.on_click(self._on_click)
        return pane

    # -- the Rescore form -----------------------------------------------------------------------
    def _rescore_form(self) -> pn.viewable.Viewable:
        self._go = pn.widgets.Button(name="Rescore with policy", color="primary", width=170,
                                     css_classes=["rescore-button"])
        self._go.on_click(self._on_rescore)
        self._rescore_job = Job(on_running=lambda on: setattr(self._go, "disabled", on))
        self._rescore_status = pn.pane.HTML("", stylesheets=[CSS], sizing_mode="stretch_width",
                                            css_classes=["rescore-status"])
        self._pick = pn.widgets.Select(name="Rescore with policy", options={}, width=260, css_classes=["rescore-pick"])
        self._pick.param.watch(lambda e: e.new and self.param.update(policy=e.new), "value")
        self._policies_at: int | None = None
        return pn.Column(pn.FlexBox(
            self._pick,
            pn.widgets.TextInput.from_param(self.param.policy, name="or any policy folder / backend URL", width=320,
                                            css_classes=["rescore-policy"]),
            pn.widgets.Select.from_param(self.param.precision, name="Precision", width=110,
                                         css_classes=["rescore-precision"]),
            pn.widgets.Select.from_param(self.param.rescore_scope, name="Rollouts", width=150,
                                         css_classes=["rescore-scope"]),
            pn.Column(pn.Spacer(height=18), self._go, margin=0),
            flex_wrap="wrap", align_items="flex-start", sizing_mode="stretch_width"),
            self._rescore_status, sizing_mode="stretch_width", css_classes=["rescore-form"])

    def _sync_policies(self) -> None:
        """The picker offers the bundled policies and every mini-run checkpoint (new ones come with a refresh)."""
        if self._policies_at == self.state.refresh:
            return
        self._policies_at = self.state.refresh
        opts = {"(a folder typed on the right)": ""} | known_policies(self.state.store)
        self._pick.options = opts
        self._pick.value = self.policy if self.policy in opts.values() else ""

    def scope_rollouts(self) -> list[str]:
        """The rollouts Rescore teacher-forces (:attr:`rescore_scope`); empty when nothing is picked."""
        st, flt = self.state, self.state.table_filter
        if self.rescore_scope == "selected group":
            return lookups.rollouts_of_group(st.store, st.group_id) if st.group_id else []
        if flt.group_id:
            return lookups.rollouts_of_group(st.store, flt.group_id)
        if flt.run_id:
            return lookups.rollouts_of_run(st.store, flt.run_id)
        return lookups.rollouts_of_same_run(st.store, st.rollout_id) if st.rollout_id else []

    async def _on_rescore(self, event) -> None:
        if not self._can_run or self._rescore_job.running:
            return
        ids = self.scope_rollouts()
        if not ids:
            self._rescore_status.object = banner("warn", "Pick a run in the table (or select a rollout) first: its "
                                                         "rollouts are rescored.")
            return
        policy = self.policy.strip()
        with self._rescore_job.claim():
            self._rescore_status.object = banner("info", f"rescoring {len(ids):,} rollouts with {policy} in "
                                                         f"{self.precision}…")
            try:
                report = await rescore(self.state.store, policy, ids, precision=self.precision)
            except Exception as exc:  # a missing folder, another tokenizer (named rollout), a dead worker: say which
                self._rescore_status.object = banner("error", f"Rescore with {policy} failed: {exc}")
                return
        self._rescore_status.object = banner("info", report.summary())
        if not self.state.mismatch_source and report.filled == 0 and report.rescored:
            self.state.mismatch_source = report.policy_version  # these rollouts had a recomputation: show the new one
        self.state.param.update(refresh=self.state.refresh + 1)

    # -- reading and showing --------------------------------------------------------------------
    def _read(self, flt, source: str, corrections: dict, own: str) -> Reading:
        dist = mq.distributions(self.state.store, flt, source)
        if not dist.n_tokens:
            return Reading()
        engines, causes = mq.engine_comparison(self.state.store, flt, source)
        return Reading(n_tokens=int(dist.n_tokens),
                       plots=[mp.histogram(dist.hist), mp.by_position(dist.by_pos), mp.by_entropy(dist.by_entropy),
                              mp.by_frequency(dist.by_frequency)],
                       worst=mq.worst_tokens(self.state.store, flt, source, limit=15),
                       shares=mq.correction_shares(self.state.store, flt, source, corrections), own=own,
                       steps=mq.by_step(self.state.store, flt, source), engines=engines, causes=list(causes))

    @param.depends("state.refresh", "state.table_filter", "state.mismatch_source", "state.mm_method", "state.mm_cap",
                   "state.mm_low", "state.mm_threshold", "state.mm_preset", watch=True)
    def _render(self) -> None:
        if self._defer():  # a hidden tab: drawn when it is opened
            return
        if self._can_run:
            self._sync_policies()
        st = self.state
        c = st.correction()
        own = st.mm_preset if st.mm_preset in PRESETS and PRESETS[st.mm_preset] == c else f"sidebar: {c.describe()}"
        corrections = ({} if own in PRESETS else {own: c}) | dict(PRESETS)
        flt, source = st.table_filter, st.mismatch_source
        self._summary.object = '<div class="meta-line"><span>reading the scope…</span></div>'
        self._read_job.submit(lambda: self._read(flt, source, corrections, own), self._show,
                              failed=lambda msg: setattr(self._summary, "object", banner("error", msg)),
                              errors=(StoreError,))

    def _show(self, r: Reading) -> None:
        self._body.visible = bool(r.n_tokens)
        if not r.n_tokens:
            self._summary.object = EMPTY
            return
        src = self.state.mismatch_source or "the stored recomputed log-probs (tokens.train_logprob)"
        self._summary.object = (f'<div class="meta-line"><span><b>{r.n_tokens:,}</b> tokens with Δ in the table\'s '
                                f'scope</span><span>recomputed side: <b>{esc(src)}</b></span></div>')
        for pane, plot in zip(self._panes, r.plots, strict=True):
            pane.object = plot
        self._worst.object = mp.worst_html(r.worst)
        self._shares.object = mp.shares_html(r.shares, r.own)
        has_steps = not r.steps.empty
        self._drift.visible = self._steps.visible = self._step_worst.visible = has_steps
        self._drift.object = mp.drift(r.steps) if has_steps else None
        if self._step is not None and (not has_steps or self._step not in set(r.steps["step"].astype(int))):
            self._step = None
        self._steps_frame = r.steps
        self._steps.object = mp.steps_html(r.steps, self._step)
        if self._step is None:
            self._step_worst.object = ('<div class="empty">Click a step to list its worst tokens.</div>'
                                       if has_steps else "")
        else:
            self._show_step(self._step)
        self._engines.object = mp.engines_html(r.engines, r.causes)

    def _show_step(self, step: int) -> None:
        """List training step ``step``'s worst tokens (read off the event loop)."""
        self._step = step
        self._steps.object = mp.steps_html(self._steps_frame, step)
        flt, source = self.state.table_filter, self.state.mismatch_source
        self._step_job.submit(lambda: mq.worst_tokens(self.state.store, flt, source, limit=15, train_step=step),
                              lambda df: setattr(self._step_worst, "object",
                                                 mp.worst_html(df, f"Worst tokens of step {step}")),
                              failed=lambda msg: setattr(self._step_worst, "object", banner("error", msg)),
                              errors=(StoreError,))

    def _on_click(self, kind: str, value: str) -> None:
        if kind == "step" and value.lstrip("-").isdigit():
            self._show_step(int(value))
        elif kind == "token" and ":" in value:
            rid, pos = value.rsplit(":", 1)
            if pos.isdigit():
                self.state.channel = "mismatch"  # first: the strip then draws the rollout once, on this channel
                self.state.open_rollout(rid, int(pos))

    def __panel__(self):
        return self._layout
