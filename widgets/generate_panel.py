"""Generate: pick a task, draw prompts from one of its splits, pick or type prompts, choose a
group size, sample in a worker with progress.

The task picker lists the built-in arithmetic task and the store's prompt sets
(``studio.queries.prompts.task_choices``; refreshed when one is added). A prompt set's
prompts are drawn from a split with a seed (``draw_prompts``: the same seed draws the same
prompts), and kept as :class:`Prompt` objects so their gold answers and chat messages reach
``generate``; typed prompts are read by the task; the arithmetic task's "new prompts" with a
difficulty show for it alone.

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

from sample_data import AGENT_POLICY_DIR, CHAT_POLICY_DIR, EARLY_POLICY_DIR, POLICY_DIR
from studio import queries
from studio.queries import lookups
from studio.queries.prompts import PromptDrawError, draw_prompts, split_counts, task_choices
from studio.rewards import rules
from studio.runs.generation import ConfigError, GenerateConfig, generate
from studio.runs.training.config import AGENT_DEFAULTS
from studio.store import StoreError
from studio.tasks import Prompt, TaskParseError, UnknownTaskError, get_task
from studio.tasks.arithmetic import DIFFICULTIES
from studio.workers.processes import load_error, local_device, note_local_device, warm
from studio.workers.vocab import PolicyLoadError, backend_info, is_policy_url
from widgets.forms import parameter

from .base.jobs import Job, failure, served
from .base.pickers import set_choices
from .base.state import StudioState
from .base.style import CSS, banner, esc

AGENT_MAX_NEW_TOKENS = AGENT_DEFAULTS["max_new_tokens"]  # a trajectory's tool calls and answer fit in it


def _builtin(name: str | None):
    """The built-in task ``name`` (one the studio ships: it may make prompts), else None."""
    try:
        task = get_task(name) if name else None
    except UnknownTaskError:
        return None
    return task if task is not None and task.spec.get("kind") == "builtin" else None

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
DRAWN_CSS = """
.drawn { font-size:12px; color:#343a40; border:1px solid #e9ecef; border-radius:6px; background:#f8f9fa;
         max-height:150px; overflow:auto; }
