"""Credit assignment: the sidebar's estimator, step and turn controls, and the "Advantages &
steps" tab (two estimators compared, step- and turn-reward sources computed, group diagnostics)."""
from __future__ import annotations

import asyncio
from dataclasses import replace

import numpy as np
import panel as pn
import param

from sample_data import PRM_DIR, VALUE_MODEL_DIR
from studio import queries
from studio.queries import credit, forks, lookups
from studio.queries.turns import has_trajectories, turn_reward_sources
from studio.runs.credit_models import critic_values, information_gain, prm_steps, turn_information_gain
from studio.signals.advantages import ESTIMATORS, Credit
from studio.store import StoreError

from .base.clickable import ClickableHTML
from .base.jobs import Job, failure
from .base.lazy import LazyView
from .base.pickers import run_choices
from .base.plots import LEGEND_TOP, holoviews, plot_opts, step_ticks
from .base.state import StudioState
from .base.style import CSS, SCALES, banner, esc
from .rule_diff import DIFF_CSS
from .token_strip import strip_html

NONE = "(none)"
AUTO = "(the shown version's, else the first)"  # the turn source '' : what the token strip picks by itself
TURN_NORMS = {"over the group's turns": "group", "per turn index": "index", "raw (no normalisation)": "none"}
# the tab's tables fit their column: fixed number columns, the prompt cut with an ellipsis
FIT_CSS = """
table.diff.fit th.num { width:62px; } table.diff.fit th.flags { width:24px; } table.diff.fit th.band { width:96px; }
"""


def stored_sources(store) -> dict[str, list[str]]:
    """What the credit controls can pick: reference log-probs, critics, step- and turn-reward
    sources (``trajectories``: whether the store holds any agent trajectory, a one-item list)."""
    refs = forks.scored_versions(store)
    critics = lookups.critic_versions(store)
    return {"reference": [r for r in refs if r not in critics], "values": critics,
            "steps": credit.step_sources(store) + [credit.IMPLICIT], "turns": turn_reward_sources(store),
            "trajectories": [has_trajectories(store)]}


