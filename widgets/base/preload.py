"""Read first, then show: a click on a rollout in a served page does every view's store reads
on a thread before any view redraws.

Each view registers a *preloader* (:meth:`Preloading.add_preloader`) that does its store reads
for the new selection on a thread, and its redraw then finds them (:meth:`Preloading.preloaded`).
The event loop, which serves every open page of the process, meanwhile answers other sessions:
DuckDB lets go of the GIL while it reads. A later click supersedes one still reading (newest
wins, ``widgets.base.jobs``), and every view's update reaches the page as one message.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import panel as pn

from widgets.runtime import page_gc

from .jobs import Job, served, start

# The threads every session's selections read on. Four: a click's reads spend most of their time in
# DuckDB, without the GIL, so with two, twenty pages' clicks queued for a thread while a core sat idle
# (benchmarks/bench_load.py, N=20: p95 1.0-1.1 s with two, 0.67-0.79 s with four and one watchdog wake-up
# per deadline, not per read).
_PRELOAD = ThreadPoolExecutor(max_workers=4, thread_name_prefix="studio-preload")


class Preloading:
    """The read-ahead half of :class:`widgets.base.state.StudioState` (a mixin of a
    ``param.Parameterized`` with ``rollout_id``, ``group_id`` and ``refresh``)."""

    def __init__(self, **params):
        super().__init__(**params)
        self._preloaders: list[Callable[[str, str, dict, bool], None]] = []
        self._preloaded: dict[Hashable, Any] = {}
        self._selection = Job()  # newest click wins

    def add_preloader(self, fn: Callable[[str, str, dict, bool], None]) -> None:
        """Register ``fn(rollout_id, group_id, found, fresh)``: it puts into ``found`` what its view
        will read when that rollout and group are shown (``fresh``: after new rows were stored, when
        every view reads again), under the keys the view asks :meth:`preloaded` for. It runs on a
        thread: store reads and pure computation only, no widget changes."""
        self._preloaders.append(fn)

    def fresh_read(self, key: Hashable, read: Callable[[], Any]) -> Callable[[], Any]:
        """A store read a view redraws from whenever new rows are stored (a picker's options, a count):
        after :meth:`stored` it has run on the preload thread, with the others, so the returned function
        gives what it read there; elsewhere (a first draw, a notebook) that function reads at once."""
        def preload(rollout_id: str, group_id: str, found: dict, fresh: bool) -> None:
            if fresh:
                found[key] = read()
        self.add_preloader(preload)
        return lambda: self.preloaded(key, read)

    def preloaded(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """What a preloader read under ``key`` for the update being shown, else ``compute()``."""
        return self._preloaded[key] if key in self._preloaded else compute()

    def select(self, rollout_id: str, group_id: str) -> None:
        """Show ``rollout_id`` and its group ``group_id`` (a click in the rollout table). In a
        served page the views' reads run on a thread first and the views then redraw from them, in
        one message; a later click replaces one still reading. Elsewhere (a notebook, a test), at once."""
        if not served():
            with pn.io.hold():
                self.param.update(rollout_id=rollout_id, group_id=group_id)
            return
        ticket = self._selection.ticket()
        page_gc.clicked()
        start(partial(self._apply, {"rollout_id": rollout_id, "group_id": group_id}, ticket))

    async def stored(self, **changes) -> None:
        """New rows are stored: bump ``refresh`` (with ``changes``, e.g. the group to show), every
        view's reads first run on a thread, then every view redraws, in one message."""
        await self._apply({"refresh": None, **changes}, None)

    async def _apply(self, changes: dict, ticket: int | None) -> None:
        rollout_id, group_id = changes.get("rollout_id", self.rollout_id), changes.get("group_id", self.group_id)
        fresh = "refresh" in changes
        found: dict[Hashable, Any] = {}

        def read() -> None:
            for preload in list(self._preloaders):
                try:
                    preload(rollout_id, group_id, found, fresh)
                except Exception:  # noqa: BLE001 - the view reads again as it redraws and shows the error in place
                    pass
        await self._selection.thread(read, pool=_PRELOAD)
        if ticket is not None and not self._selection.newest(ticket):  # a later click: its reads are under way
            return
        if fresh:
            changes["refresh"] = self.refresh + 1
        self._preloaded = found
        try:
            with pn.io.hold():  # every view's update reaches the page as one message
                self.param.update(**changes)
        finally:
            self._preloaded = {}
