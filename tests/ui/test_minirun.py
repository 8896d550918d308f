"""Mini-runs in real Chromium: "Retrain with this rule" opens the form with the rule, a
short run starts, two tabs both follow it to the end, the curves draw, a step's rollouts
open in the table, the trained checkpoint becomes a policy the sidebar offers, and a second run's
curves are drawn over the first's."""
from __future__ import annotations

import os

import pytest

from .harness import studio_page, wait_text

pytestmark = pytest.mark.ui


def set_input(page, css: str, value) -> None:
    box = page.locator(f"{css} input").first
    box.fill(str(value))
    box.press("Enter")


def test_a_mini_run_from_the_rule_panel_to_the_table(browser, server):
    with studio_page(browser, server) as page, studio_page(browser, server) as other:
        page.locator(".lower-tabs .bk-tab", has_text="Reward rules").click()
        page.locator(".retrain-button button").click()
        wait_text(page, page.locator(".run-message"), "reward set to arithmetic")
        page.wait_for_function("() => true")
        for _ in range(50):
            if "arithmetic" in page.locator(".train-rule select").input_value():
                break
            page.wait_for_timeout(200)
        assert "arithmetic" in page.locator(".train-rule select").input_value()
        set_input(page, ".cfg-steps", 4)
        set_input(page, ".cfg-prompts-per-step", 4)
        set_input(page, ".cfg-group-size", 4)
        set_input(page, ".cfg-checkpoint-every", 2)
        page.locator(".run-name input").fill("ui run")
        page.locator(".run-name input").press("Enter")
        page.wait_for_timeout(300)
        page.locator(".start-run button").click()
        wait_text(page, page.locator(".run-message"), "started")
        # the second tab follows the same run
        other.locator(".lower-tabs .bk-tab", has_text="Mini-runs").click()
        wait_text(other, other.locator(".run-status"), "status", timeout_s=30)
        wait_text(page, page.locator(".run-status"), "step 4 / 4", timeout_s=240)
        wait_text(page, page.locator(".run-state"), "done", timeout_s=60)
        wait_text(other, other.locator(".run-status"), "step 4 / 4", timeout_s=30)
        assert int(page.locator(".run-progress progress").first.get_attribute("value")) == 100
        page.wait_for_selector(".run-curves canvas", timeout=30_000)
        # a second run on the same settings while none runs is fine; asking twice at once is refused
        # (covered in tests/test_minirun.py); here: jump to step 2's rollouts
        set_input(page, ".jump-step", 2)
        page.locator(".jump-button button").click()
        wait_text(page, page.locator(".table-count"), "16 of", timeout_s=30)
        for _ in range(50):  # the sidebar filter follows the jump
            if page.locator(".train-step select").input_value() == "step 2":
                break
            page.wait_for_timeout(200)
        assert page.locator(".train-step select").input_value() == "step 2"
        wait_text(page, page.locator(".strip-header"), "prompt Q:", timeout_s=30)
        # the checkpoints are policies now: the sidebar and the evaluation pickers offer them
        page.wait_for_function("() => true")
        opts = page.locator(".policy-picker select option").all_inner_texts()
        assert any("ui run · step 4" in o for o in opts), opts
        # the run in the side-by-side table under the curves
        page.locator(".lower-tabs .bk-tab", has_text="Mini-runs").click()
        wait_text(page, page.locator(".run-summary"), "ui run", timeout_s=30)
        assert page.locator(".run-summary tr.summary-row").count() == 1
        if os.environ.get("STUDIO_SHOTS"):
            page.screenshot(path=os.path.join(os.environ["STUDIO_SHOTS"], "minirun.png"), full_page=True)
            page.locator(".minirun-panel").first.screenshot(path=os.path.join(os.environ["STUDIO_SHOTS"],
                                                                              "minirun-panel.png"))
        # and its checkpoint is policy B in Compare policies
        page.locator(".lower-tabs .bk-tab", has_text="Compare policies").click()
        for _ in range(50):
            labels = page.locator(".compare-pick select option").all_inner_texts()
            if any("ui run · step 4" in o for o in labels):
                break
            page.wait_for_timeout(200)
        label = next(o for o in labels if "ui run · step 4" in o)
        page.locator(".compare-pick select").select_option(label=label)
        for _ in range(50):
            if page.locator(".compare-policy input").input_value().endswith("step-00004"):
                break
            page.wait_for_timeout(200)
        assert page.locator(".compare-policy input").input_value().endswith("step-00004")
        # a second run is drawn over the first: its curves start beside the previous run's, not on a blank
        page.locator(".lower-tabs .bk-tab", has_text="Mini-runs").click()
        set_input(page, ".cfg-steps", 200)  # long enough that Stop, not the last step, ends it on a busy machine
        page.locator(".run-name input").fill("ui run two")
        page.locator(".run-name input").press("Enter")
        page.wait_for_timeout(300)
        page.locator(".start-run button").click()
        wait_text(page, page.locator(".run-message"), "started")
        legend = wait_text(page, page.locator(".run-legend"), "ui run two", timeout_s=30)
        assert legend.count("ui run") == 2, legend  # the finished run stays on the plots
        page.wait_for_selector(".run-curves canvas", timeout=30_000)
        page.locator(".stop-run button").click()
        wait_text(page, page.locator(".run-state"), "stopped", timeout_s=240)
