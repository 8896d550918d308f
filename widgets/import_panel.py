"""Import & enrich: bring a real training run's rollouts into the store, watch its folder
while it trains, and fill in the token statistics its framework did not log.

Import: a path on the server (a run's folder or its files) or files picked in the browser
(uploaded into ``<store folder>/uploads``); the format is detected or picked; a generic
file takes a column mapping generated from ``studio.ingest.formats.ColumnMapping``. Malformed
lines abort the import (nothing written) or are skipped, and each is listed with its file
and line. "Keep watching" leaves a tailer polling the folder: new shards and appended
lines become rollouts of the same run, and every open page refreshes when they land.

Enrich: teacher-force a policy over a run's rollouts that lack token ids, log-probs or
entropy (``studio.runs.enrich``), in the worker pool, with progress and cancel.

Add a prompt set: a data file or ``datasets`` folder on the server becomes a task of the store
(``studio.ingest.prompt_sets.add_prompt_set``, on a thread): a preset or a column mapping, the
answer extractor, a system prompt and the thinking switch, its form generated from
``PromptSetConfig``; the report (prompts per split) or what is wrong (file, row, column) shows
in a banner, and every task picker of the session then lists it.
"""
from __future__ import annotations

import time
from pathlib import Path

import panel as pn
import param

from studio.configs import settings_of
from studio.ingest import importers, tailers
from studio.ingest.prompt_sets import PromptSetConfig, PromptSetError, add_prompt_set
from studio.runs import enrich
from studio.runs.registry import known_policies
from studio.store import StoreError
from studio.workers.vocab import PolicyLoadError
from widgets.forms import form_values, form_widgets, widget_for

from .base.jobs import Job
from .base.state import StudioState
from .base.style import CARD_CSS, CSS, banner, esc

AUTO = "detect"
PRESET_LABELS = {"auto": "auto", "gsm8k": "gsm8k", "math": "math", "custom (the mapping below)": "none"}
THINKING = {"template default": "default", "on": "on", "off": "off"}  # the switch: unset, True, False
SET_LABELS = {"name": "Task name", "extract": "Answer extractor", "prompt": "prompt column", "messages": "messages column",
              "answer": "answer column", "id_column": "id column", "split_column": "split column",
              "split": "split (default)", "level": "level column", "gold": "gold reader", "regex": "regex",
              "steps": "step mode", "description": "Description", "skip_unreadable": "Skip unreadable rows"}
MAX_PROBLEMS = 25


def problems_html(problems, total: int | None = None) -> str:
    """Malformed input as ``file:line: message`` lines (the first few)."""
    if not problems:
        return ""
    lines = []
    for p in problems[:MAX_PROBLEMS]:
        where = f"{Path(p.file).name}:{p.line}" if p.line else Path(p.file).name
        lines.append(f"<div><b>{esc(where)}</b> {esc(p.message)}</div>")
    more = (total or len(problems)) - len(problems[:MAX_PROBLEMS])
    if more > 0:
        lines.append(f"<div>… and {more:,} more</div>")
    return f'<div class="import-problems">{"".join(lines)}</div>'


PANEL_CSS = """
.import-problems { font-family:'DejaVu Sans Mono', monospace; font-size:11.5px; background:#fff5f5;
  border:1px solid #ffc9c9; border-radius:6px; padding:6px 8px; max-height:220px; overflow:auto; color:#862e2e; }
.import-problems b { color:#c92a2a; font-weight:600; margin-right:6px; }
table.tails { border-collapse:collapse; font-size:12px; width:100%; }
table.tails td, table.tails th { padding:2px 6px; border-top:1px solid #f1f3f5; text-align:left; }
table.tails th { color:#868e96; font-weight:600; font-size:11px; }
.hint { font-size:11.5px; color:#868e96; }
"""


def _head(text: str) -> pn.pane.HTML:
    return pn.pane.HTML(f'<div style="font-size:11px;font-weight:700;letter-spacing:.06em;color:#6b7280;'
                        f'text-transform:uppercase">{esc(text)}</div>', margin=(6, 10, 0, 10))


