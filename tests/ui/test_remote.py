"""A studio whose policy is a loopback backend, in real Chromium: the sidebar says where the
policy runs and how it is, Generate goes through HTTP, and a backend that goes down is
reported in place with a Retry that brings the line back once it is up again."""
from __future__ import annotations

import urllib.request

import pytest

from tests.fixtures import DEVICE, Backend

from .harness import Server, start_generate, studio_page, text, wait_text

pytestmark = pytest.mark.ui


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    b = Backend(tmp_path_factory.mktemp("backend"))
    yield b
    b.stop()


@pytest.fixture(scope="module")
def remote_server(tmp_path_factory, backend):
    s = Server(tmp_path_factory.mktemp("ui-remote") / "studio.duckdb", extra=["--policy", backend.url + "/v1"])
    yield s
    s.stop()


def test_the_backend_line_generation_through_http_and_a_retry(browser, remote_server, backend, tmp_path):
    host = backend.url.split("//")[1]
    with studio_page(browser, remote_server) as page:
        line = page.locator(".backend-status")
        wait_text(page, line, " ms", timeout_s=30)
        shown = "".join(page.locator(".backend-status .backend-line").inner_text().split())
        assert shown.startswith(f"remote·{host}·policy·{DEVICE}·") and shown.endswith("ms"), shown
        assert page.locator(".backend-status .backend-dot.ok").count() == 1
        assert not page.locator(".backend-retry button").is_visible()

        start_generate(page, group_size=2, typed="Q: 12+34=")
        page.locator(".generate-status .banner", has_text="done:").wait_for(timeout=120_000)
        assert f"done: 2 rollouts stored on remote {backend.url} ({DEVICE})" in text(page.locator(".generate-status"))

        backend.stop()  # the backend goes away: Generate says so in place, the line turns red with a Retry
        start_generate(page, group_size=2, typed="Q: 1+2=")
        page.locator(".generate-status .banner.error").wait_for(timeout=60_000)
        assert f"no backend answers at {backend.url} (connection refused)" in text(page.locator(".generate-status"))
        wait_text(page, line, "not answering", timeout_s=30)
        assert page.locator(".backend-status .backend-dot.bad").count() == 1
        page.locator(".backend-retry button").wait_for(state="visible", timeout=10_000)

        again = Backend(tmp_path, port=backend.port)  # back up on the same port: Retry brings the line back
        try:
            urllib.request.urlopen(again.url + "/v1/models", timeout=60).read()  # its first card is ready (not "slow")
            page.locator(".backend-retry button").click()
            wait_text(page, line, " ms", timeout_s=30)
            assert page.locator(".backend-status .backend-dot.ok").count() == 1
            page.locator(".backend-retry button").wait_for(state="hidden", timeout=10_000)
        finally:
            again.stop()
