"""The "Timeline & diff" tab: one prompt across training steps, and two runs (or steps)
compared prompt by prompt.

Timeline: a run with 2+ training steps, one of its prompts (searchable; it follows the
rollout selected anywhere in the studio), its reward (mean, min–max band), accuracy, token
entropy and length over the steps, and one step's completions (a click opens one in the
token strip). Run diff: side A and side B (a run, or one step of it) on the prompts both
have: paired statistics (``studio.queries.timeline.run_diff``), reward A against B per prompt, and
the prompts that moved most (a click shows that prompt's timeline).

Queries run in a worker thread (DuckDB releases the GIL), so a diff over a million rollouts
never holds up the page; a newer request supersedes an older one still running (one
``widgets.base.jobs.Job`` per kind of request). The plots are ``widgets.timeline_plots``', the
HTML ``widgets.timeline_html``'s.
"""
from __future__ import annotations

import collections
import json
from collections.abc import Callable

import numpy as np
import pandas as pd
import panel as pn
import param

from studio.queries import lookups
from studio.queries import timeline as tl
from studio.queries.timeline import Side
from studio.store import StoreError

from .base.clickable import ClickableHTML
from .base.jobs import Job
from .base.lazy import LazyView
from .base.pickers import run_choices, set_choices
from .base.plots import holoviews
from .base.state import StudioState
from .base.style import CSS, DIVIDER_HTML, banner, esc
from .timeline_html import TL_CSS, fmt_num, movers_html, no_timeline_text, prompt_info_html, steps_html, summary_html
from .timeline_plots import PLOT_H, SCATTER_H, diff_scatter, entropy_plot, length_plot, reward_plot, scatter_points

WHOLE_RUN = "whole run"
N_MOVERS = 10


