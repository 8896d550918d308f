"""Agent trajectories in the served page (Chromium): a tool's hostile output shown as text and wrapped,
tool responses greyed and tagged masked, a failed call in red, per-turn bars under assistant turns,
and the sidebar's trajectory filters changing the table and its counts."""
from __future__ import annotations

import re

import pytest

from sample_data import ROLLOUTS_DIR
from studio.store import Store
from tests.test_trajectory_views import HOSTILE, write_trajectories

from .harness import Server, studio_page, text
from .test_layout import OVERFLOW

pytestmark = pytest.mark.ui


@pytest.fixture(scope="module")
def agents(tmp_path_factory):
    """A served store: the arithmetic world and one group of four agent trajectories."""
    db = tmp_path_factory.mktemp("agents") / "studio.duckdb"
    store = Store.open(db, seed_dir=ROLLOUTS_DIR)
    write_trajectories(store)
    total = int(store.scalar("SELECT count(*) FROM rollouts"))
    store.close()
    s = Server(db)
    yield s, total
    s.stop()


def counts(page) -> tuple[int, int]:
    """(rows the filter keeps, rollouts in the store) from the line above the table."""
    m = re.search(r"([\d,]+) of ([\d,]+) rollouts match", text(page.locator(".table-count")))
    return int(m.group(1).replace(",", "")), int(m.group(2).replace(",", ""))


def wait_counts(page, kept: int, timeout_ms: int = 20_000) -> None:
    for _ in range(timeout_ms // 200):
        if counts(page)[0] == kept:
            return
        page.wait_for_timeout(200)
    assert counts(page)[0] == kept


def set_min_turns(page, n: int) -> None:
    box = page.locator(".trajectory-filters input").first
    box.fill(str(n))
    box.press("Tab")


def test_hostile_tool_output_is_shown_as_text_and_wraps(browser, agents):
    server, _ = agents
    with studio_page(browser, server) as page:
        page.set_viewport_size({"width": 1280, "height": 800})
        dialogs = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.locator(".trajectory-filters select").select_option("search")
        wait_counts(page, 1)
        page.locator(".rollout-table .tabulator-row").first.click()
        reply = page.locator(".token-strip .tool-reply").first
        reply.wait_for(state="visible", timeout=20_000)
        assert HOSTILE in reply.inner_text() and '"name":"item-00299"' in text(reply)  # the whole 20 kB, as text
        assert dialogs == []
        # greyed and tagged: not trained
        assert reply.evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(241, 243, 245)"
        assert reply.locator(".masked-tag").inner_text().lower() == "masked"
        # the one-line JSON breaks inside its block; nothing on the page scrolls sideways
        body = reply.locator(".t-body")
        assert body.evaluate("e => e.scrollWidth <= e.clientWidth")
        assert page.evaluate(OVERFLOW) == []
        assert dialogs == []


def test_a_failed_call_and_the_bars_under_each_assistant_turn(browser, agents):
    server, _ = agents
    with studio_page(browser, server) as page:
        page.locator(".trajectory-filters button", has_text="some failed").click()
        wait_counts(page, 1)
        assert page.locator(".rollout-table .tabulator-row [tabulator-field=turns]").first.inner_text() == "5·2⚙·1✗"
        page.locator(".rollout-table .tabulator-row").first.click()
        page.locator(".token-strip .tool-reply.failed").wait_for(state="visible", timeout=20_000)
        strip = page.locator(".token-strip")
        failed = strip.locator(".tool-reply.failed")
        assert "call failed" in failed.inner_text() and "not valid JSON" in failed.inner_text()
        assert failed.evaluate("e => getComputedStyle(e).borderLeftColor") == "rgb(224, 49, 49)"
        assert strip.locator(".tool-call").count() == 2 and strip.locator(".tool-reply .masked-tag").count() == 2
        # three assistant turns, each with its two reward bars and its advantage
        assert strip.locator(".turn.assistant").count() == 3
        assert strip.locator(".tbar.reward").count() == 6 and strip.locator(".tbar.adv").count() == 3
        assert strip.locator(".tok.masked").count() == 0  # a tool's tokens are its block, not coloured tokens
        assert "turn reward" in text(page.locator(".strip-legend")) and "masked" in text(page.locator(".strip-legend"))


def test_the_trajectory_filters_change_the_table_and_its_counts(browser, agents):
    server, total = agents
    with studio_page(browser, server) as page:
        assert counts(page) == (total, total)
        set_min_turns(page, 3)
        wait_counts(page, 3)
        set_min_turns(page, 4)
        wait_counts(page, 1)
        set_min_turns(page, 1)
        wait_counts(page, total)
        page.locator(".trajectory-filters button", has_text="none failed").click()
        wait_counts(page, total - 1)
        page.locator(".trajectory-filters select").select_option("calculator")
        wait_counts(page, 1)
        assert page.locator(".rollout-table .tabulator-row [tabulator-field=turns]").first.inner_text() == "3·1⚙"
        page.locator(".trajectory-filters button", has_text="all").click()
        wait_counts(page, 2)
        assert counts(page) == (2, total)