.drawn .dp-head { display:flex; justify-content:space-between; padding:3px 8px; color:#6b7280; font-size:11px;
                  border-bottom:1px solid #e9ecef; position:sticky; top:0; background:#f8f9fa; }
.drawn ol { margin:0; padding:2px 8px 4px 26px; }
.drawn li { padding:1px 0; }
.drawn li .dp-text { display:inline-block; max-width:calc(100% - 56px); white-space:nowrap; overflow:hidden;
                     text-overflow:ellipsis; vertical-align:bottom; }
.drawn li .dp-gold { float:right; color:#2b8a3e; font-family:'DejaVu Sans Mono', monospace; font-size:11px; }
"""
SLOW_S = 1.0  # a health check slower than this is shown as slow
CHECK_EVERY_MS = 30_000  # a remote backend's health is checked again this often while the page is open


def backend_html(policy: str, state: str, info=None, error: str | None = None, device: str | None = None) -> str:
    """The backend line: where ``policy`` runs and how it is (``state``: local, checking, ok, down).

    ``info`` is a remote backend's ``BackendInfo``; ``error`` why it did not answer (a remote one) or
    could not load it (a local one); ``device`` a local worker's device once known.
    """
    if not is_policy_url(policy):
        from sample_data import POLICY_DIR

        p = Path(policy)
        name = "sample policy" if p.resolve() == POLICY_DIR.resolve() else p.name
        note, dot = "", "ok" if device else "idle"
        if device:
            where = f"<b>{esc(device.upper())}</b>"
        elif not (p / "config.json").is_file():
            where, dot = "<b>not a model folder</b>", "bad"
        elif error:
            where, dot = "<b>could not load it</b>", "bad"
            note = f'<div class="backend-note bad">{esc(error)}</div>'
        else:
            where = '<span title="the worker process is loading the policy; its device shows here once loaded">loading…</span>'
        return (f'<div class="backend-line"><span class="backend-dot {dot}"></span>'
                f'<span>local worker</span><span class="sep">·</span><b>{esc(name)}</b><span class="sep">·</span>'
                f'{where}</div>{note}')
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
            device, error = local_device(policy), load_error(policy)
            self._line.object = backend_html(policy, "local", device=device, error=error)
            self._retry.visible, self.healthy = False, True
            if device is None and error is None and (Path(policy) / "config.json").is_file():
                self._await_device(policy)
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

    def _await_device(self, policy: str) -> None:
        """Load ``policy`` in the worker now, and name its device once the worker reports it."""
        warm(policy)
        if not served():
            return

        def look() -> None:
            device, error = local_device(policy), load_error(policy)
            if device is not None or error is not None or self.policy != policy:
                poll.stop()
                if self.policy == policy:
                    self._line.object = backend_html(policy, "local", device=device, error=error)

        poll = pn.state.add_periodic_callback(look, period=1000, count=300)

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
    task = param.Selector(default="arithmetic", objects=["arithmetic"],
                          doc="The task: the sample arithmetic task, or a prompt set the store holds.")
    split = param.Selector(default=None, objects=[], allow_None=True, doc="The split prompts are drawn from.")
    n_draw = param.Integer(default=8, bounds=(1, 256), doc="How many prompts a draw takes from the split.")
    draw_seed = param.Integer(default=0, bounds=(0, None), doc="Seed of the draw: the same seed draws the same prompts.")
    picked = param.ListSelector(default=[], objects=[], doc="Prompts picked from the store.")
    typed = param.String(default="", doc="Prompts typed in, one per line (e.g. 'Q: 23+48-7=').")
    fresh = param.Integer(default=0, bounds=(0, 256), doc="New prompts drawn from the task's generator (seeded).")
    difficulty = param.Selector(default="medium", objects=list(DIFFICULTIES), doc="Difficulty of the new prompts.")
    # defaults, bounds and help are GenerateConfig's fields (studio.configs): one source of truth
    group_size = parameter(GenerateConfig, "group_size")
    temperature = parameter(GenerateConfig, "temperature", step=0.05)
    top_p = parameter(GenerateConfig, "top_p", step=0.05)
    max_new_tokens = parameter(GenerateConfig, "max_new_tokens")
    max_turns = parameter(GenerateConfig, "max_turns")
    seed = parameter(GenerateConfig, "seed")
    top_k_stats = parameter(GenerateConfig, "top_k_stats")
    running = param.Boolean(default=False, doc="Whether a Generate run is in progress.")

    def __init__(self, **params):
        super().__init__(**params)
        self._job = Job(on_running=self._running)
        self._drawn: list[Prompt] = []  # drawn from a split: kept whole (gold answers, chat messages)
        self._sample_prompts = self.state.fresh_read(("sample_prompts",), lambda: queries.sample_prompts(self.state.store))
        # what new rows change for the picked task, read with the others off the event loop (StudioState.stored)
        self._task_reads = self.state.fresh_read(("generate_task",), self._read_task)
        self._drawn_box = pn.pane.HTML("", stylesheets=[CSS, DRAWN_CSS], sizing_mode="stretch_width",
                                       css_classes=["drawn-prompts"], margin=(0, 5))
        self._draw = pn.widgets.Button(name="Draw prompts from the split", color="light", sizing_mode="stretch_width",
                                       css_classes=["draw-button"])
        self._draw.on_click(lambda e: self.draw())
        self._clear = pn.widgets.Button(name="Clear", color="light", width=70, css_classes=["draw-clear"])
        self._clear.on_click(lambda e: self._set_drawn([]))
        self._draw_row = pn.Column(
            pn.Row(pn.widgets.Select.from_param(self.param.split, name="Split", sizing_mode="stretch_width",
                                                css_classes=["draw-split"]),
                   pn.widgets.IntInput.from_param(self.param.n_draw, name="N", width=70, css_classes=["draw-n"]),
                   pn.widgets.IntInput.from_param(self.param.draw_seed, name="Seed", width=70,
                                                  css_classes=["draw-seed"]),
                   sizing_mode="stretch_width", margin=0),
            pn.Row(self._draw, self._clear, sizing_mode="stretch_width", margin=0),
            sizing_mode="stretch_width", visible=False, margin=0, css_classes=["draw-row"])
        self._fresh_row = pn.Row(pn.widgets.IntInput.from_param(self.param.fresh, name="New prompts", width=100,
                                                                css_classes=["fresh-prompts"]),
                                 pn.widgets.Select.from_param(self.param.difficulty, name="Difficulty", width=100),
                                 sizing_mode="stretch_width", css_classes=["fresh-row"])
        self._clear.visible = False
        self._go = pn.widgets.Button(name="Generate", color="primary", sizing_mode="stretch_width",
                                     css_classes=["generate-button"])
        self._stop = pn.widgets.Button(name="Cancel", color="light", sizing_mode="stretch_width", disabled=True)
        self._go.on_click(self._on_generate)
        self._stop.on_click(lambda e: self._job.cancel())
        self._progress = pn.indicators.Progress(value=0, max=100, sizing_mode="stretch_width", visible=False,
                                                bar_color="primary", height=14)
        self._status = pn.pane.HTML("", stylesheets=[CSS], sizing_mode="stretch_width", css_classes=["generate-status"])
        self.backend = BackendStatus(state=self.state)
        self._turns_row = pn.Row(pn.widgets.IntInput.from_param(self.param.max_turns, name="Max tool calls", width=100,
                                                                css_classes=["max-turns"]),
                                 sizing_mode="stretch_width", visible=False)
        self._typed = pn.widgets.TextAreaInput.from_param(self.param.typed, name="…or type prompts, one per line",
                                                          placeholder="Q: 23+48-7=", height=70,
                                                          sizing_mode="stretch_width", css_classes=["typed-prompts"])
        self._layout = pn.Column(
            self.backend,
            pn.widgets.Select.from_param(self.param.task, name="Task", sizing_mode="stretch_width",
                                         css_classes=["generate-task"]),
            self._draw_row, self._drawn_box,
            pn.widgets.MultiChoice.from_param(self.param.picked, name="Sample prompts", max_items=64,
                                              sizing_mode="stretch_width", placeholder="pick prompts…"),
            self._typed,
            self._fresh_row,
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
            self._turns_row,
            pn.Row(self._go, self._stop, sizing_mode="stretch_width"),
            self._progress, self._status,
            sizing_mode="stretch_width",
        )
        self._refresh_tasks()  # the task's controls and prompts, once the layout holds them

    def _read_task(self) -> dict:
        """The task choices, and the picked task's split counts and stored prompt texts."""
        store, task = self.state.store, self.task
        out = {"task": task, "choices": task_choices(store), "splits": {}, "texts": None}
        try:
            out["splits"] = split_counts(store, task)
        except UnknownTaskError as exc:
            out["error"] = str(exc)
        out["texts"] = None if task == "arithmetic" else lookups.task_prompt_texts(store, task)
        return out

    def _reads(self) -> dict:
        """:meth:`_read_task` as read ahead for this update, or now when that was of another task."""
        got = self._task_reads()
        return got if got["task"] == self.task else self._read_task()

    @param.depends("state.refresh", watch=True)
    def _refresh_tasks(self) -> None:
        """The task picker's options: arithmetic and the store's prompt sets (one added shows here)."""
        try:
            choices = self._task_reads()["choices"]
        except StoreError as exc:
            self._status.object = banner("error", str(exc))
            return
        set_choices(self, "task", choices, self.task if self.task in choices else choices[0])
        self._show_task()

    @param.depends("task", watch=True)
    def _show_task(self) -> None:
        """The controls of the picked task: a split to draw from for a prompt set, new prompts
        with a difficulty for arithmetic; drawn and picked prompts of another task are dropped."""
        try:
            got = self._reads()
        except StoreError as exc:
            got = {"splits": {}, "texts": [], "error": str(exc)}
        counts = got["splits"]
        if got.get("error"):
            self._status.object = banner("error", got["error"])
        task = _builtin(self.task)
        generates = task is not None and task.generates
        self._agent_defaults(task)
        labels = {f"{s} ({n:,})": s for s, n in counts.items()}
        self._split_labels = labels
        value = next((lab for lab, sp in labels.items() if sp == ("train" if "train" in counts else None)),
                     next(iter(labels), None))
        set_choices(self, "split", list(labels), self.split if self.split in labels else value)
        self._draw_row.visible = bool(counts)
        self._fresh_row.visible = generates
        if not generates:
            self.fresh = 0
        self._typed.placeholder = "Q: 23+48-7=" if generates else "a question, one per line (no gold answer: unscored)"
        if self._drawn and self._drawn_task != self.task:
            self._set_drawn([])
        self._refresh_prompts(got.get("texts"))

    def _refresh_prompts(self, texts: list[str] | None = None) -> None:
        """The sample prompts to pick: the store's for arithmetic, else the picked task's."""
        prompts = self._sample_prompts() if self.task == "arithmetic" else (texts or [])
        self.param.picked.objects = prompts
        self.picked = [p for p in self.picked if p in prompts]

    _drawn_task = ""

    def draw(self) -> list[Prompt]:
        """Fill the prompt list with ``n_draw`` prompts of the split, drawn with ``draw_seed``
        (the same seed, the same prompts); an unknown task or an empty split is said in the banner."""
        split = getattr(self, "_split_labels", {}).get(self.split)
        try:
            drawn = draw_prompts(self.state.store, self.task, int(self.n_draw), seed=int(self.draw_seed), split=split)
        except (PromptDrawError, UnknownTaskError, StoreError, ValueError) as exc:
            self._status.object = banner("error", str(exc))
            return []
        if not drawn:
            self._status.object = banner("error", f"split {split!r} of task {self.task!r} has no prompts to draw")
            return []
        self._drawn_task = self.task
        self._set_drawn(drawn)
        self._status.object = banner("info", f"drew {len(drawn)} prompt{'s' * (len(drawn) != 1)} from {self.task} · "
                                             f"{split} (seed {self.draw_seed}).")
        return drawn

    def _set_drawn(self, drawn: list[Prompt]) -> None:
        self._drawn = list(drawn)
        self._clear.visible = bool(drawn)
        if not drawn:
            self._drawn_box.object = ""
            return
        items = "".join(f'<li title="{esc(p.text)}"><span class="dp-text">{esc(" ".join(p.text.split()))}</span>'
                        f'<span class="dp-gold">{esc(p.gold.get("answer") or "–")}</span></li>' for p in drawn)
        self._drawn_box.object = (f'<div class="drawn"><div class="dp-head"><span><b>{len(drawn)}</b> drawn '
                                  f'prompt{"s" * (len(drawn) != 1)}</span><span>gold</span></div><ol>{items}</ol></div>')

    def _agent_defaults(self, task) -> None:
        """On a task with tools: the tool-call budget shows, a token budget a trajectory fits in, and
        the sample agent policy where a bundled sample policy was picked (they write no calls)."""
        agent = bool(getattr(task, "tools", None))
        self._turns_row.visible = agent
        if not agent:
            return
        self.max_new_tokens = max(self.max_new_tokens, AGENT_MAX_NEW_TOKENS)
        bundled = {str(POLICY_DIR), str(EARLY_POLICY_DIR), str(CHAT_POLICY_DIR), "sample", ""}
        if self.state.policy_path in bundled:
            self.state.policy_path = str(AGENT_POLICY_DIR)

    def prompts(self) -> list[str | Prompt]:
        """Drawn (as :class:`Prompt`, with their gold answers), picked, typed, then the arithmetic
        task's new prompts (drawn with the sampler's seed)."""
        fresh: list[str | Prompt] = []
        task = _builtin(self.task)
        if task is not None and task.generates and self.fresh:
            made = task.make_prompts(self.fresh, seed=self.seed, difficulty=self.difficulty)
            fresh = [p.text for p in made] if self.task == "arithmetic" else list(made)  # a chat prompt: kept whole
        return (list(self._drawn) + list(self.picked) + [line for line in self.typed.splitlines() if line.strip()]
                + fresh)

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
                                max_new_tokens=self.max_new_tokens, seed=self.seed, top_k_stats=self.top_k_stats,
                                max_turns=self.max_turns)
        with self._job.claim() as cancel:
            self._status.object = banner("info", "Starting the sampling worker…")

            def progress(done: int, total: int, msg: str) -> None:
                self._progress.value = int(100 * done / max(total, 1))
                self._status.object = banner("info", msg)

            try:
                result = await generate(self.state.store, self.state.policy_path, self.prompts(), config,
                                        task=self.task, on_progress=progress, cancel=cancel)
            except (TaskParseError, UnknownTaskError, PolicyLoadError, ConfigError, StoreError) as exc:  # say what
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
