"""Background work of the views: one mechanism for starting, following, cancelling and
superseding what a panel runs off the event loop.

One event loop serves every open page of the process, so long work never runs in a
callback. A :class:`Job` is one kind of work a view starts (a Generate, a branch, a rule
applied, a query, a health check) and gives it:

* **off the event loop**: :meth:`Job.thread` runs a function on a thread (DuckDB and the
  importers release the GIL); the worker pool's coroutines are awaited as they are;
* **progress into the page**: a thread function given ``progress`` is called with a
  ``report(done, total)``, and what it last reported reaches ``progress(done, total)`` on the
  event loop every ``every`` seconds (a coroutine's progress callback already runs there);
* **one run at a time, with cancel**: :meth:`Job.claim` marks a run (while
  :attr:`Job.running` a second press does nothing), hands it a fresh ``threading.Event`` that
  :meth:`Job.cancel` sets, and tells the view through ``on_running(True / False)`` so it
  disables and enables its buttons in one place;
* **newest wins**: :meth:`Job.submit` runs ``work`` on a thread and hands its result to
  ``done`` in the session only when no newer request of the same job was made meanwhile
  (:meth:`Job.ticket` / :meth:`Job.newest` for work that supersedes by hand);
* **errors in place**: ``failed(message)`` gets what went wrong with a submitted request;
  :func:`failure` words an unexpected error the way every panel shows it; anything else a
  started coroutine raises shows in the page's error banner (``widgets.runtime.errors``).

Outside a served page (a notebook, a script, a test) :meth:`Job.submit` runs at once.

Not a job, on purpose: a click's read-ahead (``widgets.base.preload``: its own four threads, so
twenty pages' clicks do not queue behind one Generate), and the pollers that only look
(``pn.state.add_periodic_callback`` of the Generate panel's progress and the mini-run panel's
status, once a second per page).
"""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from typing import Any

import panel as pn

from widgets.runtime import errors


def served() -> bool:
    """Whether this runs in a served page's session (else a notebook, a script or a test)."""
    doc = pn.state.curdoc
    return doc is not None and doc.session_context is not None


def start(fn: Callable[[], Any]) -> None:
    """Run ``fn`` (a function or a coroutine function) in this session, on the event loop. What it
    raises shows on the page (``widgets.runtime.errors``): Panel reports a function's errors itself,
    but a coroutine runs as a task of its own, whose error would only reach the log."""
    if not inspect.iscoroutinefunction(fn):
        pn.state.execute(fn)
        return
    doc = pn.state.curdoc

    async def reported() -> None:
        try:
            await fn()
        except Exception as exc:  # noqa: BLE001 - shown on the page and logged there
            errors.report(exc, doc)

    pn.state.execute(reported)


def failure(what: str, exc: BaseException) -> str:
    """An unexpected error as a panel shows it in place: ``"<what> failed: <type>: <message>"``."""
    return f"{what} failed: {type(exc).__name__}: {exc}"


class Job:
    """One kind of background work of one view (see the module's description)."""

    def __init__(self, on_running: Callable[[bool], None] | None = None):
        self.on_running = on_running  # called with True as a claimed run starts and False as it ends
        self.running = False
        self.cancelled = threading.Event()
        self._newest = 0

    # -- one run at a time, with cancel ------------------------------------------------------
    @contextlib.contextmanager
    def claim(self) -> Iterator[threading.Event]:
        """One run of the job: yields its cancel event (a fresh one); callers check
        :attr:`running` first, so a second press while it runs does nothing."""
        self.running = True
        self.cancelled = threading.Event()
        if self.on_running is not None:
            self.on_running(True)
        try:
            yield self.cancelled
        finally:
            self.running = False
            if self.on_running is not None:
                self.on_running(False)

    def cancel(self) -> None:
        """Ask the run in flight to stop (the work polls the event it was given)."""
        self.cancelled.set()

    # -- off the event loop, with progress -----------------------------------------------------
    async def thread(self, work: Callable[..., Any], *args, progress: Callable[[int, int], None] | None = None,
                     every: float = 0.25, pool: Executor | None = None) -> Any:
        """Await ``work(*args)`` run on a thread (of ``pool`` when given).

        With ``progress``, ``work`` is called as ``work(report)``: what it last passed to
        ``report(done, total)`` is shown with ``progress(done, total)`` every ``every`` seconds.
        """
        if progress is None:
            if pool is not None:
                return await asyncio.get_running_loop().run_in_executor(pool, lambda: work(*args))
            return await asyncio.to_thread(work, *args)
        seen = [0, 0]

        def report(done: int, total: int) -> None:
            seen[:] = [done, total]

        task = asyncio.ensure_future(asyncio.to_thread(work, report))
        while not task.done():
            await asyncio.sleep(every)
            if seen[1]:
                progress(*seen)
        return task.result()

    # -- newest wins ---------------------------------------------------------------------------
    def ticket(self) -> int:
        """Number a new request: from now on it is the newest, and older ones' results are dropped."""
        self._newest += 1
        return self._newest

    def newest(self, ticket: int) -> bool:
        """Whether ``ticket`` is still the newest request of this job."""
        return ticket == self._newest

    def submit(self, work: Callable[[], Any], done: Callable[[Any], None],
               failed: Callable[[str], None] | None = None, errors: tuple[type[BaseException], ...] = ()) -> None:
        """Run ``work`` on a thread, then ``done(result)`` in the session, unless a newer request
        was submitted meanwhile (its result wins). An error of a type in ``errors`` (a query past
        its time limit...) goes to ``failed(message)`` instead; others propagate (in a served page,
        to its error banner: :func:`start`). Outside a served page, all of it at once."""
        ticket = self.ticket()
        if not served():
            try:
                result = work()
            except errors as exc:
                if failed is not None:
                    failed(str(exc))
                return
            done(result)
            return

        async def run() -> None:
            try:
                result = await asyncio.to_thread(work)
            except errors as exc:  # said in place, by the newest request only
                if failed is not None and self.newest(ticket):
                    failed(str(exc))
                return
            if self.newest(ticket):
                done(result)

        start(run)
