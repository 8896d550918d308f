"""Follow a training run's output directory: new steps appear in the store as they are written.

A :class:`Tailer` polls a directory with :func:`studio.ingest.importers.import_run` in tail mode:
new shards, and the complete lines appended to JSONL files since the last poll (a last line
without its newline waits; a Parquet file that cannot be read yet is being written and is
tried again next time). Everything goes into one import run; how far each file was read is
in ``import_files``, so a Tailer started again on the same directory and store continues
that run without duplicating a row.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

from studio.ingest.errors import ImportFormatError, MalformedInput
from studio.ingest.formats import ColumnMapping, detect_format
from studio.ingest.importers import ImportReport, import_run
from studio.store import Store


class Tailer:
    """Import new rollouts of ``directory`` every ``interval_s`` seconds, into one import run.

    ``run_id``: the import run to add to (an import of this directory made just before, say);
    without one, a run made from the same directory, format, mapping and task is continued.
    """

    def __init__(self, store: Store, directory: str | Path, fmt: str | None = None,
                 mapping: ColumnMapping | None = None, on_error: str = "skip", interval_s: float = 2.0,
                 name: str | None = None, task: str = "import", run_id: str | None = None,
                 tokenizer: str | Path | None = None):
        self.store = store
        self.tokenizer = tokenizer  # decodes an agent format's token ids (import_run's tokenizer)
        self.directory = Path(directory).expanduser().resolve()
        self.fmt, self.mapping, self.on_error = fmt, mapping, on_error
        self.interval_s, self.name, self.task = float(interval_s), name, task
        self.run_id = run_id
        self._status = {"directory": str(self.directory), "format": fmt, "run_id": run_id, "files": 0, "rollouts": 0,
                        "polls": 0, "last_poll": None, "last_error": None, "waiting": []}
        self._poll_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def status(self) -> dict:
        """A copy of where it stands: ``directory``, ``format``, ``run_id``, ``files`` and
        ``rollouts`` (imported so far), ``polls``, ``last_poll`` (seconds since the epoch),
        ``last_error`` (the last poll's, None once one succeeds), ``waiting`` (Parquet files
        not readable yet), ``running`` (a background thread is polling)."""
        return {**self._status, "waiting": list(self._status["waiting"]),
                "running": self._thread is not None and self._thread.is_alive()}

    def poll(self) -> ImportReport | None:
        """Import what is new; the report, or None when nothing was.

        Without a format, one is detected once files are there; until then each poll returns
        None and says why in ``status["last_error"]``.

        Raises:
            ImportFormatError, MalformedInput: as :func:`import_run` (also kept in ``status["last_error"]``);
                nothing of this poll is written.
        """
        st = self._status
        with self._poll_lock:
            st["polls"] += 1
            st["last_poll"] = time.time()
            try:
                if self.fmt is None:
                    try:
                        self.fmt = st["format"] = detect_format(self.directory)
                    except ImportFormatError as exc:  # no shard yet, most likely: look again next time
                        st["last_error"] = f"waiting for files the format can be told from ({exc})"
                        return None
                rep = import_run(self.store, self.directory, self.fmt, mapping=self.mapping, on_error=self.on_error,
                                 name=self.name, task=self.task, run_id=self.run_id, tail=True,
                                 tokenizer=self.tokenizer)
            except (ImportFormatError, MalformedInput) as exc:
                st["last_error"] = str(exc)
                raise
            st["last_error"], st["waiting"] = None, rep.waiting
            if rep.run_id:
                self.run_id = st["run_id"] = rep.run_id
                row = self.store.df("SELECT count(DISTINCT path) AS files, coalesce(sum(n_rows), 0) AS rollouts "
                                    "FROM import_files WHERE run_id = ?", [rep.run_id]).iloc[0]
                st["files"], st["rollouts"] = int(row["files"]), int(row["rollouts"])
            return rep if rep.n_rollouts or rep.skipped else None

    def start(self) -> Tailer:
        """Poll in a daemon thread until :meth:`stop` (errors are kept in ``status["last_error"]``)."""
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=f"tail {self.directory.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop polling; waits for a poll in progress to finish (it commits or rolls back whole)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except (ImportFormatError, MalformedInput):
                pass  # in status["last_error"]; the next poll tries again
            except Exception as exc:
                self._status["last_error"] = f"{exc.__class__.__name__}: {exc}"
            self._stop.wait(self.interval_s)
