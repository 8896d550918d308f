"""A callback that fails in a served page says so on that page (``widgets.runtime.errors``), in real
Chromium: a red banner with the exception's message (no traceback), dismissed by its button, and
the traceback logged once per failure. Served in this process so the log can be read directly."""
from __future__ import annotations

import logging

import panel as pn
import pytest

from widgets.base.jobs import start
from widgets.runtime import errors

from .harness import free_port, text

pytestmark = pytest.mark.ui


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def failing_page():
    """A page with the studio's banner and two failing actions: a plain callback and a started coroutine."""
    page = pn.template.BootstrapTemplate(title="errors")
    errors.install(page)
    plain = pn.widgets.Button(name="fail", css_classes=["fail-plain"])
    plain.on_click(lambda _: [][3])  # an IndexError in a widget's callback

    async def later():
        raise ValueError("the started work broke")

    started = pn.widgets.Button(name="start", css_classes=["fail-started"])
    started.on_click(lambda _: start(later))
    page.main.append(pn.Row(plain, started))
    return page


@pytest.fixture(scope="module")
def failing_server():
    port = free_port()
    server = pn.serve(failing_page, port=port, address="127.0.0.1", show=False, threaded=True, start=True)
    yield f"http://127.0.0.1:{port}/"
    server.stop()


def test_a_failing_callback_shows_on_the_page_and_is_logged_once(browser, failing_server):
    records = Records()
    logging.getLogger("rollout_studio.page").addHandler(records)
    page = browser.new_page()
    try:
        page.goto(failing_server)
        page.locator(".fail-plain button").wait_for(timeout=60_000)
        assert not page.locator(".page-error").is_visible()
        page.locator(".fail-plain button").click()
        page.locator(".page-error").wait_for(state="visible", timeout=20_000)
        shown = text(page.locator(".page-error"))
        assert "IndexError: list index out of range" in shown and "Traceback" not in shown
        page.locator(".dismiss-error button").click()
        page.locator(".page-error").wait_for(state="hidden", timeout=20_000)
        page.locator(".fail-started button").click()  # work started on the event loop: the same banner
        page.locator(".page-error").wait_for(state="visible", timeout=20_000)
        assert "ValueError: the started work broke" in text(page.locator(".page-error"))
        assert records.messages == ["a callback of a served page failed"] * 2
    finally:
        logging.getLogger("rollout_studio.page").removeHandler(records)
        page.close()
