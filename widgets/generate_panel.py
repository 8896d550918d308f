"""Generate: pick or type prompts, choose a group size, sample in a worker with progress.

The sampling runs in a worker process; this callback only awaits it, so the page stays
responsive. Bad input (an unparsable prompt, a missing policy folder, a backend that does
not answer, invalid settings) is shown in place and nothing is written.

The first line says where the policy runs (:class:`BackendStatus`): the local worker (CPU
or CUDA, known once it has run), or a remote backend with its health, checked off the
page's event loop within seconds, with a Retry when it is down or slow.
"""
from __future__ import annotations

import urllib.parse
from pathlib import Path

import panel as pn
import param

from studio import queries
from studio.rewards import rules
from studio.runs.generation import ConfigError, GenerateConfig, generate
from studio.runs.registry import local_device, note_local_device
from studio.store import StoreError
from studio.tasks import TaskParseError, get_task
from studio.tasks.arithmetic import DIFFICULTIES
from studio.workers.vocab import PolicyLoadError, backend_info, is_policy_url
from widgets.forms import parameter

from .base.jobs import Job, failure, served
from .base.state import StudioState
from .base.style import CSS, banner, esc

BACKEND_CSS = """
.backend-line { font-size:12px; color:#495057; display:flex; align-items:center; gap:5px; flex-wrap:wrap;
                margin:2px 0; }
.backend-line b { color:#212529; font-weight:600; }
.backend-line .sep { color:#adb5bd; }
.backend-dot { display:inline-block; width:8px; height:8px; border-radius:50%; flex:none; }
.backend-dot.ok { background:#37b24d; } .backend-dot.warn { background:#f59f00; }
.backend-dot.bad { background:#e03131; } .backend-dot.idle { background:#ced4da; }
.backend-note { font-size:11px; color:#868e96; margin:0 0 2px 13px; }
.backend-note.bad { color:#a61e4d; white-space:pre-wrap; }
"""
SLOW_S = 1.0  # a health check slower than this is shown as slow
CHECK_EVERY_MS = 30_000  # a remote backend's health is checked again this often while the page is open


def backend_html(policy: str, state: str, info=None, error: str | None = None, device: str | None = None) -> str:
    """The backend line: where ``policy`` runs and how it is (``state``: local, checking, ok, down).

    ``info`` is a remote backend's ``BackendInfo``; ``error`` why it did not answer; ``device``
    a local worker's device once known.
    """
    if not is_policy_url(policy):
        from sample_data import POLICY_DIR

        p = Path(policy)
        name = "sample policy" if p.resolve() == POLICY_DIR.resolve() else p.name
        if device:
            where = f"<b>{esc(device.upper())}</b>"
        else:
            where = '<span title="the worker loads the policy on the first Generate or Branch">CUDA if present, else CPU</span>'
        return (f'<div class="backend-line"><span class="backend-dot {"ok" if device else "idle"}"></span>'
                f'<span>local worker</span><span class="sep">·</span><b>{esc(name)}</b><span class="sep">·</span>'
                f'{where}</div>')
    host = urllib.parse.urlsplit(policy).netloc or policy
    head = (f'<span>remote</span><span class="sep">·</span><b title="{esc(policy)}">{esc(host)}</b>')
    if state == "checking":
        return f'<div class="backend-line"><span class="backend-dot idle"></span>{head}<span>· checking…</span></div>'
    if state == "down" or info is None:
        return (f'<div class="backend-line"><span class="backend-dot bad"></span>{head}<span class="sep">·</span>'
                f'<b>not answering</b></div><div class="backend-note bad">{esc(error or "")}</div>')
    ms = info.latency_s * 1000
    slow = info.latency_s > SLOW_S
    dot = "warn" if slow or not info.extension else "ok"
    line = (f'<div class="backend-line"><span class="backend-dot {dot}"></span>{head}<span class="sep">·</span>'
            f'<span>{esc(info.model)}</span><span class="sep">·</span><span>{esc(info.device or "device not reported")}'
            f'</span><span class="sep">·</span><span title="round trip of GET /v1/models">'
            f'{"slow: " if slow else ""}{ms:,.0f} ms</span></div>')
    if not info.extension:
        line += ('<div class="backend-note">plain OpenAI-compatible server: entropy estimated from the top-20 '
                 'logprobs (a lower bound); branching needs a rollout-studio backend</div>')
    return line


