"""Import the rollouts of real training runs: TRL GRPO completions tables, verl generation
dumps, OpenRLHF / RL-Logging-Board JSONL, and any JSONL or Parquet with a column mapping.

:func:`import_run` runs one import: the format (:mod:`studio.ingest.formats`: detected or
given, each file's fields resolved into a mapping) ─ the files a path stands for, sorted by
step ─ per file, its slices read and made canonical a file ahead on a reader thread
(:mod:`studio.ingest.read`, :mod:`studio.ingest.normalise`) ─ written by the owner
(:mod:`studio.ingest.write`) ─ an :class:`ImportReport`.

One import is one transaction: an abort on bad input (:class:`~studio.ingest.errors.MalformedInput`),
a cancel or any error leaves the store as it was (a token shard it began is deleted). Rows written:
``runs`` (kind ``import``), ``prompts``, ``rollouts``, ``tokens``, ``token_scores``, a rule version
with its ``rewards``, and ``import_files``. Importing the same request again (format, paths,
mapping, task) continues its run: only what it has not read yet is imported, which is how
:mod:`studio.ingest.tail` follows a run still being written.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from studio.ingest.agent_formats import check_tokenizer
from studio.ingest.errors import ImportFormatError, MalformedInput, Problem
from studio.ingest.formats import FORMATS, ColumnMapping, detect_format, files_of
from studio.ingest.read import ReadAhead, read_files
from studio.ingest.write import Cancelled, Ctx, FileWriter, write_file, write_run
from studio.store import Store, fill_verdicts, records
from studio.store.shards import TokenSink
from studio.tasks import UnknownTaskError, task_names

IMPORT_TASK = "import"  # the task of prompts an import brings, unless it names a registered one

MAX_PROBLEMS = 1000  # problems kept per import (all are counted)


@dataclass
class ImportReport:
    """What one import did: its run, the rows it wrote, the records it skipped, how long it took."""

    run_id: str | None
    n_rollouts: int = 0
    n_tokens: int = 0
    n_files: int = 0
    skipped: list[Problem] = field(default_factory=list)
    seconds: float = 0.0
    status: str = "done"  # done | cancelled
    rule_versions: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)  # tail: Parquet files not readable yet (being written)
    n_skipped: int = 0  # all skipped records (``skipped`` keeps the first MAX_PROBLEMS)

    @property
    def cancelled(self) -> bool:
        return self.status == "cancelled"

    def summary(self) -> str:
        return (f"{self.run_id or '(no run)'}: {self.status}, {self.n_rollouts:,} rollouts, {self.n_tokens:,} tokens "
                f"from {self.n_files} file{'s' * (self.n_files != 1)} in {self.seconds:.1f} s"
                + (f", {self.n_skipped} skipped" if self.n_skipped else ""))


def _find_run(cur, config: dict) -> str | None:
    """An import run made from the same request (format, paths, mapping, task): importing again continues it."""
    for run_id, cfg in cur.execute("SELECT run_id, config FROM runs WHERE kind = 'import' "
                                   "ORDER BY created_at DESC").fetchall():
        try:
            if json.loads(cfg or "null") == config:
                return run_id
        except ValueError:
            continue
    return None


def _file_state(cur, run_id: str) -> dict[str, int]:
    """Bytes consumed so far of each file of an import run."""
    return dict(cur.execute("SELECT path, max(consumed) FROM import_files WHERE run_id = ? GROUP BY path",
                            [run_id]).fetchall())


def check_task(task: str) -> None:
    """Refuse a task an import cannot file its prompts under (a typo here broke whole-store scoring
    later): a known task (built in, or one the store defines), :data:`IMPORT_TASK` among them.

    Raises:
        UnknownTaskError: naming the known tasks.
    """
    if task not in task_names():
        raise UnknownTaskError(f"unknown task {task!r}; known tasks: {', '.join(task_names())} "
                               f"({IMPORT_TASK!r}: the prompts of an imported run as they are)")


def import_run(store: Store, paths: str | Path | list, fmt: str | None = None, *, mapping: ColumnMapping | None = None,
               on_error: str = "abort", name: str | None = None, task: str = IMPORT_TASK, run_id: str | None = None,
               progress: Callable[[int, int], None] | None = None, cancel: threading.Event | None = None,
               tail: bool = False, tokenizer: str | Path | None = None) -> ImportReport:
    """Import rollouts from files or run directories, in one transaction.

    Args:
        paths: files, or directories (expanded to their shards, sorted by step).
        fmt: one of :data:`FORMATS`; None detects it from the first path.
        mapping: overrides the format's fields (``generic`` needs one: prompt and completion at least).
        on_error: ``"abort"`` raises :class:`MalformedInput` at the first file with bad records and
            writes nothing; ``"skip"`` imports the rest and lists them in ``report.skipped``.
        run_id: an import run to append to. Without one, a run made from the same format, paths,
            mapping and task is continued (only what it has not read yet is imported), else a new run.
        progress: called with (bytes read, bytes to read).
        cancel: set it to stop; nothing is written and the report says ``cancelled``.
        tail: read only complete lines and leave unreadable Parquet files for later
            (``report.waiting``): a run still being written (:class:`studio.ingest.tail.Tailer`).
        tokenizer: a policy folder (or ``"sample-chat"``) whose tokenizer decodes the token ids of an agent
            format (:data:`~studio.ingest.formats.AGENT_FORMATS`) that come without texts.

    Raises:
        ImportFormatError: a file's fields are not what the format needs (nothing written).
        MalformedInput: bad records with ``on_error="abort"`` (nothing written).
    """
    t0 = time.perf_counter()
    if on_error not in ("abort", "skip"):
        raise ValueError(f"on_error must be 'abort' or 'skip', not {on_error!r}")
    check_task(task)
    check_tokenizer(tokenizer)
    roots = [Path(p).expanduser().resolve() for p in (paths if isinstance(paths, (list, tuple)) else [paths])]
    if not roots:
        raise ImportFormatError("no paths to import")
    for r in roots:
        if not r.exists():
            raise ImportFormatError(f"{r} does not exist")
    fmt = fmt or detect_format(roots[0])
    if fmt not in FORMATS:
        raise ImportFormatError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
    if fmt == "generic" and (mapping is None or not (mapping.prompt and mapping.completion)):
        raise ImportFormatError("the generic format needs a column mapping naming prompt and completion "
                                "(--map prompt=COLUMN --map completion=COLUMN)")
    files = list(dict.fromkeys(f for r in roots for f in files_of(r, fmt)))
    config = {"format": fmt, "paths": [str(r) for r in roots], "mapping": mapping.as_dict() if mapping else None,
              "task": task}
    report = ImportReport(run_id)
    sink: TokenSink | None = None
    try:
        with store.transaction() as cur:
            if run_id is not None:
                kind = cur.execute("SELECT kind FROM runs WHERE run_id = ?", [run_id]).fetchall()
                if not kind or kind[0][0] != "import":
                    raise ValueError(f"{run_id} is not an import run in this store")
            run_id = run_id or _find_run(cur, config)
            new_run = run_id is None
            run_id = run_id or records.new_id("run_")
            report.run_id = run_id
            done = {} if new_run else _file_state(cur, run_id)
            todo = []
            for f in files:
                size = f.stat().st_size
                start = done.get(str(f))
                if start is None:
                    todo.append((f, 0, size))
                elif f.suffix == ".jsonl" and size > start:  # lines appended since: read from there
                    todo.append((f, start, size - start))
            ctx = Ctx(store, cur, run_id, fmt, task, records.now(), cancel)
            ctx.run_name = (name or _default_name(roots[0])) if new_run else \
                cur.execute("SELECT name FROM runs WHERE run_id = ?", [run_id]).fetchall()[0][0]
            ctx.tokens = sink = TokenSink(store, cur, run_id)
            total_bytes, read_bytes = sum(s for *_, s in todo), 0
            if progress:
                progress(0, total_bytes)
            reads = ReadAhead(read_files(todo, fmt, mapping, tail, tokenizer))
            try:
                for *_, size in todo:
                    if cancel is not None and cancel.is_set():
                        raise Cancelled
                    _import_file(ctx, report, reads, on_error, tail)
                    read_bytes += size
                    if progress:
                        progress(read_bytes, total_bytes)
                sink.finish()
            finally:
                reads.close()
            if new_run and (report.n_files or not tail):
                write_run(ctx, ctx.run_name, config)
            elif new_run:
                report.run_id = None
            if report.run_id is not None and ctx.n_rollouts:
                fill_verdicts(cur, report.run_id)  # gold answers without a correctness field: the task verifies
            report.n_rollouts, report.n_tokens = ctx.n_rollouts, ctx.n_tokens
            report.rule_versions = list(ctx.versions)
    except BaseException as exc:
        if sink is not None:
            sink.discard()  # the transaction rolled back: its shard goes too
        if not isinstance(exc, Cancelled):
            raise
        report = ImportReport(report.run_id if not new_run else None, status="cancelled")
    report.seconds = time.perf_counter() - t0
    return report


def _default_name(root: Path) -> str:
    if root.is_file():
        return root.stem
    return root.parent.name if root.name == "completions" else root.name


def _import_file(ctx: Ctx, report: ImportReport, reads: ReadAhead, on_error: str, tail: bool) -> None:
    """Write the next file of ``reads`` (see :func:`read_files`)."""
    f, start, st, src = next(reads)
    if isinstance(src, Exception):
        exc = src
        being_written = f.suffix == ".json" or (f.suffix == ".parquet" and not isinstance(exc, ImportFormatError))
        if tail and being_written:  # no Parquet footer yet, or the JSON's end is missing: try again next poll
            report.waiting.append(str(f))
            return
        if isinstance(exc, ImportFormatError):
            raise exc
        _problems(report, [Problem(str(f), None, f"cannot read it ({str(exc).splitlines()[0][:200]})")], on_error)
        return
    problems, writer = list(src.problems), FileWriter(ctx, src, resumed=start > 0)
    for item in reads:
        if item is None:
            break
        if isinstance(item, Exception):
            problems.append(Problem(str(f), None, f"cannot read the rest ({str(item).splitlines()[0][:200]})"))
            continue
        b, probs = item
        problems += probs
        if b is not None and not (problems and on_error == "abort"):  # aborting: only look for the rest
            writer.write(b)
    problems.sort(key=lambda p: p.line or 0)
    _problems(report, problems, on_error)
    if src.end == start and not writer.n:
        return  # tail: nothing complete yet
    report.n_files += 1
    write_file(ctx, f, st, src.end, writer.n, len(problems))


def _problems(report: ImportReport, problems: list[Problem], on_error: str) -> None:
    if not problems:
        return
    if on_error == "abort":
        raise MalformedInput(problems[:MAX_PROBLEMS], len(problems))
    report.n_skipped += len(problems)
    report.skipped.extend(problems[:max(0, MAX_PROBLEMS - len(report.skipped))])
