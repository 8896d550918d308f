"""A served studio's garbage collection: built pages are frozen out of the cyclic collector, and a
closed page's objects are freed by a sweep at a quiet moment, not while people click."""
from __future__ import annotations

import asyncio
import gc
import threading
import weakref

import pytest

from widgets.runtime import page_gc


class Page:
    """Stands for a page's objects: a reference cycle, as Bokeh documents and their models are."""

    def __init__(self):
        self.me = self


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(page_gc, "QUIET_S", 0.3)
    monkeypatch.setattr(page_gc, "CHECK_S", 0.05)
    monkeypatch.setattr(page_gc, "MAX_CLOSED", 3)
    monkeypatch.setattr(page_gc, "_closed", 0)
    monkeypatch.setattr(page_gc, "_checking", False)
    yield
    gc.unfreeze()


def run(scenario) -> None:
    """Run ``scenario()`` on an event loop of its own (a browser test may hold this thread's)."""
    failed: list[BaseException] = []

    def target():
        try:
            asyncio.run(scenario())
        except BaseException as exc:  # noqa: BLE001 - raised again in the test's thread
            failed.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(30)
    if failed:
        raise failed[0]


async def clicking(seconds: float) -> None:
    for _ in range(int(seconds / 0.05)):
        page_gc.clicked()
        await asyncio.sleep(0.05)


def test_a_closed_page_is_freed_once_clicks_pause(fast):
    async def scenario():
        page = Page()
        ref = weakref.ref(page)
        page_gc._freeze()  # the page is built: frozen with everything alive
        del page
        gc.collect()
        assert ref() is not None, "a frozen cycle is not collected"
        page_gc._on_closed(None)
        await clicking(0.8)  # people keep clicking: no full collection under them
        assert ref() is not None
        await asyncio.sleep(0.6)  # a quiet moment: the sweep frees it
        assert ref() is None
        assert gc.get_freeze_count() > 0, "what is still alive is frozen again"

    run(scenario)


def test_under_constant_clicks_closed_pages_are_freed_once_enough_wait(fast):
    async def scenario():
        pages = [Page() for _ in range(3)]
        refs = [weakref.ref(p) for p in pages]
        page_gc._freeze()
        del pages
        page_gc._on_closed(None)
        page_gc._on_closed(None)
        await clicking(0.4)
        assert all(r() is not None for r in refs)  # two closed of MAX_CLOSED: they wait
        page_gc._on_closed(None)
        await clicking(0.4)  # the third: swept though nobody paused
        assert all(r() is None for r in refs)

    run(scenario)


def test_pages_being_opened_are_not_a_quiet_moment(fast):
    """A sweep walks every open page (~0.7 s with twenty): not while people open pages either."""
    from bokeh.document import Document

    async def scenario():
        page = Page()
        ref = weakref.ref(page)
        page_gc._freeze()
        del page
        page_gc._on_closed(None)
        for _ in range(16):  # people arrive, nobody clicks yet: no sweep under the page builds
            page_gc.track(Document())
            await asyncio.sleep(0.05)
        assert ref() is not None
        await asyncio.sleep(0.6)  # then a quiet moment
        assert ref() is None

    run(scenario)