def credit_controls(state: StudioState) -> pn.Column:
    """Sidebar widgets bound to the session's credit settings (options follow the store)."""
    est = pn.widgets.Select(name="Advantage estimator", options={e.label: k for k, e in ESTIMATORS.items()},
                            value=state.estimator, sizing_mode="stretch_width", css_classes=["estimator"])
    est.link(state, value="estimator")
    ref = pn.widgets.Select(name="Reference policy (KL, implicit PRM)", sizing_mode="stretch_width",
                            css_classes=["reference"])
    crit = pn.widgets.Select(name="Critic values (GAE)", sizing_mode="stretch_width", css_classes=["critic"])
    step_src = pn.widgets.Select(name="Step rewards under the tokens", sizing_mode="stretch_width",
                                 css_classes=["step-source"])
    turn_src = pn.widgets.Select(name="Turn rewards (agent trajectories)", sizing_mode="stretch_width",
                                 css_classes=["turn-source"])

    sources = state.fresh_read(("credit_sources",), lambda: stored_sources(state.store))

    def sync(*_):
        src = sources()
        ref.options = [NONE] + src["reference"]
        crit.options = [NONE] + src["values"]
        step_src.options = [NONE] + src["steps"]
        ref.value = state.reference if state.reference in src["reference"] else NONE
        crit.value = state.value_source if state.value_source in src["values"] else NONE
        step_src.value = state.step_source if state.step_source in src["steps"] else NONE
        turn_src.options = [AUTO] + src["turns"]
        turn_src.value = state.turn_source if state.turn_source in src["turns"] else AUTO
        turns.visible = src["trajectories"][0]

    turns = turn_controls(state, turn_src)
    sync()
    state.param.watch(sync, ["refresh"])
    ref.param.watch(lambda e: setattr(state, "reference", "" if e.new == NONE else e.new), "value")
    crit.param.watch(lambda e: setattr(state, "value_source", "" if e.new == NONE else e.new), "value")
    step_src.param.watch(lambda e: setattr(state, "step_source", "" if e.new == NONE else e.new), "value")
    turn_src.param.watch(lambda e: setattr(state, "turn_source", "" if e.new == AUTO else e.new), "value")
    beta = pn.widgets.FloatInput.from_param(state.param.kl_beta, name="β (KL weight)", width=95)
    gamma = pn.widgets.FloatInput.from_param(state.param.gae_gamma, name="γ", width=95)
    lam = pn.widgets.FloatInput.from_param(state.param.gae_lam, name="λ", width=95)
    pattern = pn.widgets.TextInput.from_param(state.param.step_pattern, name="delimiter / regex / tag", width=150)
    outcome = pn.Row(pn.widgets.Select.from_param(state.param.step_agg, name="Steps → outcome", width=130,
                                                  css_classes=["step-agg"]),
                     pn.widgets.FloatInput.from_param(state.param.gate_tau, name="Gate τ (G-RA)", width=130),
                     sizing_mode="stretch_width")
    kl_row = pn.Column(beta, ref, sizing_mode="stretch_width", margin=0)
    gae_row = pn.Row(gamma, lam, sizing_mode="stretch_width", margin=0)

    def show_relevant(*_):
        """Each setting shows only where it acts: β and the reference with the KL estimator or the
        implicit step reward, γ, λ and the critic with GAE, the outcome rule once steps have rewards."""
        kl = state.estimator == "kl" or state.step_source == credit.IMPLICIT
        kl_row.visible = kl
        gae_row.visible = crit.visible = state.estimator == "gae"
        pattern.visible = state.segmenter not in ("task", "newline")
        outcome.visible = bool(state.step_source)

    show_relevant()
    state.param.watch(show_relevant, ["estimator", "step_source", "segmenter"])
    steps = pn.Column(
        pn.Row(pn.widgets.Select.from_param(state.param.segmenter, name="Steps by", width=130,
                                            css_classes=["segmenter"]), pattern, sizing_mode="stretch_width"),
        step_src, outcome, sizing_mode="stretch_width")
    return pn.Column(est, kl_row, gae_row, crit, steps, turns, sizing_mode="stretch_width")


def turn_controls(state: StudioState, source: pn.widgets.Select) -> pn.Column:
    """The per-turn credit settings (a store with agent trajectories only): the turn-reward
    source, how turn rewards are normalised over the group, the discount γ of later turns, and
    the G-RA gate by the outcome (its τ is the steps' *Gate τ*); shown once there are turn
    rewards to act on, τ once the gate is on (here unless the steps' outcome row shows it)."""
    norm = pn.widgets.Select.from_param(state.param.turn_norm, name="Turns normalised", options=TURN_NORMS,
                                        width=170, css_classes=["turn-norm"])
    gamma = pn.widgets.FloatInput.from_param(state.param.turn_gamma, name="γ (later turns)", width=95,
                                             css_classes=["turn-gamma"])
    gate = pn.widgets.Checkbox.from_param(state.param.turn_gate, name="Gate by the outcome (G-RA)",
                                          css_classes=["turn-gate"])
    tau = pn.widgets.FloatInput.from_param(state.param.gate_tau, name="Gate τ (G-RA)", width=130,
                                           css_classes=["turn-tau"])
    settings = pn.Column(pn.Row(norm, gamma, sizing_mode="stretch_width", margin=0), gate, tau,
                         sizing_mode="stretch_width", margin=0, css_classes=["turn-settings"])

    def show_relevant(*_):
        settings.visible = len(source.options) > 1
        tau.visible = state.turn_gate and not state.step_source

    show_relevant()
    source.param.watch(show_relevant, "options")
    state.param.watch(show_relevant, ["turn_gate", "step_source"])
    return pn.Column(source, settings, sizing_mode="stretch_width", margin=0, css_classes=["turn-credit"])