class BackendStatus(pn.viewable.Viewer):
    """Where the session's policy runs and whether it answers; Retry when it does not."""

    state = param.ClassSelector(class_=StudioState, doc="Shared studio state.")
    healthy = param.Boolean(default=True, doc="False while a remote backend does not answer.")

    def __init__(self, **params):
        super().__init__(**params)
        self._line = pn.pane.HTML("", stylesheets=[CSS, BACKEND_CSS], sizing_mode="stretch_width", margin=(0, 5),
                                  css_classes=["backend-status"])
        self._retry = pn.widgets.Button(name="Retry", color="light", width=64, height=28, visible=False,
                                        css_classes=["backend-retry"], margin=(0, 5))
        self._retry.on_click(lambda e: self.check())
        self._job = Job()  # the health check: the newest (the policy picked last) owns the line
        self._layout = pn.Row(self._line, self._retry, sizing_mode="stretch_width", margin=0)
        self.check()
        if served():  # one poll per open page
            pn.state.add_periodic_callback(self._poll, period=CHECK_EVERY_MS)

    @property
    def policy(self) -> str:
        return str(self.state.policy_path)

    @param.depends("state.policy_path", watch=True)
    def check(self) -> None:
        """Show the local worker at once; ask a remote backend (off the event loop)."""
        policy = self.policy
        if not is_policy_url(policy):
            self._job.ticket()  # answered at once: a remote check still in flight is dropped
            self._line.object = backend_html(policy, "local", device=local_device(policy))
            self._retry.visible, self.healthy = False, True
            return
        self._line.object = backend_html(policy, "checking")
        self._retry.disabled = True

        def ask():
            try:
                return backend_info(policy), None
            except PolicyLoadError as exc:  # a RemoteError (down, slow, refused) or a malformed URL
                return None, str(exc)

        def show(result) -> None:
            info, error = result
            self._line.object = backend_html(policy, "ok" if info else "down", info=info, error=error)
            self.healthy = info is not None
            self._retry.visible, self._retry.disabled = info is None or info.latency_s > SLOW_S, False

        self._job.submit(ask, show)  # off the event loop; the policy may change meanwhile: the newest check wins

    def ran_on(self, device: str | None) -> None:
        """A job finished on ``device`` (a result's device): a local worker's device is now known."""
        if device and not is_policy_url(self.policy) and not device.startswith("remote"):
            note_local_device(self.policy, device)
            self.check()

    def _poll(self) -> None:
        if is_policy_url(self.policy):
            self.check()

    def __panel__(self):
        return self._layout


