"""Five browser sessions on one server while a Generate writes: no errors, no lost rows."""
from __future__ import annotations

import re
import time
from contextlib import ExitStack

import pytest

from .harness import open_row, rollouts_total, start_generate, strip_text, studio_page, text

pytestmark = pytest.mark.ui


def test_five_sessions_browse_while_a_generate_writes(browser, server):
    with ExitStack() as stack:
        pages = [stack.enter_context(studio_page(browser, server)) for _ in range(5)]
        writer, readers = pages[0], pages[1:]
        total = rollouts_total(writer)
        start_generate(writer, group_size=4, fresh=6)
        # the readers keep browsing (open rows, switch channels) until the writer is done
        channels = ["logprob", "advantage", "entropy"]
        rounds = 0
        deadline = time.time() + 180
        while "done:" not in text(writer.locator(".generate-status")) and time.time() < deadline:
            for i, pg in enumerate(readers):
                open_row(pg, (rounds + i) % 10)
                pg.locator(".channel-picker button", has_text=channels[(rounds + i) % 3]).click()
                assert strip_text(pg)  # every session keeps showing a rollout's tokens
            rounds += 1
        assert rounds >= 1, "the writer finished before the readers could browse"
        assert "done: 24 rollouts stored" in text(writer.locator(".generate-status"))
        # every session sees every row once it reloads: nothing lost, the same count everywhere
        for pg in readers:
            pg.wait_for_timeout(300)  # let the last clicks reach the server before leaving the page
        for pg in pages:
            pg.reload()
            pg.wait_for_selector(".tabulator-row", timeout=60_000)
            shown = re.search(r"of ([\d,]+) rollouts", text(pg.locator(".table-count"))).group(1)
            assert int(shown.replace(",", "")) == total + 24
