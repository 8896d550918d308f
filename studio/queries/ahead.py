"""Reads that run beside each other: two shared reader threads (:func:`read_ahead`).

A click's reads that do not depend on each other (its tokens, its group's prompt and run)
start on a reader thread while the calling thread reads the rest; DuckDB lets go of the GIL
while it reads. :func:`settled` makes sure such a read has finished before an error leaves.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")
_READERS: ThreadPoolExecutor | None = None
_READERS_LOCK = threading.Lock()


def read_ahead(fn: Callable[..., T], *args) -> Future[T]:
    """``fn(*args)`` started in one of two shared reader threads: a click's reads that do not depend
    on each other (its tokens, its group's prompt) run while the calling thread reads the rest; DuckDB
    lets go of the GIL while it reads. ``.result()`` returns the value or raises what ``fn`` raised.
    ``fn`` must not wait on another :func:`read_ahead` (two threads: it could wait forever)."""
    global _READERS
    with _READERS_LOCK:
        if _READERS is None:
            _READERS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="studio-read")
    return _READERS.submit(fn, *args)


@contextmanager
def settled(future: Callable[[], Future | None]):
    """On an error inside, wait for the read ``future()`` started (:func:`read_ahead`) before the error
    leaves: its cursor must not outlive a store that the caller may close next."""
    try:
        yield
    except BaseException:
        f = future()
        if f is not None:
            wait([f])
        raise

