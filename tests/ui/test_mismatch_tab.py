"""The Mismatch tab in the served page (Chromium), on the arithmetic world beside the seeded mismatch
world (two 8-step mini-runs whose bfloat16 sampler's log-probs sit beside the float32 trainer's): its
sections drawn, a worst token opening the strip at that token on the mismatch channel, a step listing
its worst tokens, the Rescore form on the sample policy, and the views at two window sizes."""
from __future__ import annotations

import os

import pytest

from sample_data import MISMATCH_RUNS_DIR, ROLLOUTS_DIR

from .harness import Server, open_tab, studio_page, text, wait_text
from .test_layout import OVERFLOW

pytestmark = pytest.mark.ui


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("mismatch-tab") / "studio.duckdb", seed=[ROLLOUTS_DIR, MISMATCH_RUNS_DIR])
    yield s
    s.stop()


def open_mismatch(page) -> None:
    open_tab(page, "Mismatch")
    wait_text(page, page.locator(".mismatch-summary"), "tokens with Δ", timeout_s=60)
    page.locator(".mismatch-worst tr.mm-row").first.wait_for(state="visible", timeout=30_000)
    # every section is its own message, the engines the last (after the drift plot's render)
    wait_text(page, page.locator(".mismatch-engines"), "float32", timeout_s=60)


def shot(page, name: str) -> None:
    """The window with the tab's top in view, then with its engines in view (``STUDIO_SHOTS``: where)."""
    if os.environ.get("STUDIO_SHOTS"):
        for part in (".mismatch-summary", ".mismatch-engines"):
            page.locator(part).first.scroll_into_view_if_needed()
            page.screenshot(path=os.path.join(os.environ["STUDIO_SHOTS"], f"{name}{part.replace('.mismatch-', '-')}.png"))


def test_the_tab_draws_every_section_and_a_worst_token_opens_the_strip_there(browser, served):
    with studio_page(browser, served) as page:
        open_mismatch(page)
        page.locator(".mismatch-plots canvas").first.wait_for(state="attached", timeout=30_000)
        shares = text(page.locator(".mismatch-shares"))
        assert "tokens clipped" in shares and "sequences rejected" in shares
        assert page.locator(".mismatch-shares tr.own").count() == 1  # the sidebar's correction
        engines = text(page.locator(".mismatch-engines"))
        assert "bfloat16" in engines and "float32" in engines  # the sampler's engine beside the trainer's
        assert "What to do" in engines or "No known cause" in engines
        row = page.locator(".mismatch-worst tr.mm-row").first
        rid, pos = row.get_attribute("data-value").rsplit(":", 1)
        row.click()
        page.locator(f'.token-strip .strip[data-rollout="{rid}"][data-channel="mismatch"]').wait_for(
            state="attached", timeout=30_000)
        page.locator(f'.token-strip .tok.picked[data-pos="{pos}"]').wait_for(state="attached", timeout=20_000)


def test_a_step_click_lists_that_steps_worst_tokens(browser, served):
    with studio_page(browser, served) as page:
        open_mismatch(page)
        steps = page.locator(".mismatch-steps tr.mm-step")
        assert steps.count() == 8  # the mini-runs' training steps
        steps.nth(2).click()
        wait_text(page, page.locator(".mismatch-step-worst"), "Worst tokens of step 3")
        assert page.locator(".mismatch-step-worst tr.mm-row").count() >= 1
        assert page.locator(".mismatch-steps tr.mm-step.own").get_attribute("data-value") == "3"


def test_the_rescore_form_runs_on_the_sample_policy(browser, served):
    with studio_page(browser, served) as page:
        page.locator(".tabulator-row").first.click()  # its group is rescored
        open_mismatch(page)
        page.locator(".rescore-scope select").select_option("selected group")
        page.locator(".rescore-pick select").select_option(label="sample policy")
        page.locator(".rescore-button button").click()
        done = page.locator(".rescore-status .banner", has_text="rescored")
        done.wait_for(state="visible", timeout=240_000)
        assert "train log-probs filled" in done.inner_text()
        assert page.locator(".rescore-status .banner.error").count() == 0


def test_a_missing_policy_folder_is_named_in_the_form(browser, served):
    with studio_page(browser, served) as page:
        page.locator(".tabulator-row").first.click()
        open_mismatch(page)
        page.locator(".rescore-scope select").select_option("selected group")
        box = page.locator(".rescore-policy input")
        box.fill("/nowhere/policy")
        box.press("Enter")
        page.locator(".rescore-button button").click()
        err = page.locator(".rescore-status .banner.error")
        err.wait_for(state="visible", timeout=60_000)
        assert "/nowhere/policy" in err.inner_text()


@pytest.mark.parametrize("width,height", [(1440, 900), (1280, 800)])
def test_the_tab_fits_the_window(browser, served, width, height):
    with studio_page(browser, served) as page:
        page.set_viewport_size({"width": width, "height": height})
        open_mismatch(page)
        page.locator(".mismatch-steps tr.mm-step").first.click()
        wait_text(page, page.locator(".mismatch-step-worst"), "Worst tokens of step 1")
        page.wait_for_timeout(500)
        assert page.evaluate(OVERFLOW) == []
        shot(page, f"mismatch-tab-{width}")