class CreditView(LazyView):
    """Two estimators on the same rollouts, step-reward sources, and group diagnostics."""

    state = param.ClassSelector(class_=StudioState, doc="Shared studio state.")
    estimator_a = param.Selector(default="grpo", objects=list(ESTIMATORS), doc="First estimator (A).")
    estimator_b = param.Selector(default="rloo", objects=list(ESTIMATORS), doc="Second estimator (B).")
    run = param.Selector(default=None, objects=[], allow_None=True, doc="Run whose rollouts are compared.")
    running = param.Boolean(default=False, doc="Whether a step-reward computation is in progress.")

    def __init__(self, can_run: bool = True, **params):
        super().__init__(**params)
        self._can_run = can_run
        self._runs: dict[str, str] = {}
        labels = {e.label: k for k, e in ESTIMATORS.items()}
        self._summary = pn.pane.HTML("", stylesheets=[CSS, DIFF_CSS], sizing_mode="stretch_width",
                                     css_classes=["estimator-compare"])
        self._scatter = pn.pane.HoloViews(None, sizing_mode="stretch_width", height=300)
        self._movers = ClickableHTML(object="", stylesheets=[CSS, DIFF_CSS, FIT_CSS], sizing_mode="stretch_width",
                                     css_classes=["estimator-movers"])
        self._movers.on_click(self._on_click)
        self._token_diff = pn.pane.HTML("", stylesheets=[CSS], sizing_mode="stretch_width",
                                        css_classes=["token-diff"])
        self._zero = pn.pane.HoloViews(None, sizing_mode="stretch_width", height=230)
        self._zero_note = pn.pane.HTML("", stylesheets=[CSS], sizing_mode="stretch_width", css_classes=["all-equal"])
        self._prompts = ClickableHTML(object="", stylesheets=[CSS, DIFF_CSS, FIT_CSS], sizing_mode="stretch_width",
                                      css_classes=["prompt-stats"])
        self._prompts.on_click(self._on_click)
        self._status = pn.pane.HTML("", stylesheets=[CSS], sizing_mode="stretch_width", css_classes=["step-status"])
        self._ig = pn.widgets.Button(name="Information gain (IGPO)", color="primary",
                                     disabled=not can_run, css_classes=["ig-button"], width=190)
        self._ig_turns = pn.widgets.Button(name="Information gain per turn", color="primary", visible=False,
                                           disabled=not can_run, css_classes=["ig-turn-button"], width=190)
        self._prm_folder = pn.widgets.TextInput(name="Process reward model folder", value=str(PRM_DIR), width=210,
                                                disabled=not can_run, css_classes=["prm-folder"])
        self._prm = pn.widgets.Button(name="Score steps with the PRM", color="primary", width=190,
                                      disabled=not can_run, css_classes=["prm-button"])
        self._value_folder = pn.widgets.TextInput(name="Value model (critic) folder", value=str(VALUE_MODEL_DIR),
                                                  width=210, disabled=not can_run, css_classes=["value-folder"])
        self._value = pn.widgets.Button(name="Critic values for GAE", color="primary", width=190,
                                        disabled=not can_run, css_classes=["value-button"])
        self._buttons = (self._ig, self._ig_turns, self._prm, self._value)
        self._job = Job(on_running=self._computing)  # one step-reward computation at a time
        if can_run:  # browse-only sessions get no callback that could start a model
            self._ig.on_click(self._on_ig)
            self._ig_turns.on_click(self._on_ig_turns)
            self._prm.on_click(self._on_prm)
            self._value.on_click(self._on_value)
        controls = pn.Row(
            pn.widgets.Select.from_param(self.param.estimator_a, name="Estimator A", width=230,
                                         options=labels, css_classes=["est-a"]),
            pn.widgets.Select.from_param(self.param.estimator_b, name="Estimator B", width=230,
                                         options=labels, css_classes=["est-b"]),
            pn.widgets.Select.from_param(self.param.run, name="Rollouts of run", width=260),
            sizing_mode="stretch_width")
        def below(button):  # a button aligned with the inputs beside it
            return pn.Column(pn.Spacer(height=18), button, margin=0)
        compute = pn.FlexBox(
            below(self._ig), below(self._ig_turns), self._prm_folder, below(self._prm), self._value_folder, below(self._value),
            flex_wrap="wrap", align_items="flex-start", sizing_mode="stretch_width", css_classes=["compute-row"])
        self._layout = pn.Column(
            controls, compute, self._status,
            # two columns that wrap below each other when narrow; the tables cut long prompts with an ellipsis
            pn.FlexBox(pn.Column(self._summary, self._scatter, self._zero_note, self._zero,
                                 styles={"flex": "1 1 400px", "min-width": "0"}),
                       pn.Column(self._movers, self._token_diff, self._prompts,
                                 styles={"flex": "1 1 440px", "min-width": "0"}),
                       flex_wrap="wrap", align_items="flex-start", sizing_mode="stretch_width"),
            sizing_mode="stretch_width")
        self._refresh()

    @param.depends("state.refresh", watch=True)
    def _refresh(self) -> None:
        self._runs = run_choices(self.state.store)
        with param.parameterized.batch_call_watchers(self):
            self.param.run.objects = list(self._runs)
            if self.run not in self._runs:
                self.run = next(iter(self._runs), None)
        self._render()

    def _credit(self, key: str) -> Credit:
        st = self.state
        return Credit(key, float(st.kl_beta), st.reference or None, float(st.gae_gamma), float(st.gae_lam),
                      st.value_source or None)

    @param.depends("state.rollout_id", watch=True)
    def _render_rollout(self) -> None:
        """Another rollout opened: only its per-token B − A changes (the run's comparison stays)."""
        if self._defer():
            return
        try:
            self._token_diff.object = self._token_diff_html(self._credit(self.estimator_a),
                                                            self._credit(self.estimator_b))
        except (StoreError, ValueError) as exc:  # a read past its time limit, a setting out of range: say so
            self._token_diff.object = banner("error", str(exc))

    @param.depends("estimator_a", "estimator_b", "run", "state.kl_beta", "state.reference",
                   "state.gae_gamma", "state.gae_lam", "state.value_source", "state.rule_version", watch=True)
    def _render(self) -> None:
        if self._defer():
            return
        st = self.state
        run_id = self._runs.get(self.run)
        self._ig_turns.visible = bool(run_id) and has_trajectories(st.store, run_id)
        if not run_id:
            self._summary.object = '<div class="empty">No rollouts yet.</div>'
            return
        a, b = self._credit(self.estimator_a), self._credit(self.estimator_b)
        try:
            df = credit.compare_estimators(st.store, a, b, run_id, st.rule_version or None)
            zero = credit.all_equal_by_step(st.store, run_id, st.rule_version or None)
            ps = credit.prompt_stats(st.store, run_id, st.rule_version or None)
        except StoreError as exc:
            self._summary.object = banner("error", str(exc))
            return
        notes = [f"{c.describe()}: {c.missing}" for c in (a, b) if c.missing]
        both = df.dropna(subset=["adv_a", "adv_b"])
        corr = both["adv_a"].corr(both["adv_b"]) if len(both) > 2 else float("nan")
        self._summary.object = (
            f'<div class="meta-line"><span>A <b>{esc(a.describe())}</b></span><span>B <b>{esc(b.describe())}</b></span></div>'
            f'<div class="meta-line"><span><b>{len(both):,}</b> rollouts</span>'
            f'<span>sign flips <b class="sign-flips">{int(both["sign_flip"].sum()):,}</b></span>'
            f'<span>rank changes within group <b>{int(both["rank_change"].sum()):,}</b></span>'
            f'<span>corr <b>{corr:.3f}</b></span>'
            f'<span>mean |B − A| <b>{both["diff"].abs().mean() if len(both) else 0:.3f}</b></span></div>'
            + "".join(banner("warn", n) for n in notes))
        hv = holoviews()
        if len(both):
            lim = float(max(both["adv_a"].abs().max(), both["adv_b"].abs().max(), 1e-6)) * 1.05
            x, y = ("adv_a", f"A: {ESTIMATORS[a.estimator].label}"), ("adv_b", f"B: {ESTIMATORS[b.estimator].label}")
            layers = [hv.Curve([(-lim, -lim), (lim, lim)], x, y).opts(color="#adb5bd", line_dash="dashed")]
            for label, flip, color in (("same sign", False, "#3b5bdb"), ("sign flip", True, "#c92a2a")):
                part = both[both["sign_flip"] == flip]
                if len(part):
                    layers.append(hv.Scatter(part, x, y, label=label).opts(color=color, size=4, alpha=0.5))
            self._scatter.object = hv.Overlay(layers).opts(**plot_opts(
                title="Per rollout: advantage B against A", height=290, tools=["hover"], **LEGEND_TOP))
        else:
            self._scatter.object = None
        top = both.head(12)  # the largest |B − A| first
        rows = "".join(
            f'<tr class="diff-row" data-click="open" data-value="{esc(r.rollout_id)}"><td class="mono">{esc(r.prompt)}</td>'
            f'<td>{r.reward:.3f}</td><td>{r.adv_a:+.3f}</td><td>{r.adv_b:+.3f}</td><td><b>{r.diff:+.3f}</b></td>'
            f'<td>{"⇅" if r.sign_flip else ""}{"↕" if r.rank_change else ""}</td></tr>' for r in top.itertuples())
        self._movers.object = (f'<div class="meta-line"><b>largest changes</b> (click to open; ⇅ sign flip, ↕ rank change)</div>'
                               f'<table class="diff fit"><tr><th>prompt</th><th class="num">reward</th>'
                               f'<th class="num">A</th><th class="num">B</th><th class="num">B − A</th>'
                               f'<th class="flags"></th></tr>{rows}</table>')
        self._token_diff.object = self._token_diff_html(a, b)
        self._show_all_equal(zero)
        bands = ps["band"].value_counts()
        brow = " · ".join(f"{esc(k)} <b>{int(bands.get(k, 0))}</b>" for k in
                          ("never solved", "hard", "medium", "easy", "always solved"))
        prow = "".join(f'<tr><td class="mono">{esc(r.prompt)}</td><td>{r.n}</td><td>{r.pass_rate:.2f}</td>'
                       f'<td>{r.reward_var:.3f}</td><td>{esc(r.band)}</td></tr>' for r in ps.head(10).itertuples())
        self._prompts.object = (f'<div class="meta-line"><b>difficulty bands</b> (pass rate per prompt): {brow}</div>'
                                f'<table class="diff fit"><tr><th>prompt (highest reward variance first)</th>'
                                f'<th class="num">n</th><th class="num">pass</th><th class="num">var</th>'
                                f'<th class="band">band</th></tr>{prow}</table>')

    def _show_all_equal(self, zero) -> None:
        """Groups whose rewards are all equal (no learning signal): a curve over the training
        steps, or one line for a run without steps (a single batch)."""
        if len(zero) < 2:
            share = f"{float(zero['all_equal_share'].iloc[0]):.0%}" if len(zero) else "–"
            groups = int(zero["groups"].iloc[0]) if len(zero) else 0
            self._zero_note.object = (f'<div class="meta-line"><b>all-equal groups</b><span><b>{share}</b> of '
                                      f'{groups:,} groups: every completion has the same reward, so no learning '
                                      'signal</span></div>')
            self._zero.visible = False
            return
        hv = holoviews()
        step, share = ("step", "training step"), ("all_equal_share", "share of groups")
        groups = ("groups", "groups")
        self._zero_note.object = ""
        self._zero.visible = True
        self._zero.object = (hv.Curve(zero, step, [share, groups]).opts(color="#f08c00", line_width=2)
                             * hv.Scatter(zero, step, [share, groups]).opts(color="#f08c00", size=5)).opts(
            **plot_opts(title="All-equal groups per step", ylabel="share of groups", xlabel="training step",
                        height=220, ylim=(0, 1), tools=["hover"], **step_ticks()))

    def _token_diff_html(self, a: Credit, b: Credit) -> str:
        st = self.state
        if not st.rollout_id:
            return '<div class="empty">Open a rollout to see B − A per token.</div>'
        ta = credit.token_advantages(st.store, st.rollout_id, a, st.rule_version or None)
        tb = credit.token_advantages(st.store, st.rollout_id, b, st.rule_version or None)
        if ta.values is None or tb.values is None:
            return banner("warn", f"per-token view needs both: {ta.note or tb.note}")
        toks = queries.tokens(st.store, st.rollout_id)
        diff = np.asarray(tb.values) - np.asarray(ta.values)
        return (f'<div class="meta-line"><b>this rollout, per token: B − A</b>'
                f'<span>max |Δ| <b>{np.abs(diff).max():.3f}</b></span></div>'
                + replace(SCALES["advantage"], label="B − A", help="per-token advantage under B minus under A").legend_html()
                + strip_html(toks, "advantage", diff, compact=True))

    async def _compute(self, what: str, start: str, job, done) -> None:
        """Run ``job(rollout_ids)`` (a credit coroutine) for the picked run with every compute
        button disabled, saying ``start`` while it runs and ``done(result)`` after."""
        run_id = self._runs.get(self.run)
        if not self._can_run or self.running or not run_id:
            return
        with self._job.claim():
            try:
                rids = lookups.rollouts_of_run(self.state.store, run_id)
                self._status.object = banner("info", start.format(n=f"{len(rids):,}"))
                result = await job(rids)
                self._status.object = banner("info", done(result))
            except Exception as exc:  # a missing folder, the wrong model, another vocabulary: say so, keep the page
                self._status.object = banner("error", failure(what, exc))
        await asyncio.sleep(0)

    def _computing(self, on: bool) -> None:
        self.running = on
        for b in self._buttons:
            b.disabled = on or not self._can_run

    async def _on_ig(self, event=None) -> None:
        st = self.state

        def done(source: str) -> str:
            st.param.update(step_source=source, refresh=st.refresh + 1)
            return f"stored step rewards {source}; they now show under the tokens (sidebar: 'Step rewards')."
        await self._compute("information gain", f"information gain: teacher-forcing the gold answer after every "
                                                f"step of {{n}} rollouts with {st.policy_path}…",
                            lambda rids: information_gain(st.store, st.policy_path, rids, st.segmentation()),
                            done)

    async def _on_ig_turns(self, event=None) -> None:
        st = self.state

        def done(source: str) -> str:
            st.param.update(turn_source=source, refresh=st.refresh + 1)
            return (f"stored turn rewards {source}; each assistant turn shows its information gain and turn "
                    "advantage (sidebar: 'Turn rewards').")
        await self._compute("information gain per turn", f"information gain per turn: teacher-forcing the gold answer "
                                                         f"after every assistant turn of {{n}} rollouts with "
                                                         f"{st.policy_path}…",
                            lambda rids: turn_information_gain(st.store, st.policy_path, rids), done)

    async def _on_prm(self, event=None) -> None:
        st, folder = self.state, self._prm_folder.value.strip()

        def done(source: str) -> str:
            st.param.update(step_source=source, refresh=st.refresh + 1)
            return f"stored step rewards {source}; they now show under the tokens (sidebar: 'Step rewards')."
        await self._compute("process reward model", f"scoring every step of {{n}} rollouts with the PRM in {folder}…",
                            lambda rids: prm_steps(st.store, folder, rids, st.segmentation()), done)

    async def _on_value(self, event=None) -> None:
        st, folder = self.state, self._value_folder.value.strip()

        def done(version: str) -> str:
            st.param.update(value_source=version, refresh=st.refresh + 1)
            return (f"stored per-token values {version}; picked as the critic for GAE (sidebar: 'Advantage "
                    f"estimator' → GAE).")
        await self._compute("critic values", f"valuing every token of {{n}} rollouts with the critic in {folder}…",
                            lambda rids: critic_values(st.store, folder, rids), done)

    def _on_click(self, kind: str, value: str) -> None:
        if kind == "open" and value:
            self.state.open_rollout(value)

    def __panel__(self):
        return self._layout