class TimelinePanel(LazyView):
    """One prompt across training steps, and two sides (runs or steps) compared per prompt."""

    state = param.ClassSelector(class_=StudioState, doc="Shared studio state.")
    run = param.Selector(default=None, objects=[], allow_None=True, doc="Run (2+ training steps) of the timeline.")
    search = param.String(default="", doc="Keep prompts whose text contains this (case-insensitive).")
    prompt = param.Selector(default=None, objects=[], allow_None=True, doc="Prompt whose timeline is shown.")
    step = param.Selector(default=None, objects=[], allow_None=True, doc="Training step whose completions are listed.")
    a_run = param.Selector(default=None, objects=[], allow_None=True, doc="Side A: run.")
    a_step = param.Selector(default=WHOLE_RUN, objects=[WHOLE_RUN], check_on_set=False,
                            doc="Side A: one training step, or the whole run.")
    b_run = param.Selector(default=None, objects=[], allow_None=True, doc="Side B: run.")
    b_step = param.Selector(default=WHOLE_RUN, objects=[WHOLE_RUN], check_on_set=False,
                            doc="Side B: one training step, or the whole run.")

    def __init__(self, **params):
        super().__init__(**params)
        self._runs: dict[str, str] = {}  # timeline run label -> run id
        self._all_runs: dict[str, str] = {}  # diff run label -> run id
        self._prompts: dict[str, str] = {}  # prompt label -> prompt id
        self._steps: dict[str, int] = {}  # step label -> train step
        # (label, prompt id, run id) kept in the picker (a selection, a mover)
        self._pin: tuple[str, str, str] | None = None
        self._want_step: int | None = None  # the step to list once the pinned prompt's timeline is in
        self._step_label: int | None = None
        self._step_prompt = ""
        self._quiet = False  # set while pickers are filled, so their watchers do not each start a query
        self._timeline = pd.DataFrame()
        self._step_rows = pd.DataFrame()
        self._diff: tl.RunDiff | None = None
        self._jobs: dict[str, Job] = collections.defaultdict(Job)  # request kind -> its job (the newest wins)
        self._run_steps: dict[str, list[int]] = {}  # run id -> its training steps (until the store changes)
        self._step_count: dict[str, int] = {}  # timeline run id -> how many training steps it has
        self._spans: dict = {}  # the step marker's Bokeh spans in the plots on screen
        self._loaded = False
        kw = {"stylesheets": [CSS, TL_CSS], "sizing_mode": "stretch_width"}
        self._prompt_info = pn.pane.HTML("", css_classes=["timeline-info"], margin=(0, 5), **kw)
        # three panes side by side rather than one hv.Layout: a Bokeh GridPlot replaced in a view that
        # re-enters the page (the lower tabs take a closed tab's view out) draws its figures collapsed
        self._plots = [pn.pane.HoloViews(None, height=PLOT_H + 10, sizing_mode="stretch_width", margin=(0, 2))
                       for _ in range(3)]
        self._plot = pn.Row(*self._plots, css_classes=["timeline-plot"], sizing_mode="stretch_width")
        self._step_list = ClickableHTML(object="", css_classes=["timeline-step-list"], margin=(0, 5), **kw)
        self._step_list.on_click(self._on_click)
        self._summary = pn.pane.HTML("", css_classes=["diff-summary"], margin=(0, 5), **kw)
        self._scatter = pn.pane.HoloViews(None, css_classes=["diff-scatter"], height=SCATTER_H + 10, width=430,
                                          margin=(0, 5))
        self._movers = ClickableHTML(object="", css_classes=["diff-movers"], margin=(0, 5), **kw)
        self._movers.on_click(self._on_click)

        def pick(p, name, width, cls):
            return pn.widgets.Select.from_param(p, name=name, width=width, css_classes=[cls])

        def head(title: str) -> pn.pane.HTML:
            return pn.pane.HTML(f'<div class="tl-head">{esc(title)}</div>', stylesheets=[TL_CSS], margin=(6, 10, 0, 10))
        timeline = pn.Column(
            head("Timeline: one prompt across training steps"),
            # two rows of pickers, so they fit beside the sidebar at 1280 px (a wrapping FlexBox let the plots
            # below overlap the prompt's line)
            pn.Row(pick(self.param.run, "Run (2+ training steps)", 300, "timeline-run"),
                   pn.widgets.TextInput.from_param(self.param.search, name="Search prompts", width=200,
                                                   placeholder="text in the prompt", css_classes=["timeline-search"]),
                   pick(self.param.step, "Step", 120, "timeline-step")),
            pn.widgets.Select.from_param(self.param.prompt, name="Prompt (most steps, biggest change first)",
                                         sizing_mode="stretch_width", max_width=840, css_classes=["timeline-prompt"]),
            self._prompt_info, self._plot, self._step_list, sizing_mode="stretch_width")
        diff = pn.Column(
            head("Run diff: side A against side B on shared prompts"),
            pn.Row(pick(self.param.a_run, "A: run", 270, "diff-a-run"), pick(self.param.a_step, "A: step", 120,
                                                                               "diff-a-step"),
                   pn.pane.HTML('<div style="padding-top:26px;color:#868e96">vs</div>', width=24),
                   pick(self.param.b_run, "B: run", 270, "diff-b-run"), pick(self.param.b_step, "B: step", 120,
                                                                               "diff-b-step")),
            self._summary,
            pn.Row(self._scatter, pn.Column(self._movers, sizing_mode="stretch_width"), sizing_mode="stretch_width"),
            sizing_mode="stretch_width")
        self._layout = pn.Column(timeline, pn.pane.HTML(DIVIDER_HTML, sizing_mode="stretch_width"), diff, sizing_mode="stretch_width",
                                 css_classes=["timeline-panel"])
        self._render()

    # -- background queries ---------------------------------------------------------------
    def _background(self, kind: str, work: Callable[[], object], done: Callable[[object], None],
                    failed: Callable[[str], None]) -> None:
        """Run ``work`` in a thread, then ``done(result)`` in the session, unless a newer
        request of the same ``kind`` was made meanwhile (its result wins); a store error (a
        query past its time limit) goes to ``failed(message)``, said in place."""
        self._jobs[kind].submit(work, done, failed, errors=(StoreError,))

    # -- choices --------------------------------------------------------------------------
    @param.depends("state.refresh", "state.rule_version", watch=True)
    def _render(self) -> None:
        """Everything again: pickers from the store, the prompt list, the timeline, the diff."""
        if self._defer():
            return
        store = self.state.store
        picked = [self._all_runs.get(self.a_run), self._all_runs.get(self.b_run)]

        def work():
            runs = tl.runs_with_steps(store)
            # the steps of the runs the sides will show, read here rather than on the event loop
            wanted = {r for r in [*picked, *runs["run_id"][:1]] if r}
            return runs, run_choices(store), {r: [int(s) for s in tl.run_steps(store, r)["train_step"]]
                                              for r in wanted}

        self._background("choices", work, lambda res: self._fill(*res),
                         lambda msg: setattr(self._prompt_info, "object", banner("error", msg)))

    def _fill(self, runs: pd.DataFrame, every: dict[str, str], steps: dict[str, list[int]]) -> None:
        """Fill the pickers from the store's runs (keeping what is picked), then load the views."""
        self._run_steps = dict(steps)
        self._runs = {f"{r.name} · {r.kind} · {r.steps} steps · {r.run_id[-6:]}": r.run_id
                      for r in runs.itertuples()}
        self._step_count = {r.run_id: int(r.steps) for r in runs.itertuples()}
        self._all_runs = every
        first_time = not self._loaded
        self._loaded = True
        self._quiet = True
        try:
            set_choices(self, "run", list(self._runs),
                        self.run if self.run in self._runs else next(iter(self._runs), None))
            if first_time or self.a_run not in every or self.b_run not in every:
                self._default_sides(runs)
            else:
                set_choices(self, "a_run", list(every), self.a_run)
                set_choices(self, "b_run", list(every), self.b_run)
                self._set_steps(self.a_run, "a")
                self._set_steps(self.b_run, "b")
        finally:
            self._quiet = False
        self._load_prompts()
        self._load_diff()

    def _default_sides(self, runs: pd.DataFrame) -> None:
        """First against last step of the newest run with steps; else the two newest runs."""
        labels = list(self._all_runs)
        a = b = None
        a_step = b_step = None
        if len(runs):
            r = runs.iloc[0]
            a = b = next(k for k, v in self._all_runs.items() if v == r.run_id)
            a_step, b_step = f"step {int(r.first_step)}", f"step {int(r.last_step)}"
        elif labels:
            a, b = labels[min(1, len(labels) - 1)], labels[0]
        set_choices(self, "a_run", labels, a)
        set_choices(self, "b_run", labels, b)
        self._set_steps(a, "a", a_step)
        self._set_steps(b, "b", b_step)

    def _set_steps(self, run_label: str | None, side: str, value: str | None = None) -> None:
        run_id = self._all_runs.get(run_label)
        if run_id and run_id not in self._run_steps:
            self._run_steps[run_id] = [int(s) for s in tl.run_steps(self.state.store, run_id)["train_step"]]
        objs = [WHOLE_RUN] + [f"step {s}" for s in self._run_steps.get(run_id, [])]
        cur = getattr(self, f"{side}_step")
        set_choices(self, f"{side}_step", objs, value if value in objs else cur if cur in objs else WHOLE_RUN)

    @param.depends("a_run", "b_run", watch=True)
    def _sync_sides(self) -> None:
        """A side's run changed: offer its steps (keeping the picked one when it has it), then diff."""
        if self._quiet or self._defer():
            return
        self._quiet = True
        try:
            self._set_steps(self.a_run, "a")
            self._set_steps(self.b_run, "b")
        finally:
            self._quiet = False
        self._load_diff()

    def side(self, which: str) -> Side | None:
        """Side ``"a"`` or ``"b"`` as picked."""
        run = self._all_runs.get(getattr(self, f"{which}_run"))
        step = getattr(self, f"{which}_step")
        if not run:
            return None
        return Side(run, None if step == WHOLE_RUN else int(step.split()[-1]))

    # -- timeline -------------------------------------------------------------------------
    def run_id(self) -> str | None:
        return self._runs.get(self.run)

    def prompt_id(self) -> str | None:
        return self._prompts.get(self.prompt)

    @param.depends("run", "search", watch=True)
    def _load_prompts(self) -> None:
        if self._quiet or self._defer():
            return
        run_id, search = self.run_id(), self.search
        rv = self.state.rule_version or None
        if not run_id:
            self._set_prompts(pd.DataFrame())
            return
        self._background("prompts", lambda: tl.prompts_across_steps(self.state.store, run_id, search=search,
                                                                    rule_version_id=rv),
                         self._set_prompts, lambda msg: setattr(self._prompt_info, "object", banner("error", msg)))

    def _set_prompts(self, df: pd.DataFrame) -> None:
        labels: dict[str, str] = {}
        for r in df.itertuples():
            change = f"{fmt_num(r.reward_first, '.2f')}→{fmt_num(r.reward_last, '.2f')}"
            text = " ".join(str(r.prompt).split())
            labels[f"{text[:70]} · {r.steps} steps · {change} · {r.prompt_id[-5:]}"] = r.prompt_id
        pin = self._pin if self._pin and self._pin[2] == self.run_id() else None
        if pin and pin[1] not in labels.values():
            labels = {pin[0]: pin[1], **labels}
        self._prompts = labels
        keep = next(k for k, v in labels.items() if v == pin[1]) if pin else None
        keep = keep or (self.prompt if self.prompt in labels else None)
        self._pin = None  # kept once: the next list (another run, a search) is the user's
        new = keep or next(iter(labels), None)
        self._quiet = True
        try:
            set_choices(self, "prompt", list(labels), new)
        finally:
            self._quiet = False
        self._load_timeline()

    def show_prompt(self, prompt_id: str, run_id: str | None = None, step: int | None = None) -> bool:
        """Show ``prompt_id``'s timeline (in ``run_id`` when it has 2+ steps, else the current
        run), with ``step`` listed. False when the prompt is not in the store."""
        st = self.state
        label = next((k for k, v in self._runs.items() if v == run_id), None) if run_id else None
        text = tl.prompt_text(st.store, prompt_id)
        if text is None:
            return False
        plabel = next((k for k, v in self._prompts.items() if v == prompt_id), None)
        if plabel is None:
            plabel = f"{' '.join(text.split())[:70]} · {prompt_id[-5:]}"
        self._want_step = step
        if label and label != self.run:
            self._pin = (plabel, prompt_id, run_id)
            self.run = label  # reloads the prompt list, which keeps the pinned prompt
            return True
        self._prompts = {plabel: prompt_id, **self._prompts}
        self._quiet = True
        try:
            set_choices(self, "prompt", list(self._prompts), plabel)
        finally:
            self._quiet = False
        self._load_timeline()
        return True

    @param.depends("state.rollout_id", watch=True)
    def _follow_selection(self) -> None:
        """A rollout selected anywhere: show its prompt's timeline in its run (when that run has steps)."""
        rid = self.state.rollout_id
        if not rid or not self._loaded:
            return
        if rid in set(self._step_rows.get("rollout_id", [])):  # picked in our own list: just re-mark it
            self._draw_steps()
            return
        try:
            place = tl.rollout_place(self.state.store, rid)
        except StoreError:
            return
        if place is None or place["train_step"] is None or place["run_id"] not in self._runs.values():
            return
        self.show_prompt(place["prompt_id"], place["run_id"], place["train_step"])

    @param.depends("prompt", watch=True)
    def _load_timeline(self) -> None:
        if self._quiet or self._defer():
            return
        pid, run_id, rv = self.prompt_id(), self.run_id(), self.state.rule_version or None
        if not pid or not run_id:
            self._timeline = pd.DataFrame()
            self._plot.visible = False
            self._step_list.object = ""
            msg = ("No run has rollouts at 2+ training steps yet: mini-runs and imported training runs do."
                   if not self._runs else self._why_no_prompt(run_id) if run_id else "")
            self._prompt_info.object = f'<div class="empty">{esc(msg)}</div>' if msg else ""
            return
        self._background("timeline", lambda: (tl.prompt_timeline(self.state.store, pid, run_id, rv),
                                              tl.prompt_text(self.state.store, pid)),
                         lambda res: self._show_timeline(*res),
                         lambda msg: setattr(self._prompt_info, "object", banner("error", msg)))

    def _why_no_prompt(self, run_id: str) -> str:
        """Why the run's prompt list is empty (``timeline_html.no_timeline_text``, with its settings)."""
        row = lookups.run_state(self.state.store, run_id)
        config = json.loads(row["config"]) if row is not None and isinstance(row["config"], str) else None
        return no_timeline_text(self._step_count.get(run_id, 0), config, self.search)

    def _show_timeline(self, df: pd.DataFrame, text: str | None) -> None:
        with pn.io.hold():  # the prompt's line, its step picker and its plots reach the browser together
            self._show_timeline_now(df, text)

    def _show_timeline_now(self, df: pd.DataFrame, text: str | None) -> None:
        self._timeline = df
        steps = [int(s) for s in df["train_step"]] if len(df) else []
        self._steps = {f"step {s}": s for s in steps}
        want, self._want_step = self._want_step, None
        cur = self._steps.get(self.step)
        pick = want if want in steps else cur if cur in steps else (steps[-1] if steps else None)
        self._prompt_info.object = prompt_info_html(df, text)
        label = f"step {pick}" if pick is not None else None
        self._quiet = True  # the plot is drawn below with the new step marked
        try:
            set_choices(self, "step", list(self._steps), label)
        finally:
            self._quiet = False
        self._draw_plot()
        self._load_step()

    def _draw_plot(self) -> None:
        """Draw the timeline's plots for a new prompt (a new step only moves the marker)."""
        df = self._timeline
        self._plot.visible = not df.empty
        if df.empty:
            return
        hv = holoviews()
        self._spans = {}
        step = self._steps.get(self.step)
        plots = [reward_plot(df, step, self._spans), entropy_plot(df, step, self._spans),
                 length_plot(df, step, self._spans)]
        tap = hv.streams.Tap(source=plots[0], x=None)  # a click on the reward plot lists that step
        tap.add_subscriber(self._on_tap)
        with pn.io.hold():
            for pane, plot in zip(self._plots, plots):
                pane.object = plot.opts(toolbar=None)

    def _on_tap(self, x=None, y=None) -> None:
        if x is None or self._timeline.empty:
            return
        steps = self._timeline["train_step"].to_numpy()
        nearest = int(steps[np.argmin(np.abs(steps - x))])
        label = f"step {nearest}"
        if label in self._steps and label != self.step:
            self.step = label

    @param.depends("step", watch=True)
    def _on_step(self) -> None:
        if self._quiet or self._defer():
            return
        step, spans = self._steps.get(self.step), list(self._spans.values())

        def move() -> None:  # the plots stay; only the marker moves
            for span in spans:
                span.update(location=step if step is not None else 0, line_alpha=1 if step is not None else 0)

        pn.state.execute(move, schedule=True)  # a Bokeh model: changed on a next tick, under the document lock
        self._load_step()

    @param.depends("state.estimator", "state.kl_beta", "state.reference", "state.gae_gamma", "state.gae_lam",
                   "state.value_source", watch=True)
    def _on_credit(self) -> None:
        """The sidebar's advantage settings changed: the step list's advantages follow."""
        if not self._defer():
            self._load_step()

    def _load_step(self) -> None:
        pid, run_id, step = self.prompt_id(), self.run_id(), self._steps.get(self.step)
        if not pid or not run_id or step is None:
            self._step_rows = pd.DataFrame()
            self._step_list.object = ""
            return
        st = self.state
        rv, cr = st.rule_version or None, st.credit()
        self._background("step", lambda: tl.timeline_rollouts(st.store, pid, run_id, step, rv, cr),
                         lambda df: self._show_step(step, pid, df),
                         lambda msg: setattr(self._step_list, "object", banner("error", msg)))

    def _show_step(self, step: int, pid: str, df: pd.DataFrame) -> None:
        self._step_rows = df
        self._step_label = step
        self._step_prompt = pid
        self._draw_steps()

    def _draw_steps(self) -> None:
        df = self._step_rows
        head = (f'<div class="meta-line"><b>step {self._step_label}</b><span>{len(df)} completions'
                f'{" (first " + str(tl.MAX_STEP_ROLLOUTS) + ")" if len(df) >= tl.MAX_STEP_ROLLOUTS else ""}</span>'
                '<span class="muted">click one to open it in the token strip</span></div>')
        self._step_list.object = head + steps_html(df, self.state.rollout_id, self._step_prompt, self._step_label)

    def _on_click(self, kind: str, value: str) -> None:
        if kind == "open" and value:
            self.state.open_rollout(value)
        elif kind == "mover" and value:
            d = self._diff
            runs = [s.run_id for s in (d.b, d.a)] if d else []
            run = next((r for r in runs if r in self._runs.values()), None)
            self.show_prompt(value, run)

    # -- run diff -------------------------------------------------------------------------
    @param.depends("a_step", "b_step", watch=True)
    def _load_diff(self) -> None:
        if self._quiet or self._defer():
            return
        a, b = self.side("a"), self.side("b")
        if a is None or b is None:
            self._summary.object = '<div class="empty">No runs with rollouts yet.</div>'
            self._scatter.visible, self._movers.object = False, ""
            return
        rv = self.state.rule_version or None
        self._summary.object = '<div class="empty">comparing…</div>'
        self._background("diff", lambda: tl.run_diff(self.state.store, a, b, rv), self._show_diff,
                         lambda msg: setattr(self._summary, "object", banner("error", msg)))

    def _show_diff(self, d: tl.RunDiff) -> None:
        self._diff = d
        with pn.io.hold():  # summary, scatter and movers reach the browser together
            self._scatter.visible = d.n > 0
            if d.n > 0:
                m = d.movers(N_MOVERS)
                self._scatter.object = diff_scatter(*scatter_points(d, m))
                self._movers.object = movers_html(m)
            else:
                self._movers.object = ""
            self._summary.object = summary_html(d)

    def __panel__(self):
        return self._layout
