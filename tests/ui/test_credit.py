"""Advantages and step rewards in real Chromium: switch the estimator and watch the strip's
per-token values change; compute information gain and see step bars under the tokens."""
from __future__ import annotations

import os
import time

import pytest

from .harness import open_sampled_row, text, unfold, wait_text

pytestmark = pytest.mark.ui


def channel_values(page) -> list[float]:
    return [float(v) for v in page.locator(".token-strip .tok").evaluate_all(
        "els => els.map(e => e.dataset.channelValue)") if v]


def wait_values(page, differs_from: list[float] | None, timeout_s: float = 20) -> list[float]:
    deadline = time.time() + timeout_s
    while True:
        got = channel_values(page)
        if got and got != differs_from or time.time() > deadline:
            assert got and got != differs_from, (got, differs_from)
            return got
        page.wait_for_timeout(200)


def pick(page, css: str, label: str) -> None:
    """Choose ``label`` in the Panel Select with class ``css``."""
    page.locator(f"{css} select").select_option(label=label)


def open_row_with_advantage(page) -> None:
    """Open a sampled rollout whose group is not all-equal (its advantage is not 0)."""
    rows = page.locator(".rollout-table .tabulator-row")
    adv = rows.locator("[tabulator-field=advantage]").all_inner_texts()
    forks = rows.locator("[tabulator-field=fork_pos]").all_inner_texts()
    nth = [i for i, (a, f) in enumerate(zip(adv, forks)) if not f.strip()]
    k = next(j for j, i in enumerate(nth) if abs(float(adv[i] or 0)) > 0.05)
    open_sampled_row(page, k)


def test_switching_the_estimator_changes_the_strip_and_step_bars_appear(page):
    open_row_with_advantage(page)
    page.locator(".channel-picker button", has_text="advantage").click()
    page.wait_for_selector('.token-strip .strip[data-channel="advantage"]', timeout=10_000)
    grpo = wait_values(page, None)
    assert len(set(grpo)) == 1  # GRPO: one value on every token
    unfold(page, "credit-card")  # the advantage settings are folded until wanted
    pick(page, ".estimator", "RLOO (leave-one-out)")
    wait_text(page, page.locator(".strip-legend"), "RLOO (leave-one-out)")
    rloo = wait_values(page, grpo)
    assert len(set(rloo)) == 1 and (grpo[0] > 0) == (rloo[0] > 0)  # same sign, another scale
    # the tab compares the two and computes information-gain step rewards with the sample policy
    page.locator(".lower-tabs .bk-tab", has_text="Advantages & steps").click()
    wait_text(page, page.locator(".estimator-compare"), "sign flips")
    page.locator(".ig-button button").click()
    wait_text(page, page.locator(".step-status"), "stored step rewards ig-", timeout_s=180)
    page.wait_for_selector(".token-strip .sbar[data-step-value]", timeout=30_000)
    bars = page.locator(".token-strip .sbar[data-step-value]").evaluate_all("els => els.map(e => +e.dataset.stepValue)")
    assert bars and all(-1.0 <= b <= 1.0 for b in bars)  # differences of two probabilities
    assert "step reward · ig-" in text(page.locator(".strip-legend"))
    # aggregation: the header's outcome follows the chosen aggregation
    wait_text(page, page.locator(".strip-header"), "gated R (τ=1)")
    assert "min" in text(page.locator(".strip-header"))
    page.locator(".step-agg select").select_option("sum")
    wait_text(page, page.locator(".strip-header"), "sum")
    # a process reward model scores the same steps: P(step correct), so every bar is in (0, 1)
    page.locator(".prm-button button").click()
    wait_text(page, page.locator(".step-status"), "stored step rewards prm-", timeout_s=180)
    wait_text(page, page.locator(".strip-legend"), "step reward · prm-")
    prm = page.locator(".token-strip .sbar[data-step-value]").evaluate_all("els => els.map(e => +e.dataset.stepValue)")
    assert len(prm) == len(bars) and prm != bars and all(0.0 < b < 1.0 for b in prm)
    # under them, each step's advantage within its group (process supervision): a later step's
    # advantage is the earlier one's minus that step's normalised reward, so they differ
    advs = page.locator(".token-strip .abar[data-step-adv]").evaluate_all("els => els.map(e => +e.dataset.stepAdv)")
    assert len(advs) == len(prm) and len(set(advs)) == len(advs)
    assert "step advantage" in text(page.locator(".strip-legend"))
    # a critic's values make GAE vary along the tokens: A_t = R - V(s_t) with γ = λ = 1
    page.locator(".value-button button").click()
    wait_text(page, page.locator(".step-status"), "stored per-token values value-", timeout_s=180)
    before = channel_values(page)
    pick(page, ".estimator", "PPO GAE (critic values)")
    wait_text(page, page.locator(".strip-legend"), "GAE")
    gae = wait_values(page, before)
    assert len(set(gae)) > 1 and len(gae) == len(before)
    if os.environ.get("STUDIO_SHOTS"):
        page.screenshot(path=os.path.join(os.environ["STUDIO_SHOTS"], "credit.png"), full_page=True)
