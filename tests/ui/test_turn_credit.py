"""Per-turn credit settings in the served page (Chromium): shown only in a store with agent
trajectories, the normalisation / γ / gate only once turns have rewards and τ only with the gate;
picking a source and the gate changes the turn advantages under the assistant turns."""
from __future__ import annotations

import pytest

from sample_data import ROLLOUTS_DIR
from studio.store import Store
from tests.test_trajectory_views import write_trajectories

from .harness import Server, studio_page, unfold, wait_text

pytestmark = pytest.mark.ui


@pytest.fixture(scope="module")
def agents(tmp_path_factory):
    """A served store: the arithmetic world and one group of four agent trajectories with per-turn
    rewards from two sources (``rule-turns`` and ``ig-sample``)."""
    db = tmp_path_factory.mktemp("turn-credit") / "studio.duckdb"
    store = Store.open(db, seed_dir=ROLLOUTS_DIR)
    write_trajectories(store)
    store.close()
    s = Server(db)
    yield s
    s.stop()


def turn_advantages(page) -> list[str]:
    """The turn advantages drawn under the open trajectory's assistant turns."""
    return page.locator(".token-strip .tbar.adv").evaluate_all("els => els.map(e => e.dataset.value)")


def wait_changed(page, before: list[str], timeout_ms: int = 20_000) -> list[str]:
    """The turn advantages once they differ from ``before`` (the strip redraws)."""
    for _ in range(timeout_ms // 200):
        got = turn_advantages(page)
        if got and got != before:
            return got
        page.wait_for_timeout(200)
    raise AssertionError(f"the turn advantages stayed {before}")


def test_turn_settings_show_only_in_a_store_with_trajectories(page):
    unfold(page, "credit-card")
    assert page.locator(".credit-card .step-source").is_visible()
    assert not page.locator(".credit-card .turn-credit").is_visible()


def test_picking_a_turn_source_and_the_gate_changes_the_turn_advantages(browser, agents):
    with studio_page(browser, agents) as page:
        box = page.locator(".trajectory-filters input").first
        box.fill("5")
        box.press("Tab")
        wait_text(page, page.locator(".table-count"), "1 of ")
        page.locator(".rollout-table .tabulator-row").first.click()
        page.locator(".token-strip .tbar.adv").first.wait_for(state="visible", timeout=20_000)
        unfold(page, "credit-card")
        source = page.locator(".turn-source select")
        assert source.is_visible() and page.locator(".turn-norm select").is_visible()
        assert not page.locator(".turn-tau").is_visible()  # τ acts only with the gate
        # automatic: the first source by name (ig-sample); picking rule-turns redraws the advantages
        wait_text(page, page.locator(".strip-legend"), "turn advantage · ig-sample")
        first = turn_advantages(page)
        source.select_option(label="rule-turns")
        wait_text(page, page.locator(".strip-legend"), "turn advantage · rule-turns")
        by_rule = wait_changed(page, first)
        assert len(by_rule) == len(first) == 3
        # γ = 0: each turn's own normalised reward, not the sum of what follows
        gamma = page.locator(".turn-gamma input")
        gamma.fill("0")
        gamma.press("Tab")
        alone = wait_changed(page, by_rule)
        assert len(alone) == 3
        # the gate: its τ appears, and this failing trajectory's turn rewards stop counting
        page.locator(".turn-gate input").check()
        page.locator(".turn-tau").wait_for(state="visible", timeout=10_000)
        wait_changed(page, alone)
