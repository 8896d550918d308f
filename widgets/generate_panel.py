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
from studio import queries
from studio.generation import GenerateConfig, generate
from studio.tasks import TaskParseError

from .state import StudioState
from .style import CSS, banner


class GeneratePanel(pn.viewable.Viewer):
    """Controls to sample new rollouts from the policy."""

    state = param.ClassSelector(class_=StudioState, doc="Shared studio state.")
    picked = param.ListSelector(default=[], objects=[], doc="Prompts picked from the store.")
    typed = param.String(default="", doc="Prompts typed in, one per line (e.g. 'Q: 23+48-7=').")
    group_size = param.Integer(default=GenerateConfig.group_size, bounds=(1, 64), doc="Completions per prompt.")
    temperature = param.Number(default=GenerateConfig.temperature, bounds=(0.0, 2.0), step=0.05, doc="Sampling temperature.")
    top_p = param.Number(default=GenerateConfig.top_p, bounds=(0.05, 1.0), step=0.05, doc="Nucleus sampling mass.")
    max_new_tokens = param.Integer(default=GenerateConfig.max_new_tokens, bounds=(1, 512), doc="Longest completion.")
    seed = param.Integer(default=GenerateConfig.seed, doc="Sampler seed.")
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
            pn.Row(pn.widgets.IntInput.from_param(self.param.group_size, name="Group size", width=100,
                                                  css_classes=["group-size"]),
                   pn.widgets.FloatInput.from_param(self.param.temperature, name="Temperature", width=100),
                   sizing_mode="stretch_width"),
            pn.Row(pn.widgets.FloatInput.from_param(self.param.top_p, name="Top-p", width=100),
                   pn.widgets.IntInput.from_param(self.param.max_new_tokens, name="Max tokens", width=100),
                   sizing_mode="stretch_width"),
            pn.widgets.IntInput.from_param(self.param.seed, name="Seed", width=100),
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
        return list(self.picked) + [line for line in self.typed.splitlines() if line.strip()]

    async def _on_generate(self, event=None) -> None:
        if self.running:
            return
        config = GenerateConfig(group_size=self.group_size, temperature=self.temperature, top_p=self.top_p,
                                max_new_tokens=self.max_new_tokens, seed=self.seed)
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
        except (TaskParseError, PolicyLoadError, ValueError) as exc:
            self._status.object = banner("error", str(exc))
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
            self.state.refresh += 1
            self.state.group_id = result.group_ids[0]

    def __panel__(self):
        return self._layout
