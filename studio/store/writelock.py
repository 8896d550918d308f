"""One writer at a time on a shared store whose catalog is a SQLite file.

DuckLake keeps its catalog transaction open from a write's first statement to its commit, and
SQLite (in WAL mode, where readers never wait) refuses the commit of a transaction that began
before another process committed ("database is locked"). So the processes that write one local
shared store take turns: each write transaction holds an exclusive ``flock`` on ``write.lock`` in
the store's folder, which the operating system releases when the holder exits or is killed.
Reads take no lock and see every commit made before they began. A PostgreSQL catalog takes
concurrent writers (on several machines, where a lock file could not reach): DuckLake merges their
inserts, and a transaction that changed a table another one changed meanwhile fails at its commit
(``Store.write`` then runs again; see ``Store.transaction``).
"""
from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

# seconds a write waits for another process's write before it gives up ($ROLLOUT_STUDIO_WRITE_WAIT)
DEFAULT_WAIT_S = 600.0


class WriteLock:
    """The lock file of one shared store's folder; :meth:`acquire` / :meth:`release` around a write."""

    def __init__(self, folder: str | Path):
        self.path = Path(folder) / "write.lock"
        self._fd: int | None = None

    def acquire(self, wait_s: float | None = None) -> None:
        """Take the lock, waiting up to ``wait_s`` (default ``$ROLLOUT_STUDIO_WRITE_WAIT`` or 600 s).

        Raises:
            TimeoutError: another process kept writing longer than that (its pid in the message).
        """
        limit = float(os.environ.get("ROLLOUT_STUDIO_WRITE_WAIT", DEFAULT_WAIT_S)) if wait_s is None else wait_s
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        start, pause = time.monotonic(), 0.005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() - start >= limit:
                    holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
                    os.close(fd)
                    raise TimeoutError(f"{holder} has been writing to the store for over {limit:g} s") from None
                time.sleep(pause)
                pause = min(pause * 2, 0.1)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"process {os.getpid()} on {os.uname().nodename}".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
