"""Generate: pick or type prompts, choose a group size, sample in a worker with progress.

The sampling runs in a worker process; this callback only awaits it, so the page stays
responsive. Bad input (an unparsable prompt, a missing policy folder, invalid settings) is
shown in place and nothing is written.
"""
from __future__ import annotations

import threading

import panel as pn
import param

from backends import PolicyLoadError
from studio import queries, rules
from studio.generation import BOUNDS, ConfigError, GenerateConfig, generate
from studio.store import StoreError
from studio.tasks import TaskParseError, get_task
from studio.tasks.arithmetic import DIFFICULTIES

from .state import StudioState
from .style import CSS, banner


class GeneratePanel(pn.viewable.Viewer):
    """Controls to sample new rollouts from the policy."""

    state = param.ClassSelector(class_=StudioState, doc="Shared studio state.")
    picked = param.ListSelector(default=[], objects=[], doc="Prompts picked from the store.")
    typed = param.String(default="", doc="Prompts typed in, one per line (e.g. 'Q: 23+48-7=').")
    fresh = param.Integer(default=0, bounds=(0, 256), doc="New prompts drawn from the task's generator (seeded).")
    difficulty = param.Selector(default="medium", objects=list(DIFFICULTIES), doc="Difficulty of the new prompts.")
    # defaults and bounds come from GenerateConfig / BOUNDS: one source of truth
    group_size = param.Integer(default=GenerateConfig.group_size, bounds=BOUNDS["group_size"],
                               doc="Completions per prompt: one GRPO group.")
    temperature = param.Number(default=GenerateConfig.temperature, bounds=BOUNDS["temperature"], step=0.05,
                               doc="Sampling temperature; 0 is greedy.")
    top_p = param.Number(default=GenerateConfig.top_p, bounds=BOUNDS["top_p"], step=0.05,
                         doc="Nucleus sampling mass; 1 samples the full distribution.")
    max_new_tokens = param.Integer(default=GenerateConfig.max_new_tokens, bounds=BOUNDS["max_new_tokens"],
                                   doc="Longest completion, in tokens.")
    seed = param.Integer(default=GenerateConfig.seed, doc="Sampler seed: same seed, prompts and policy, same rollouts.")
    top_k_stats = param.Integer(default=GenerateConfig.top_k_stats, bounds=BOUNDS["top_k_stats"],
                                doc="Alternatives recorded per token (hover card).")
    running = param.Boolean(default=False, doc="Whether a Generate run is in progress.")

    def __init__(self, **params):
        super().__init__(**params)
        self._cancel = threading.Event()
        self._refresh_prompts()
        self._go = pn.widgets.Button(name="Generate", button_type="primary", sizing_mode="stretch_width",
                                     css_classes=["generate-button"])
        self._stop = pn.widgets.Button(name="Cancel", button_type="light", sizing_mode="stretch_width", disabled=True)
        self._go.on_click(self._on_generate)
        self._stop.on_click(lambda e: self._cancel.set())
        self._progress = pn.indicators.Progress(value=0, max=100, sizing_mode="stretch_width", visible=False,
                                                bar_color="primary", height=14)
        self._status = pn.pane.HTML("", stylesheets=[CSS], sizing_mode="stretch_width", css_classes=["generate-status"])
        self._layout = pn.Column(
            pn.widgets.MultiChoice.from_param(self.param.picked, name="Sample prompts", max_items=64,
                                              sizing_mode="stretch_width", placeholder="pick prompts…"),
            pn.widgets.TextAreaInput.from_param(self.param.typed, name="…or type prompts, one per line",
                                                placeholder="Q: 23+48-7=", height=70, sizing_mode="stretch_width",
                                                css_classes=["typed-prompts"]),
            pn.Row(pn.widgets.IntInput.from_param(self.param.fresh, name="New prompts", width=100,
                                                  css_classes=["fresh-prompts"]),
                   pn.widgets.Select.from_param(self.param.difficulty, name="Difficulty", width=100),
                   sizing_mode="stretch_width"),
            pn.Row(pn.widgets.IntInput.from_param(self.param.group_size, name="Group size", width=100,
                                                  css_classes=["group-size"]),
                   pn.widgets.FloatInput.from_param(self.param.temperature, name="Temperature", width=100),
                   sizing_mode="stretch_width"),
            pn.Row(pn.widgets.FloatInput.from_param(self.param.top_p, name="Top-p", width=100),
                   pn.widgets.IntInput.from_param(self.param.max_new_tokens, name="Max tokens", width=100),
                   sizing_mode="stretch_width"),
            pn.Row(pn.widgets.IntInput.from_param(self.param.seed, name="Seed", width=100),
                   pn.widgets.IntInput.from_param(self.param.top_k_stats, name="Top-k recorded", width=100),
                   sizing_mode="stretch_width"),
            pn.Row(self._go, self._stop, sizing_mode="stretch_width"),
            self._progress, self._status,
            sizing_mode="stretch_width",
        )

    @param.depends("state.refresh", watch=True)
    def _refresh_prompts(self) -> None:
        prompts = queries.sample_prompts(self.state.store)
        self.param.picked.objects = prompts
        self.picked = [p for p in self.picked if p in prompts]

    def prompts(self) -> list[str]:
        """Picked, typed, then freshly drawn prompts (drawn with the sampler's seed)."""
        drawn = get_task("arithmetic").make_prompts(self.fresh, seed=self.seed, difficulty=self.difficulty)
        return list(self.picked) + [line for line in self.typed.splitlines() if line.strip()] + [p.text for p in drawn]

    async def _on_generate(self, event=None) -> None:
        if self.running:
            return
        config = GenerateConfig(group_size=self.group_size, temperature=self.temperature, top_p=self.top_p,
                                max_new_tokens=self.max_new_tokens, seed=self.seed, top_k_stats=self.top_k_stats)
        self._cancel.clear()
        self.running = True
        self._go.disabled, self._stop.disabled = True, False
        self._progress.value, self._progress.visible = 0, True
        self._status.object = banner("info", "Starting the sampling worker…")

        def progress(done: int, total: int, msg: str) -> None:
            self._progress.value = int(100 * done / max(total, 1))
            self._status.object = banner("info", msg)

        try:
            result = await generate(self.state.store, self.state.policy_path, self.prompts(), config,
                                    on_progress=progress, cancel=self._cancel)
        except (TaskParseError, PolicyLoadError, ConfigError, StoreError) as exc:  # bad input: say what
            self._status.object = banner("error", str(exc))
            result = None
        except Exception as exc:  # anything else is still shown in place; the page lives on
            self._status.object = banner("error", f"Generate failed: {type(exc).__name__}: {exc}")
            result = None
        finally:
            self.running = False
            self._go.disabled, self._stop.disabled = False, True
            self._progress.visible = False
        if result is None:
            return
        if result.status == "failed":
            self._status.object = banner("error", f"Generate failed: {result.error}")
        else:
            where = f" on {result.device}" if result.device else ""
            self._status.object = banner("info", f"{result.status}: {result.rollouts} rollouts stored{where}.")
            if result.rollouts:
                also = await rules.score_new_run(self.state.store, result.run_id, self.state.rule_version)
                if also:
                    self._status.object = banner("info" if also.startswith("also") else "warn",
                                                 f"{result.status}: {result.rollouts} rollouts stored{where}; {also}.")
        if result.rollouts:  # one batch: views that depend on both reload once
            self.state.param.update(refresh=self.state.refresh + 1, group_id=result.group_ids[0])

    def __panel__(self):
        return self._layout