class GeneratePanel(pn.viewable.Viewer):
    """Controls to sample new rollouts from the policy."""

    state = param.ClassSelector(class_=StudioState, doc="Shared studio state.")
    picked = param.ListSelector(default=[], objects=[], doc="Prompts picked from the store.")
    typed = param.String(default="", doc="Prompts typed in, one per line (e.g. 'Q: 23+48-7=').")
    fresh = param.Integer(default=0, bounds=(0, 256), doc="New prompts drawn from the task's generator (seeded).")
    difficulty = param.Selector(default="medium", objects=list(DIFFICULTIES), doc="Difficulty of the new prompts.")
    # defaults, bounds and help are GenerateConfig's fields (studio.configs): one source of truth
    group_size = parameter(GenerateConfig, "group_size")
    temperature = parameter(GenerateConfig, "temperature", step=0.05)
    top_p = parameter(GenerateConfig, "top_p", step=0.05)
    max_new_tokens = parameter(GenerateConfig, "max_new_tokens")
    seed = parameter(GenerateConfig, "seed")
    top_k_stats = parameter(GenerateConfig, "top_k_stats")
    running = param.Boolean(default=False, doc="Whether a Generate run is in progress.")

    def __init__(self, **params):
        super().__init__(**params)
        self._job = Job(on_running=self._running)
        self._sample_prompts = self.state.fresh_read(("sample_prompts",), lambda: queries.sample_prompts(self.state.store))
        self._refresh_prompts()
        self._go = pn.widgets.Button(name="Generate", color="primary", sizing_mode="stretch_width",
                                     css_classes=["generate-button"])
        self._stop = pn.widgets.Button(name="Cancel", color="light", sizing_mode="stretch_width", disabled=True)
        self._go.on_click(self._on_generate)
        self._stop.on_click(lambda e: self._job.cancel())
        self._progress = pn.indicators.Progress(value=0, max=100, sizing_mode="stretch_width", visible=False,
                                                bar_color="primary", height=14)
        self._status = pn.pane.HTML("", stylesheets=[CSS], sizing_mode="stretch_width", css_classes=["generate-status"])
        self.backend = BackendStatus(state=self.state)
        self._layout = pn.Column(
            self.backend,
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
        prompts = self._sample_prompts()
        self.param.picked.objects = prompts
        self.picked = [p for p in self.picked if p in prompts]

    def prompts(self) -> list[str]:
        """Picked, typed, then freshly drawn prompts (drawn with the sampler's seed)."""
        drawn = get_task("arithmetic").make_prompts(self.fresh, seed=self.seed, difficulty=self.difficulty)
        return list(self.picked) + [line for line in self.typed.splitlines() if line.strip()] + [p.text for p in drawn]

    def _running(self, on: bool) -> None:
        """A Generate starts (``on``) or ends: buttons and progress bar follow."""
        self.running = on
        self._go.disabled, self._stop.disabled = on, not on
        if on:
            self._progress.value = 0
        self._progress.visible = on

    async def _on_generate(self, event=None) -> None:
        if self.running:
            return
        config = GenerateConfig(group_size=self.group_size, temperature=self.temperature, top_p=self.top_p,
                                max_new_tokens=self.max_new_tokens, seed=self.seed, top_k_stats=self.top_k_stats)
        with self._job.claim() as cancel:
            self._status.object = banner("info", "Starting the sampling worker…")

            def progress(done: int, total: int, msg: str) -> None:
                self._progress.value = int(100 * done / max(total, 1))
                self._status.object = banner("info", msg)

            try:
                result = await generate(self.state.store, self.state.policy_path, self.prompts(), config,
                                        on_progress=progress, cancel=cancel)
            except (TaskParseError, PolicyLoadError, ConfigError, StoreError) as exc:  # bad input: say what
                self._status.object = banner("error", str(exc))
                result = None
            except Exception as exc:  # anything else is still shown in place; the page lives on
                self._status.object = banner("error", failure("Generate", exc))
                result = None
        if result is None or result.status == "failed":
            if is_policy_url(str(self.state.policy_path)):  # the backend may be down: the line says so, with Retry
                self.backend.check()
            if result is None:
                return
            self._status.object = banner("error", f"Generate failed: {result.error}")
        else:
            self.backend.ran_on(result.device)
            where = f" on {result.device}" if result.device else ""
            self._status.object = banner("info", f"{result.status}: {result.rollouts} rollouts stored{where}.")
            if result.rollouts:
                also = await rules.score_new_run(self.state.store, result.run_id, self.state.rule_version)
                if also:
                    self._status.object = banner("info" if also.startswith("also") else "warn",
                                                 f"{result.status}: {result.rollouts} rollouts stored{where}; {also}.")
        if result.rollouts:  # one batch: views that depend on both reload once, in one message to the page
            await self.state.stored(group_id=result.group_ids[0])

    def __panel__(self):
        return self._layout
