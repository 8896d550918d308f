"""Garbage collection for a served studio: built pages are frozen out of the cyclic collector.

A page is ~35,000 Python objects (its Bokeh models, Panel components and their parameters),
all of them in reference cycles and alive as long as the page is open. CPython's full
collection walks every live object: with twenty pages open one took 250-600 ms, and it stops
every page of the process while it runs. Twenty people clicking kept the server busy enough
that one such pause left a backlog of slow clicks for ten seconds.

So once a page is built, what is alive then is collected a last time and frozen
(``gc.freeze``: the cyclic collector skips it from then on; reference counting still frees
it). Later collections walk only what was made since: milliseconds. A closed page's cycles
are in the frozen set, so they wait for a *sweep* (unfreeze, one full collection, freeze
again), which runs when the server has had a quiet moment (no click and no page opened for
``QUIET_S``: a sweep walks every open page, ~0.7 s with twenty, which a person opening a page or
clicking would wait for) or, under constant use, once ``MAX_CLOSED`` pages wait for it.
"""
from __future__ import annotations

import gc
import time

from bokeh.document import Document
from tornado.ioloop import IOLoop

QUIET_S = 2.0  # a sweep waits for this long without a click in any page or a page opened
MAX_CLOSED = 20  # ...or for this many closed pages to be waiting (~6 MB each, held until then)
CHECK_S = 1.0

_last_click = 0.0
_closed = 0
_checking = False


def track(doc: Document) -> None:
    """Freeze ``doc``'s page once it is built; sweep its objects after it closes."""
    clicked()  # a page opening is not a quiet moment
    doc.add_next_tick_callback(_freeze)  # runs once the session's models exist
    doc.on_session_destroyed(_on_closed)


def clicked() -> None:
    """A page is in use (clicked, or opening): sweeps wait for a quiet moment."""
    global _last_click
    _last_click = time.monotonic()


def _freeze() -> None:
    gc.collect()  # only what is not frozen yet: the new page and what was made since the last freeze
    gc.freeze()


def _on_closed(_ctx) -> None:
    global _closed, _checking
    _closed += 1
    if not _checking:
        _checking = True
        IOLoop.current().call_later(CHECK_S, _check)


def _check() -> None:
    global _closed, _checking
    if time.monotonic() - _last_click < QUIET_S and _closed < MAX_CLOSED:
        IOLoop.current().call_later(CHECK_S, _check)
        return
    _checking, _closed = False, 0
    gc.unfreeze()
    _freeze()
