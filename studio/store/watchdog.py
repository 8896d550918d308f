"""The time limit of the store's reads: one thread interrupts the reads that run past theirs."""
from __future__ import annotations

import heapq
import threading
import time
from typing import Any


class _Watchdog:
    """One thread that interrupts reads past their time limit (a timer thread per read cost
    ~10 ms to start on a busy machine: more than a page of the table takes to read)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int]] = []
        self._live: dict[int, Any] = {}  # token -> cursor of a read still running (released reads drop theirs)
        self._seq = 0
        self._thread: threading.Thread | None = None

    def watch(self, cursor, limit_s: float) -> int:
        with self._cond:
            self._seq += 1
            heapq.heappush(self._heap, (time.monotonic() + limit_s, self._seq))
            self._live[self._seq] = cursor
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="store-watchdog", daemon=True)
                self._thread.start()
            if self._heap[0][1] == self._seq:
                # the earliest deadline now: wake the thread to wait for it. Otherwise the thread already
                # wakes no later than this read's limit (a wake-up per read, hundreds a second under
                # load, made every page wait on this thread for the GIL)
                self._cond.notify()
            return self._seq

    def release(self, token: int) -> None:
        with self._cond:
            self._live.pop(token, None)

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][1] not in self._live:
                    heapq.heappop(self._heap)  # finished in time
                if not self._heap:
                    self._cond.wait()
                    continue
                deadline, token = self._heap[0]
                wait = deadline - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
                self._live.pop(token).interrupt()  # under the lock: release() cannot have run, the read is still going


_WATCHDOG = _Watchdog()
