"""The server's folder tailers (``studio.ingest.tail.Tailer``), by store and folder: they
outlive the page that started them, and every page of the process refreshes when they add
rollouts to its store.
"""
from __future__ import annotations

import threading
from pathlib import Path

from studio.ingest.tail import Tailer
from studio.store import Store

_tailers: dict[tuple[str, str], Tailer] = {}  # (store path, folder) -> its tailer
_lock = threading.Lock()


def tailers_of(store: Store) -> dict[str, Tailer]:
    """Folder -> tailer of every folder watched into ``store``."""
    with _lock:
        return {folder: t for (path, folder), t in _tailers.items() if path == store.path}


def watch(store: Store, folder: str | Path, **options) -> bool:
    """Start a tailer of ``folder`` into ``store`` (``options``: :class:`Tailer`'s), unless one
    watches it already; True when one was started."""
    key = (store.path, str(Path(folder).resolve()))
    with _lock:
        if key in _tailers:
            return False
        t = Tailer(store, folder, **options)
        t.start()
        _tailers[key] = t
        return True


def unwatch(store: Store, folder: str) -> None:
    """Stop the tailer of ``folder`` into ``store`` (as :func:`tailers_of` names it), if any."""
    with _lock:
        t = _tailers.pop((store.path, folder), None)
    if t is not None:
        t.stop()


def tail_rows(store: Store) -> int:
    """Rollouts the tailers of ``store`` have added so far (a page polls this to refresh)."""
    return sum(t.status.get("rollouts", 0) for t in tailers_of(store).values())
