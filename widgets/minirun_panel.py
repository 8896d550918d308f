"""The "Mini-runs" tab: a settings form generated from ``MiniRunConfig``, start / stop /
resume, a progress bar with ETA, live curves of several runs overlaid (a click on a curve
opens that step's rollouts), and two policies evaluated side by side on held-out prompts.

The task picker lists the built-in tasks (arithmetic, the agent world's ``calculator_agent``)
and the store's prompt sets; the prompt set picker offers the task's own sets (easy / medium /
hard / mixed draws of a built-in task, a stored prompt set's splits) and the prompts of any
stored run (``run:<id>``). Two runs are compared side by side below
(:class:`widgets.minirun_compare.RunComparison`: e.g. without and with a mismatch correction). A run starts on the picked task, and the evaluation runs on its
held-out prompts (a stored prompt set's test split). Picking an agent task sets the form to its
own defaults (the sample agent policy, its budgets); an agent run adds a row of curves: turns,
tool calls and failed tool calls per trajectory.

Every browser session polls the process-wide run registry (``studio.runs.minirun``) once a
second, so two tabs watching one run both update; the store is written by the run's
reader thread, never by a view.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

import pandas as pd
import panel as pn
import param

from sample_data import EARLY_POLICY_DIR, POLICY_DIR
from studio.configs import settings_of
from studio.queries import lookups
from studio.queries.prompts import split_counts, task_choices
from studio.runs import minirun
from studio.runs.minirun import CURVES
from studio.runs.registry import known_policies
from studio.runs.training import PROMPT_SETS, MiniRunConfig, TrainConfigError, task_defaults
from studio.runs.training.config import heldout_split
from studio.store import StoreError
from studio.tasks import UnknownTaskError, get_task
from widgets.forms import widget_for

from .base.jobs import Job, failure
from .base.lazy import LazyView
from .base.plots import holoviews, plot_opts, step_ticks
from .base.state import StudioState
from .base.style import CSS, banner, esc
from .minirun_compare import LABELS, PALETTE, RUN_CSS, RunComparison, legend_html, summary_html

AGENT_EVAL = ("turns", "tool_calls", "tool_errors")  # an agent task's evaluation adds them, per trajectory
PLOT_H = 180  # one curve's height; the curves pane grows by a row of three


def _fmt_s(s: float | None) -> str:
    if s is None:
        return "–"
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.1f} min"


class MiniRunPanel(LazyView):
    """Start, watch, stop, resume and compare mini-runs."""

    state = param.ClassSelector(class_=StudioState, doc="Shared studio state.")
    watched = param.Selector(default=None, objects=[], allow_None=True, doc="The run the progress bar follows.")
    compared = param.ListSelector(default=[], objects=[], doc="Runs whose curves are overlaid.")

    def __init__(self, can_run: bool = True, **params):
        super().__init__(**params)
        self._can_run = can_run
        self._run_ids: dict[str, str] = {}
        self._seen: tuple = ()
        self._inputs: dict[str, pn.widgets.Widget] = {}
        for s in settings_of(MiniRunConfig):  # the form is the config's fields (studio.configs)
            fmt = {"format": "0.[000000]"} if s.kind is float else {}
            self._inputs[s.name] = widget_for(s, label=s.label, width=150, disabled=not can_run, **fmt)
        # the three settings whose values come from the store get pickers
        self._inputs["policy"] = pn.widgets.Select(name="policy", width=310, disabled=not can_run,
                                                   description=widget_for(settings_of(MiniRunConfig)[0]).description)
        self._inputs["prompt_set"] = pn.widgets.Select(name="prompt set", width=150, disabled=not can_run,
                                                       description="training prompts")
        self._task = pn.widgets.Select(name="task", options=["arithmetic"], value="arithmetic", width=150,
                                       disabled=not can_run, css_classes=["cfg-task"],
                                       description="what the policy is trained on: the arithmetic sample task, "
                                                   "or a prompt set the store holds")
        self._task.param.watch(self._on_task, "value")
        self._inputs["rule_version"] = pn.widgets.Select(name="reward (rule version)", width=310,
                                                         disabled=not can_run, css_classes=["train-rule"])
        for name, w in self._inputs.items():
            w.css_classes = list(w.css_classes or []) + [f"cfg-{name.replace('_', '-')}"]
        self._name = pn.widgets.TextInput(name="run name", placeholder="mini-run · grpo · 50 steps", width=310,
                                          disabled=not can_run, css_classes=["run-name"])
        self._start = pn.widgets.Button(name="Start mini-run", color="primary", width=125,
                                        disabled=not can_run, css_classes=["start-run"])
        self._stop = pn.widgets.Button(name="Stop", color="warning", width=70, disabled=True,
                                       css_classes=["stop-run"])
        self._resume = pn.widgets.Button(name="Resume", color="default", width=80, disabled=True,
                                         css_classes=["resume-run"])
        if can_run:
            self._start.on_click(self._on_start)
            self._stop.on_click(self._on_stop)
            self._resume.on_click(self._on_resume)
        self._message = pn.pane.HTML("", stylesheets=[CSS], sizing_mode="stretch_width", css_classes=["run-message"])
        self._status = pn.pane.HTML("", stylesheets=[CSS], sizing_mode="stretch_width", css_classes=["run-status"])
        self._progress = pn.indicators.Progress(value=0, max=100, bar_color="primary", sizing_mode="stretch_width",
                                                height=14, css_classes=["run-progress"])
        self._curves = pn.pane.HoloViews(None, sizing_mode="stretch_width", height=560, css_classes=["run-curves"])
        self._legend = pn.pane.HTML("", stylesheets=[CSS, RUN_CSS], sizing_mode="stretch_width", margin=(0, 10))
        self._table = pn.pane.HTML("", stylesheets=[CSS, RUN_CSS], sizing_mode="stretch_width", css_classes=["run-summary"])
        self._jump_step = pn.widgets.IntInput(name="step", value=1, start=1, width=90, css_classes=["jump-step"])
        self._jump = pn.widgets.Button(name="Show this step's rollouts", width=200, css_classes=["jump-button"])
        self._jump.on_click(lambda e: self.open_step(self.watched_id(), int(self._jump_step.value)))
        self._eval_a = pn.widgets.Select(name="Policy A", width=270, css_classes=["eval-a"])
        self._eval_b = pn.widgets.Select(name="Policy B", width=270, css_classes=["eval-b"])
        self._eval_go = pn.widgets.Button(name="Evaluate on 200 held-out prompts", color="primary", width=250,
                                          disabled=not can_run, css_classes=["eval-button"])
        if can_run:
            self._eval_go.on_click(self._on_eval)
        self._eval_job = Job(on_running=lambda on: setattr(self._eval_go, "disabled", on or not self._can_run))
        self._eval_out = pn.pane.HTML("", stylesheets=[CSS, RUN_CSS], sizing_mode="stretch_width", css_classes=["eval-result"])
        grid = [self._inputs[n] for n in ("estimator", "group_size", "prompts_per_step", "steps", "learning_rate",
                                          "clip_eps", "kl_beta", "entropy_q", "temperature", "max_new_tokens",
                                          "max_turns", "iterations", "loss_type", "n_prompts", "seed",
                                          "checkpoint_every", "lora_r", "sampler_precision", "correction",
                                          "is_cap", "is_low")]
        form = pn.Column(
            self._inputs["policy"], pn.Row(self._task, self._inputs["prompt_set"]), self._inputs["lora"],
            self._inputs["rule_version"],
            pn.GridBox(*grid, ncols=2), self._name,
            pn.Row(self._start, self._stop, self._resume), self._message,
            width=330, css_classes=["minirun-form"])
        watch = pn.Row(pn.widgets.Select.from_param(self.param.watched, name="Run", width=300, css_classes=["watched"]),
                       pn.widgets.MultiChoice.from_param(self.param.compared, name="Overlay runs",
                                                         sizing_mode="stretch_width", css_classes=["compared"]),
                       sizing_mode="stretch_width")
        evaluation = pn.Column(
            pn.pane.HTML('<div class="meta-line"><b>evaluate two policies</b> (accuracy over 4 samples at '
                         'temperature 1, pass@4, greedy accuracy, length, entropy)</div>', stylesheets=[CSS]),
            pn.FlexBox(self._eval_a, self._eval_b, pn.Column(pn.Spacer(height=18), self._eval_go, margin=0),
                       flex_wrap="wrap", align_items="flex-start", sizing_mode="stretch_width"), self._eval_out,
            sizing_mode="stretch_width")
        self._compare = RunComparison(state=self.state, can_run=can_run)
        self.param.watch(lambda e: setattr(self._compare, "shown", e.new), "shown")
        self._layout = pn.Row(
            form,
            pn.Column(watch, self._status, self._progress, self._legend, self._curves, self._table,
                      pn.Row(self._jump_step, pn.Column(pn.Spacer(height=18), self._jump)), evaluation,
                      self._compare, sizing_mode="stretch_width"),
            sizing_mode="stretch_width", css_classes=["minirun-panel"])
        self._sync_choices()
        self._cb = None
        if pn.state.curdoc is not None:  # one poll per browser session
            self._cb = pn.state.add_periodic_callback(self._tick, period=1000)

    # -- choices from the store ------------------------------------------------------------
    @param.depends("state.refresh", watch=True)
    def _sync_choices(self) -> None:
        st = self.state
        pols = known_policies(st.store)
        own = self._task_policy()
        if own and own not in pols.values():  # a bundled policy the pickers do not list (the sample agent policy)
            pols[f"sample {Path(own).name.replace('_', ' ')}"] = own
        self._inputs["policy"].options = pols
        if self._inputs["policy"].value not in pols.values():
            self._inputs["policy"].value = own or str(POLICY_DIR)
        for sel in (self._eval_a, self._eval_b):
            sel.options = pols
        if self._eval_a.value not in pols.values():
            self._eval_a.value = str(POLICY_DIR)
        if self._eval_b.value not in pols.values() or self._eval_b.value == self._eval_a.value:
            self._eval_b.value = list(pols.values())[-1] if len(pols) > 2 else str(EARLY_POLICY_DIR)
        try:
            tasks = task_choices(st.store)
            if self._task.options != tasks:
                self._task.options = tasks
            if self._task.value not in tasks:
                self._task.value = tasks[0]  # calls back here with the task set
                return
            splits = split_counts(st.store, self._task.value)
        except (UnknownTaskError, StoreError) as exc:
            self._message.object = banner("error", str(exc))
            splits = {}
        own = {f"{s} ({n:,} prompts)": s for s, n in splits.items()} if splits else {s: s for s in PROMPT_SETS}
        runs = lookups.source_runs(st.store)
        sets = own | {f"prompts of {r.name}": f"run:{r.run_id}" for r in runs.itertuples()}
        self._inputs["prompt_set"].options = sets
        if self._inputs["prompt_set"].value not in sets.values():
            self._inputs["prompt_set"].value = ("train" if "train" in splits else next(iter(own.values()))) \
                if splits else "medium"
        self._eval_go.name = ("Evaluate on 200 held-out prompts" if not splits else
                              f"Evaluate on held-out prompts ({self._heldout(splits)})")
        opts = {"the task's built-in rule": ""} | {(f"reward model · {v}" if rm else v): v
                                                    for v, rm in lookups.rule_versions_by_kind(st.store)}
        self._inputs["rule_version"].options = opts
        if self._inputs["rule_version"].value not in opts.values():
            self._inputs["rule_version"].value = ""
        self._sync_runs()

    def _task_policy(self) -> str | None:
        """The picked task's own default policy (an agent task's: the sample agent policy), or None."""
        try:
            return task_defaults(get_task(self._task.value)).get("policy")
        except UnknownTaskError:
            return None

    def _on_task(self, event) -> None:
        """Another task: its prompt sets, and the form follows its own defaults (an agent task: its
        policy and budgets, ``task_defaults``) where a setting is still at the old task's default."""
        self._sync_choices()
        try:
            old, new = (task_defaults(get_task(t)) if t else {} for t in (event.old, event.new))
        except UnknownTaskError:
            return
        base = MiniRunConfig().to_dict() | {"policy": str(POLICY_DIR)}  # what the form starts from
        for name in old.keys() | new.keys():
            w = self._inputs[name]
            if w.value in (base[name], old.get(name)):
                w.value = new.get(name, base[name])

    def _sync_runs(self) -> None:
        df = minirun.miniruns(self.state.store)
        self._run_ids = {f"{r.name} · {r.run_id[-6:]}": r.run_id for r in df.itertuples()}
        labels = list(self._run_ids)
        with param.parameterized.batch_call_watchers(self):
            self.param.watched.objects = labels
            self.param.compared.objects = labels
            if self.watched not in labels:
                self.watched = labels[0] if labels else None
            keep = [c for c in self.compared if c in labels]
            if keep != list(self.compared):
                self.compared = keep
        self._compare.sync(self._run_ids)

    def _heldout(self, splits: dict[str, int]) -> str:
        """The split a stored prompt set is evaluated on (``heldout_split``'s choice), as a label."""
        try:
            name = heldout_split(get_task(self._task.value))
        except (TrainConfigError, UnknownTaskError):
            return "none"
        return f"{name}, {min(200, splits.get(name, 0)):,}"

    def watched_id(self) -> str | None:
        return self._run_ids.get(self.watched)

    def use_rule(self, version: str) -> None:
        """Pick ``version`` as the reward of the next run ("Retrain with this rule")."""
        self._sync_choices()
        w = self._inputs["rule_version"]
        if version not in w.options.values():  # e.g. applied in another tab since the form last looked
            w.options = {**w.options, version: version}
        w.value = version
        self._message.object = banner("info", f"reward set to {version}: adjust the settings and press "
                                              "Start mini-run.")

    # -- actions ---------------------------------------------------------------------------
    def config(self) -> MiniRunConfig:
        return MiniRunConfig(**{n: w.value for n, w in self._inputs.items()})

    def _on_start(self, event=None) -> None:
        try:
            run_id = minirun.start(self.state.store, self.config(), name=self._name.value.strip() or None,
                                   task=self._task.value)
        except (TrainConfigError, minirun.MiniRunBusy, ValueError, OSError, KeyError) as exc:
            self._message.object = banner("error", str(exc))
            return
        self._message.object = banner("info", "started: the first step appears in a few seconds.")
        self._sync_runs()
        label = next(k for k, v in self._run_ids.items() if v == run_id)
        # the run watched until now stays on the plots: the new run's curves grow over the previous ones
        before = [c for c in (self.watched, *self.compared) if c and c != label]
        self.param.update(watched=label, compared=list(dict.fromkeys([label, *before]))[:4])
        self._tick()

    def _on_stop(self, event=None) -> None:
        if minirun.stop(self.watched_id() or ""):
            self._message.object = banner("info", "stopping after the step in flight (with a checkpoint)…")

    def _on_resume(self, event=None) -> None:
        try:
            minirun.resume(self.state.store, self.watched_id() or "")
        except (TrainConfigError, minirun.MiniRunBusy, ValueError, OSError) as exc:
            self._message.object = banner("error", str(exc))
            return
        self._message.object = banner("info", "resumed from the last checkpoint.")
        self._tick()

    async def _on_eval(self, event=None) -> None:
        a, b = self._eval_a.value, self._eval_b.value
        names = {v: k for k, v in self._eval_a.options.items()}
        with self._eval_job.claim():
            self._eval_out.object = banner("info", f"evaluating both policies on the held-out prompts of "
                                                   f"{self._task.value}…")
            try:
                ra = await minirun.evaluate(a, task=self._task.value, store=self.state.store)
                rb = await minirun.evaluate(b, task=self._task.value, store=self.state.store)
            except Exception as exc:  # a deleted checkpoint, a broken folder: say which
                self._eval_out.object = banner("error", failure("evaluation", exc))
                return
        rows = "".join(
            f'<tr><td>{esc(k)}</td><td>{ra[k]:.3f}</td><td>{rb[k]:.3f}</td><td><b>{rb[k] - ra[k]:+.3f}</b></td></tr>'
            for k in ("accuracy", "pass@4", "greedy_accuracy", "mean_length", "entropy", *AGENT_EVAL) if k in ra and k in rb)
        self._eval_out.object = (f'<table class="diff eval-table"><tr><th></th><th>A: {esc(names.get(a, a))}</th>'
                                 f'<th>B: {esc(names.get(b, b))}</th><th>B − A</th></tr>{rows}</table>')
        await asyncio.sleep(0)

    def open_step(self, run_id: str | None, step: int) -> None:
        """Show the rollouts of ``run_id`` sampled at ``step`` in the table, and open the first."""
        if not run_id:
            return
        self.state.param.update(jump_run=run_id, train_step=int(step))
        rid = lookups.first_rollout_at_step(self.state.store, run_id, int(step))
        if rid:
            self.state.open_rollout(rid)

    # -- live updates ------------------------------------------------------------------------
    def _tick(self) -> None:
        rid = self.watched_id()
        st = minirun.state_of(rid) if rid else None
        live = [r.run_id for r in minirun.live_runs()]
        key = (rid, st.step if st else None, st.status if st else None, tuple(live), tuple(self.compared),
               self.shown)
        if key == self._seen:
            return
        ended = st is not None and self._seen and self._seen[2] in ("starting", "running", "stopping") \
            and not st.live
        self._seen = key
        if any(r not in self._run_ids.values() for r in live):
            self._sync_runs()
        self._render_status(rid, st)
        self._render()
        if ended:  # new rollouts and checkpoints: let the other views and pickers see them
            self._message.object = banner("error" if st.status == "failed" else "info",
                                          f"{st.name}: {st.status} at step {st.step}" + (
                                              "; its checkpoints are now policies in the pickers"
                                              if st.status != "failed" else ""))
            self.state.refresh += 1

    def _render_status(self, rid: str | None, st) -> None:
        self._stop.disabled = not (self._can_run and st is not None and st.live)
        row = None
        if rid:
            row = lookups.run_state(self.state.store, rid)
        if row is None:
            self._status.object = '<div class="empty">No mini-runs yet: set the form on the left and start one.</div>'
            self._progress.value = 0
            self._resume.disabled = True
            return
        import json
        total = json.loads(row["config"]).get("steps", 0)
        done = lookups.steps_done(self.state.store, rid)
        status = st.status if st is not None else row["status"]
        self._resume.disabled = not (self._can_run and status in ("failed", "stopped", "interrupted")
                                     and (st is None or not st.live))
        per = float(pd.Series(st.step_times[-10:]).median()) if st is not None and st.step_times else None
        eta = st.eta_s() if st is not None and st.live else None
        self._progress.value = int(100 * done / total) if total else 0
        err = row["error"] if isinstance(row["error"], str) else (st.error if st is not None else None)
        self._status.object = (
            f'<div class="meta-line"><span>status <b class="run-state">{esc(status)}</b></span>'
            f'<span>step <b class="run-step">{done}</b> / {total}</span>'
            f'<span>{"–" if per is None else f"{per:.2f} s"} per step</span><span>ETA <b>{_fmt_s(eta)}</b></span>'
            f'<span>device <b>{esc(st.device or "…") if st is not None else "–"}</b></span></div>'
            + (banner("error", err) if err and status == "failed" else ""))

    @param.depends("compared", "watched", watch=True)
    def _render(self) -> None:
        if self._defer():
            return
        ids = [self._run_ids[c] for c in self.compared if c in self._run_ids]
        if self.watched_id() and self.watched_id() not in ids:
            ids = [self.watched_id(), *ids]
        if not ids:
            self._curves.object, self._table.object, self._legend.object = None, "", ""
            return
        df = minirun.metrics(self.state.store, ids)
        if df.empty:
            self._curves.object, self._table.object, self._legend.object = None, "", ""
            return
        hv = holoviews()
        colors = {r: PALETTE[i % len(PALETTE)] for i, r in enumerate(ids)}
        self._table.object = summary_html(minirun.summary(self.state.store, ids), colors)
        names = dict(zip(df["run_id"], df["run"]))
        plots = []
        step = ("train_step", "training step")
        for m in CURVES:
            sub = df[df["metric"] == m]
            value = ("value", LABELS[m])
            layers = [hv.Curve(sub[sub["run_id"] == r], step, value).opts(color=colors[r], line_width=2)
                      * hv.Scatter(sub[sub["run_id"] == r], step, value).opts(color=colors[r], size=4)
                      for r in ids if (sub["run_id"] == r).any()]
            if not layers:
                continue
            # no legend inside the plots (it covered the curves): the runs' colours are named above them
            ov = hv.Overlay(layers).opts(**plot_opts(title=LABELS[m], xlabel="training step", ylabel="", height=PLOT_H,
                                                 show_legend=False, tools=["hover", "tap"], **step_ticks()))
            plots.append(ov)
        # every run picked, one that has no step yet included: its curves start here
        picked = {rid: label.rsplit(" · ", 1)[0] for label, rid in self._run_ids.items()}
        self._legend.object = legend_html([(picked.get(r, names.get(r, r)), r, colors[r]) for r in ids])
        layout = hv.Layout(plots).cols(3).opts(shared_axes=False)
        # an agent run adds a row (turns, tool calls, failed calls per trajectory): the pane holds every row
        self._curves.height = (PLOT_H + 6) * -(-len(plots) // 3) + 2  # 560 for the three rows of a plain run
        watched = self.watched_id()
        tap = hv.streams.Tap(source=plots[0], x=None)
        tap.add_subscriber(lambda x, y: self.open_step(watched, int(round(x))) if x is not None and x >= 1 else None)
        self._curves.object = layout
        self._compare.refresh()  # a live run's new step on the comparison's curves too

    def __panel__(self):
        return self._layout
