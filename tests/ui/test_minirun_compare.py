"""Two mini-runs compared side by side in real Chromium, on the seeded mismatch world: the run
without correction as A and the TIS run as B, the setting that differs named, their curves
(reward, accuracy, the mismatch metrics) overlaid and their held-out results beside each other."""
from __future__ import annotations

import os

import pytest

from sample_data import MISMATCH_RUNS_DIR, ROLLOUTS_DIR
from studio.store import Store

from .harness import Server, studio_page, text, wait_text

pytestmark = pytest.mark.ui


@pytest.fixture(scope="module")
def mismatch_server(tmp_path_factory):
    db = tmp_path_factory.mktemp("compare") / "studio.duckdb"
    Store.open(db, seed_dir=(ROLLOUTS_DIR, MISMATCH_RUNS_DIR)).close()
    s = Server(db, seed=None)
    yield s
    s.stop()


def test_two_runs_side_by_side(browser, mismatch_server, tmp_path):
    shots = os.environ.get("STUDIO_SHOTS") or str(tmp_path)
    with studio_page(browser, mismatch_server) as page:
        page.locator(".lower-tabs .bk-tab", has_text="Mini-runs").click()
        compare = page.locator(".run-compare")
        wait_text(page, compare, "settings that differ", timeout_s=60)
        assert "no correction" in page.locator(".compare-a select").input_value() or \
            "no correction" in text(page.locator(".compare-a"))
        assert "TIS" in text(page.locator(".compare-b"))
        got = text(page.locator(".compare-settings"))
        assert "correction none → tis" in got, got
        page.wait_for_selector(".compare-curves canvas", timeout=30_000)
        held = wait_text(page, page.locator(".compare-heldout"), "accuracy", timeout_s=30)
        assert "pass@4" in held and "B − A" in held and "(step 8)" in held
        # both runs' curves are drawn: the mismatch metrics among the plot titles
        plots = page.evaluate("""() => [...document.querySelectorAll('*')].some(e => e.shadowRoot)""")
        assert plots
        for w, h in ((1440, 900), (1280, 800)):
            page.set_viewport_size({"width": w, "height": h})
            page.wait_for_timeout(800)
            compare.first.scroll_into_view_if_needed()
            page.wait_for_timeout(400)
            page.screenshot(path=os.path.join(shots, f"minirun_compare_{w}.png"))
            # the comparison fits the tab: nothing runs off the right edge
            box = compare.first.bounding_box()
            assert box["x"] + box["width"] <= w + 1, (w, box)
