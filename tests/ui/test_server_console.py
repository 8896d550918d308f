"""The served studio's console says only what a user should read: a page opened, every plotting
tab drawn, a Generate and a one-step mini-run (sampling, training, a checkpoint written), then
the server stopped; its log holds the start lines and nothing else: no warning from a
dependency (transformers' deprecations, Bokeh's, a log axis), no progress bar from a worker,
no traceback, no semaphore leaked at exit."""
from __future__ import annotations

import re

import pytest

from .harness import Server, rollouts_total, start_generate, studio_page, wait_text

pytestmark = pytest.mark.ui

TABS = ("Entropy landscape", "Compare policies", "Reward hacking", "Advantages & steps", "Preference data",
        "Timeline & diff", "Mini-runs")
# what a user may read in the server's console: where it serves, and Bokeh's own start line
EXPECTED = (re.compile(r"^Rollout Studio on http://127\.0\.0\.1:\d+ "), re.compile(r"^Launching server at http://"))


def set_input(page, css: str, value) -> None:
    box = page.locator(f"{css} input").first
    box.fill(str(value))
    box.press("Enter")


def test_the_server_console_stays_quiet_from_start_to_stop(browser, tmp_path):
    server = Server(tmp_path / "studio.duckdb")
    try:
        with studio_page(browser, server) as page:
            before = rollouts_total(page)
            start_generate(page, 2, typed="Q: 12+34=")
            page.locator(".generate-status .banner", has_text="done:").wait_for(timeout=120_000)
            wait_text(page, page.locator(".table-count"), f"of {before + 2:,} rollouts")
            for title in TABS:
                page.locator(".lower-tabs .bk-tab", has_text=title).click()
                page.wait_for_timeout(1500)
            for css, value in ((".cfg-steps", 1), (".cfg-prompts-per-step", 2), (".cfg-group-size", 2)):
                set_input(page, css, value)
            page.wait_for_timeout(300)
            page.locator(".start-run button").click()
            wait_text(page, page.locator(".run-state"), "done", timeout_s=240)
            page.wait_for_selector(".run-curves canvas", timeout=30_000)
    finally:
        server.stop()
    assert server.proc.returncode == 0, server.output()  # stopped by SIGTERM, it exits as Ctrl-C would
    lines = [line for line in server.output().splitlines() if line.strip()]
    unexpected = [line for line in lines if not any(p.match(line) for p in EXPECTED)]
    assert not unexpected, "\n".join(unexpected)


def test_sigterm_stops_a_server_in_the_middle_of_a_generate(browser, tmp_path):
    """The signal arrives while the page's Generate samples and writes: the server still stops, at
    once and cleanly (a stop raised inside a running callback could be swallowed by it)."""
    import os
    import signal
    import subprocess

    server = Server(tmp_path / "studio.duckdb")
    try:
        ctx = browser.new_context()
        page = ctx.new_page()
        page.goto(server.url)
        page.wait_for_selector(".tabulator-row", timeout=60_000)
        start_generate(page, 8, fresh=16)
        page.locator(".generate-status .banner").first.wait_for(timeout=60_000)
        page.wait_for_timeout(2_000)  # the worker samples, the server writes chunks
        os.killpg(server.proc.pid, signal.SIGTERM)
        try:
            server.proc.wait(30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the server did not stop within 30 s of SIGTERM:\n{server.output()}")
        ctx.close()
    finally:
        server.stop()
    assert server.proc.returncode == 0, server.output()
