"""Preference data in real Chromium: build pairs by rule, accept two (one with the keyboard,
one with the button), export, and the downloaded file holds exactly those two pairs."""
from __future__ import annotations

import json
import os

import pytest

from .harness import eventually, text, wait_text

pytestmark = pytest.mark.ui

SIDE_TEXT = """el => [...el.querySelectorAll('.tok')].map(e => e.firstChild.textContent)
                    .filter(t => t !== '<eos>').join('')"""


def shown_pair(page) -> dict:
    """The pair on screen: its prompt and the two completions' texts, read from the token strips."""
    card = page.locator(".pair-card")
    return {"prompt": card.locator(".pair-prompt").first.evaluate("e => e.textContent"),
            "chosen": card.locator(".pair-side.chosen").first.evaluate(SIDE_TEXT),
            "rejected": card.locator(".pair-side.rejected").first.evaluate(SIDE_TEXT)}


def test_build_review_and_download_two_pairs(page, tmp_path):
    page.locator(".lower-tabs .bk-tab", has_text="Preference data").click()
    wait_text(page, page.locator(".pair-card"), "No pairs here yet")
    page.locator(".pair-cap input").fill("1")
    page.locator(".pair-cap input").press("Enter")
    page.locator(".build-pairs button").click()
    wait_text(page, page.locator(".build-message"), "new")
    wait_text(page, page.locator(".review-counts"), "0 of")
    wait_text(page, page.locator(".pair-card"), "pending")  # (the card is drawn after the counts)
    # the first pair: accepted with the keyboard (focus outside any text box)
    first = shown_pair(page)
    assert first["chosen"] and first["rejected"] and first["chosen"] != first["rejected"]
    page.locator(".pair-card").first.click()
    page.keyboard.press("a")
    wait_text(page, page.locator(".review-counts"), "1 of")
    # the queue moved on to the next pending pair: accepted with the button
    second = eventually(page, lambda: shown_pair(page), lambda p: p != first, what="the pair card")
    page.locator(".review-accept button").click()
    wait_text(page, page.locator(".review-counts"), "2 of")
    eventually(page, lambda: text(page.locator(".n-accepted")), lambda n: n == "2", what="the accepted count")
    # a third one rejected: not exported
    page.keyboard.press("r")
    wait_text(page, page.locator(".review-counts"), "1 rejected")
    if os.environ.get("STUDIO_SHOTS"):
        page.locator(".curation-panel").first.screenshot(path=os.path.join(os.environ["STUDIO_SHOTS"], "curation.png"))
    # export the accepted pairs and download them
    page.locator(".export-button button").click()
    wait_text(page, page.locator(".export-message"), "2 rows of preference")
    with page.expect_download(timeout=30_000) as dl:
        page.locator(".export-download button").click()
    path = tmp_path / dl.value.suggested_filename
    dl.value.save_as(path)
    assert path.suffix == ".jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted(rows, key=json.dumps) == sorted([first, second], key=json.dumps)
    wait_text(page, page.locator(".export-list"), "preference")
    # and its provenance: the two accepted pairs' decisions, the rule, the file's hash
    with page.expect_download(timeout=30_000) as dl:
        page.locator(".export-provenance button").click()
    prov = json.loads(open(dl.value.path()).read())
    assert dl.value.suggested_filename == f"{path.name}.provenance.json"
    assert prov["rows"] == 2 and "best_vs_worst" in json.dumps(prov)


def picked(page, side: str) -> str:
    for _ in range(50):
        got = text(page.locator(f".picked-{side}"))
        if got != "–":
            return got
        page.wait_for_timeout(200)
    raise AssertionError(f"nothing picked as {side}")


def test_hand_pick_two_completions_of_one_group(page):
    from .harness import open_row

    open_row(page, 0)  # the table's first rollout, and its group in the group view
    page.locator(".lower-tabs .bk-tab", has_text="Preference data").click()
    page.locator(".pick-chosen button").click()
    chosen = picked(page, "chosen")
    page.locator(".lower-tabs .bk-tab", has_text="Group view").click()
    buttons = page.locator(".open-picker button")
    buttons.nth(1).click()  # another completion of the same prompt, opened from the group view
    page.locator(".lower-tabs .bk-tab", has_text="Preference data").click()
    page.locator(".pick-rejected button").click()
    rejected = picked(page, "rejected")
    assert rejected != chosen
    before = int(text(page.locator(".n-accepted")))
    page.locator(".pick-add button").click()
    wait_text(page, page.locator(".build-message"), "hand-picked pair")
    wait_text(page, page.locator(".n-accepted"), str(before + 1))
    page.locator(".review-show select").select_option("accepted")
    wait_text(page, page.locator(".pair-card"), "accepted")
    seen = []

    def sides() -> list[str]:
        return page.locator(".pair-card .pair-side").evaluate_all("els => els.map(e => e.dataset.rollout.slice(-8))")

    ids = sides()
    for _ in range(before + 3):  # walk the accepted pairs to the hand-picked one (the first read may be stale)
        seen.append(ids)
        if ids == [chosen, rejected]:
            break
        page.locator(".review-next button").click()
        ids = eventually(page, sides, lambda got: got != seen[-1], what="the pair card")
    assert [chosen, rejected] in seen, seen