class ImportPanel(pn.viewable.Viewer):
    """Import form, tailers, and enrich."""

    state = param.ClassSelector(class_=StudioState, doc="Shared studio state.")
    can_run = param.Boolean(default=True, doc="Whether this session may read server files and run models.")
    running = param.Boolean(default=False, doc="An import or enrich is in progress.")

    def __init__(self, **params):
        super().__init__(**params)
        self._job = Job(on_running=self._importing)  # an import (a thread, with progress and cancel)
        self._enriching = Job(on_running=self._enrich_running)  # an enrich (in the worker pool)
        self._source = pn.widgets.TextInput(name="Run folder or files on the server (comma-separated)",
                                            placeholder="/runs/grpo-qwen/completions", sizing_mode="stretch_width",
                                            css_classes=["import-source"])
        self._upload = pn.widgets.FileInput(accept=".jsonl,.json,.parquet", multiple=True, sizing_mode="stretch_width",
                                            css_classes=["import-upload"])
        self._format = pn.widgets.Select(name="Format", options=[AUTO, *importers.FORMATS], value=AUTO, width=130,
                                         css_classes=["import-format"])
        self._on_error = pn.widgets.RadioButtonGroup(name="Malformed lines", options=["abort", "skip"], value="abort",
                                                     color="light", width=150, css_classes=["import-on-error"])
        self._name = pn.widgets.TextInput(name="Run name", placeholder="(from the folder)", width=200,
                                          css_classes=["import-name"])
        self._tokenizer = pn.widgets.TextInput(name="Tokenizer (token ids of agent dumps)",
                                               placeholder="policy folder, or sample-chat", width=240,
                                               css_classes=["import-tokenizer"])
        self._tail = pn.widgets.Checkbox(name="Keep watching the folder for new steps", value=False,
                                         css_classes=["import-tail"])
        self._mapping = {s.name: widget_for(s, label=s.name, placeholder=s.help, description=None, width=150,
                                            css_classes=[f"map-{s.name}"])
                         for s in settings_of(importers.ColumnMapping)}
        self._mapping_box = pn.Column(
            pn.pane.HTML('<div class="hint">Generic files: the column holding each field (rewards: comma-separated '
                         'component columns).</div>', stylesheets=[PANEL_CSS]),
            pn.FlexBox(*self._mapping.values(), sizing_mode="stretch_width"), visible=False,
            sizing_mode="stretch_width")
        self._format.param.watch(lambda e: setattr(self._mapping_box, "visible", e.new == "generic"), "value")
        self._go = pn.widgets.Button(name="Import", color="primary", width=120, css_classes=["import-button"])
        self._stop = pn.widgets.Button(name="Cancel", color="light", width=90, disabled=True)
        self._go.on_click(self._on_import)
        self._stop.on_click(lambda e: self._job.cancel())
        self._progress = pn.indicators.Progress(value=0, max=100, sizing_mode="stretch_width", visible=False,
                                                bar_color="primary", height=12)
        self._message = pn.pane.HTML("", stylesheets=[CSS, PANEL_CSS], sizing_mode="stretch_width",
                                     css_classes=["import-message"])
        self._tails = pn.pane.HTML("", stylesheets=[CSS, PANEL_CSS], sizing_mode="stretch_width",
                                   css_classes=["import-tails"])
        self._stop_tail = pn.widgets.Select(name="Stop watching", options=[], width=260, visible=False,
                                            css_classes=["tail-stop"])
        self._stop_tail.param.watch(self._on_stop_tail, "value")
        # enrich
        self._enrich_run = pn.widgets.Select(name="Rollouts of run", options={}, width=260,
                                             css_classes=["enrich-run"])
        self._enrich_policy = pn.widgets.Select(name="Policy (teacher forcing)", options={}, width=260,
                                                css_classes=["enrich-policy"])
        self._enrich_go = pn.widgets.Button(name="Enrich", color="primary", width=120,
                                            css_classes=["enrich-button"])
        self._enrich_go.on_click(self._on_enrich)
        self._enrich_message = pn.pane.HTML("", stylesheets=[CSS], sizing_mode="stretch_width",
                                            css_classes=["enrich-message"])
        # add a prompt set
        self._adding = Job(on_running=lambda on: setattr(self._set_go, "disabled", on))
        self._set_path = pn.widgets.TextInput(name="Prompt set file or folder on the server",
                                              placeholder="/data/gsm8k/train.jsonl, /data/gsm8k/test.jsonl",
                                              sizing_mode="stretch_width", css_classes=["set-path"])
        self._set_form = form_widgets(PromptSetConfig, width=150, labels=SET_LABELS)
        for name, w in self._set_form.items():
            w.css_classes = list(w.css_classes or []) + [f"set-{name.replace('_', '-')}"]
        self._set_form["preset"] = pn.widgets.Select(name="Preset", options=PRESET_LABELS, value="auto", width=150,
                                                     css_classes=["set-preset"],
                                                     description=self._set_form["preset"].description)
        self._set_form["thinking"] = pn.widgets.Select(name="Thinking", options=THINKING, value="default", width=150,
                                                       css_classes=["set-thinking"],
                                                       description="the chat template's thinking switch")
        self._set_form["system"] = pn.widgets.TextAreaInput(name="System prompt", height=54,
                                                            sizing_mode="stretch_width", css_classes=["set-system"],
                                                            placeholder="(none)")
        f = self._set_form
        self._set_mapping = pn.Card(
            pn.FlexBox(*(f[n] for n in ("prompt", "messages", "answer", "id_column", "split_column", "split", "level",
                                         "gold", "regex", "steps")), sizing_mode="stretch_width"),
            f["description"], f["skip_unreadable"], title="Column mapping and answer settings", collapsed=True,
            sizing_mode="stretch_width", header_background="#f8f9fa", css_classes=["set-mapping"], stylesheets=[CARD_CSS])
        self._set_go = pn.widgets.Button(name="Add", color="primary", width=90, css_classes=["set-add"])
        self._set_go.on_click(self._on_add_set)
        self._set_message = pn.pane.HTML("", stylesheets=[CSS, PANEL_CSS], sizing_mode="stretch_width",
                                         css_classes=["set-message"])
        if not self.can_run:
            self._layout = pn.pane.HTML(banner("info", "Importing reads files on the server and enriching runs a "
                                                       "model: both are for the studio's admins. The SQL console "
                                                       "and every view of imported runs are open to you."),
                                        stylesheets=[CSS], sizing_mode="stretch_width")
            return
        self._layout = pn.Row(
            pn.Column(
                _head("Import a training run"),
                pn.pane.HTML('<div class="hint">TRL GRPO <code>completions/completions_*.parquet</code> · verl '
                             '<code>{step}.jsonl</code> dumps · OpenRLHF / RL-Logging-Board JSONL · any JSONL or '
                             'Parquet with a column mapping · agent trajectories of verl, SkyRL, TRL, rLLM, OpenAI '
                             'chat or Responses (their token ids decoded with the tokenizer named).</div>',
                             stylesheets=[PANEL_CSS], margin=(0, 10)),
                self._source,
                pn.pane.HTML('<div class="hint">…or pick files in the browser:</div>', stylesheets=[PANEL_CSS],
                             margin=(0, 10)),
                self._upload,
                pn.FlexBox(self._format, self._name, self._tokenizer, pn.Column(pn.pane.HTML('<div class="hint">Malformed lines</div>',
                                                                        stylesheets=[PANEL_CSS], margin=(0, 5)),
                                                           self._on_error), sizing_mode="stretch_width"),
                self._mapping_box, self._tail,
                pn.Row(self._go, self._stop), self._progress, self._message,
                _head("Watched folders"), self._tails, self._stop_tail,
                sizing_mode="stretch_width", styles={"flex": "1 1 60%"}),
            pn.Column(
                _head("Add a prompt set"),
                pn.pane.HTML('<div class="hint">A JSONL, JSON, Parquet or CSV file (or a <code>datasets</code> folder) '
                             'of prompts with gold answers becomes a task: draw its prompts in Generate, train on '
                             'its splits in Mini-runs. GSM8K and MATH shapes are read without a mapping.</div>',
                             stylesheets=[PANEL_CSS], margin=(0, 10)),
                self._set_path,
                pn.FlexBox(f["name"], f["preset"], f["extract"], f["thinking"], sizing_mode="stretch_width"),
                f["system"], self._set_mapping, self._set_go, self._set_message,
                _head("Enrich with a policy"),
                pn.pane.HTML('<div class="hint">Fill in token ids, log-probs, entropy and top-k that the run did not '
                             'log, by teacher-forcing a policy over each prompt + completion. A source\'s own '
                             'log-probs are kept; the rollouts record which policy filled them in.</div>',
                             stylesheets=[PANEL_CSS], margin=(0, 10)),
                self._enrich_run, self._enrich_policy, self._enrich_go, self._enrich_message,
                sizing_mode="stretch_width", styles={"flex": "1 1 40%"}),
            sizing_mode="stretch_width")
        self.state.param.watch(lambda e: self.fill(), ["refresh"])

    # -- pickers ----------------------------------------------------------------------------
    def fill(self) -> None:
        """(Re)fill the run and policy pickers and the tailers list (on first open and each refresh)."""
        if not self.can_run:
            return
        self._draw_tails()  # first: it reads no store, so a slow read below cannot leave it stale
        store = self.state.store
        runs = enrich.runs_to_enrich(store)
        opts = {f"{r.name or r.run_id} · {r.kind} · {r.n:,} rollouts" + (f" ({r.bare:,} without tokens)" if r.bare else ""):
                r.run_id for r in runs.itertuples()}
        self._enrich_run.options = opts
        if self._enrich_run.value not in opts.values() and opts:
            self._enrich_run.value = next(iter(opts.values()))
        pols = known_policies(store)
        self._enrich_policy.options = pols
        if self._enrich_policy.value not in pols.values():
            self._enrich_policy.value = next(iter(pols.values()))

    def _draw_tails(self) -> None:
        mine = tailers.tailers_of(self.state.store)
        if not mine:
            self._tails.object = '<div class="hint">None. Tick "Keep watching" when importing a folder.</div>'
            self._stop_tail.visible = False
            return
        rows = []
        for folder, t in mine.items():
            st = t.status
            err = f'<span class="bad">{esc(str(st.get("last_error")))}</span>' if st.get("last_error") else "ok"
            last = time.strftime("%H:%M:%S", time.localtime(st["last_poll"])) if st.get("last_poll") else "–"
            rows.append(f"<tr><td>{esc(folder)}</td><td>{st.get('files', 0):,}</td><td>{st.get('rollouts', 0):,}</td>"
                        f"<td>{last}</td><td>{err}</td></tr>")
        self._tails.object = ('<table class="tails"><tr><th>folder</th><th>files</th><th>rollouts</th>'
                              f'<th>last poll</th><th>state</th></tr>{"".join(rows)}</table>')
        self._stop_tail.options = ["", *mine]
        self._stop_tail.visible = True

    def _on_stop_tail(self, event) -> None:
        if not event.new:
            return
        tailers.unwatch(self.state.store, event.new)
        self._stop_tail.value = ""
        self._draw_tails()

    # -- import -------------------------------------------------------------------------------
    def _importing(self, on: bool) -> None:
        """An import starts (``on``) or ends: the buttons and the progress bar follow."""
        self.running, self._go.disabled, self._stop.disabled = on, on, not on
        if on:
            self._progress.value = 0
        self._progress.visible = on

    def _paths(self) -> list[Path]:
        paths = [Path(p.strip()).expanduser() for p in self._source.value.split(",") if p.strip()]
        if self._upload.value:
            names = self._upload.filename if isinstance(self._upload.filename, list) else [self._upload.filename]
            datas = self._upload.value if isinstance(self._upload.value, list) else [self._upload.value]
            folder = self.state.store.home / "uploads" / time.strftime("%Y%m%d-%H%M%S")
            folder.mkdir(parents=True, exist_ok=True)
            for name, data in zip(names, datas):
                target = folder / Path(name).name  # a browser's name, never a path
                target.write_bytes(data)
                paths.append(target)
        return paths

    def _mapping_value(self):
        if self._format.value != "generic":
            return None
        return importers.ColumnMapping(**form_values(importers.ColumnMapping, self._mapping))

    async def _on_import(self, event=None) -> None:
        if self.running:
            return
        try:
            paths = self._paths()
            mapping = self._mapping_value()
        except (TypeError, ValueError, OSError) as exc:
            self._message.object = banner("error", str(exc))
            return
        if not paths:
            self._message.object = banner("error", "Give a folder or files on the server, or pick files to upload.")
            return
        missing = [str(p) for p in paths if not p.exists()]
        if missing:
            self._message.object = banner("error", f"Not found on the server: {', '.join(missing)}")
            return
        fmt = None if self._format.value == AUTO else self._format.value
        tokenizer = self._tokenizer.value.strip() or None
        store = self.state.store
        with self._job.claim() as cancel:
            self._message.object = banner("info", f"Importing {len(paths)} path(s)…")

            def work(report):
                return importers.import_run(store, paths if len(paths) > 1 else paths[0], fmt, mapping=mapping,
                                            on_error=self._on_error.value, name=self._name.value.strip() or None,
                                            progress=report, cancel=cancel, tail=self._tail.value,
                                            tokenizer=tokenizer)

            def progress(done: int, total: int) -> None:
                self._progress.value = int(100 * done / total)

            try:
                report = await self._job.thread(work, progress=progress)
            except importers.MalformedInput as exc:
                self._message.object = (banner("error", f"Nothing imported: {len(exc.problems):,} malformed line(s). "
                                                        "Fix them, or choose 'skip' to import the rest.")
                                        + problems_html(exc.problems))
                return
            except (importers.ImportFormatError, StoreError, OSError, ValueError) as exc:
                self._message.object = banner("error", f"Nothing imported: {exc}")
                return
        if report.cancelled:
            self._message.object = banner("warn", "Cancelled: nothing was imported.")
            return
        skipped = f"; skipped {report.n_skipped:,} malformed line(s)" if report.n_skipped else ""
        self._message.object = (banner("info", f"Imported {report.n_rollouts:,} rollouts ({report.n_tokens:,} tokens) "
                                               f"from {report.n_files} file(s) in {report.seconds:.1f} s as run "
                                               f"{report.run_id}{skipped}.")
                                + problems_html(report.skipped, report.n_skipped))
        if self._tail.value:
            folders = {p for p in paths if p.is_dir()}  # a picked file's folder may hold files not picked
            if len(folders) < len(paths):
                self._message.object += banner("warn", "Keep watching follows folders: the files picked alone "
                                                       "are not watched.")
            for folder in folders:
                tailers.watch(store, folder, fmt=fmt, mapping=mapping, on_error="skip", run_id=report.run_id,
                              tokenizer=tokenizer)
        self._upload.value = None  # uploaded files are imported once
        self.state.param.update(refresh=self.state.refresh + 1, jump_run=report.run_id)  # refills the pickers
        if report.run_id in self._enrich_run.options.values():
            self._enrich_run.value = report.run_id  # the run just imported is the one to enrich

    # -- prompt sets ---------------------------------------------------------------------------
    def set_config(self) -> PromptSetConfig:
        """The form's :class:`PromptSetConfig` (an empty optional text is None)."""
        values = form_values(PromptSetConfig, self._set_form)
        values["thinking"] = {"on": True, "off": False}.get(values["thinking"])
        optional = {f for f, v in vars(PromptSetConfig()).items() if v is None}
        return PromptSetConfig(**{k: (None if k in optional and v == "" else v) for k, v in values.items()})

    async def _on_add_set(self, event=None) -> None:
        if self._adding.running:
            return
        paths = [Path(p.strip()).expanduser() for p in self._set_path.value.split(",") if p.strip()]
        if not paths:
            self._set_message.object = banner("error", "Give the prompt set's file(s) or folder on the server.")
            return
        try:
            config = self.set_config()
        except (TypeError, ValueError) as exc:
            self._set_message.object = banner("error", str(exc))
            return
        store = self.state.store
        with self._adding.claim():
            self._set_message.object = banner("info", f"Reading {len(paths)} path(s)…")
            try:
                report = await self._adding.thread(add_prompt_set, store, paths, config)
            except (PromptSetError, StoreError, OSError, ValueError) as exc:
                problems = getattr(exc, "problems", [])[:MAX_PROBLEMS]
                more = "".join(f"<div>{esc(p)}</div>" for p in problems)
                self._set_message.object = (banner("error", f"Nothing stored: {exc}")
                                            + (f'<div class="import-problems">{more}</div>' if len(problems) > 1 else ""))
                return
            except Exception as exc:  # still said in place: the page lives on
                self._set_message.object = banner("error", f"Nothing stored: {type(exc).__name__}: {exc}")
                return
        splits = ", ".join(f"{n:,} {s}" for s, n in report.splits.items())
        self._set_message.object = banner("info", f"Added task {report.name}: {report.n_prompts:,} prompts ({splits}). "
                                                  "Pick it in Generate to draw prompts, or in Mini-runs to train on it.")
        if report.skipped or report.n_duplicates:
            self._set_message.object += banner("warn", report.summary())
        self.state.param.update(refresh=self.state.refresh + 1)  # every task picker lists it

    # -- enrich -------------------------------------------------------------------------------
    def _enrich_running(self, on: bool) -> None:
        self.running, self._enrich_go.disabled = on, on

    async def _on_enrich(self, event=None) -> None:
        if self.running or not self._enrich_run.value:
            return
        with self._enriching.claim():
            self._enrich_message.object = banner("info", "Starting the worker…")

            def progress(done: int, total: int) -> None:
                self._enrich_message.object = banner("info", f"Enriched {done:,} of {total:,} rollouts…")

            try:
                report = await enrich.enrich(self.state.store, self._enrich_policy.value,
                                             run_id=self._enrich_run.value, progress=progress)
            except (PolicyLoadError, StoreError) as exc:
                self._enrich_message.object = banner("error", str(exc))
                return
        skipped = f"; {len(report.skipped):,} skipped ({report.skipped[0][1]}…)" if report.skipped else ""
        self._enrich_message.object = banner(
            "info", f"Enriched {report.n_rollouts:,} rollouts ({report.n_tokens:,} tokens) with "
                    f"{report.policy_version} in {report.seconds:.1f} s{skipped}.")
        if report.n_rollouts:
            self.state.param.update(refresh=self.state.refresh + 1)

    def __panel__(self):
        return self._layout
