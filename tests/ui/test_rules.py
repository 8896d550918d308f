"""Reward rules in real Chromium: edit a rule, see problems at their line, apply it in the
sandbox, read the diff, switch the shown version and back."""
from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import expect

from .harness import text, wait_text

pytestmark = pytest.mark.ui

LENGTHY = '''from studio.rewardlib import answer_correct, length_penalty


def reward(prompt, completion, gold, steps, **ctx):
    return {"accuracy": answer_correct(ctx["parsed"], gold, ctx["task"]),
            "length": length_penalty(len(completion), 20, 0.05)}
'''


def set_source(page, source: str) -> None:
    """Replace the editor's text the way typing would (through Ace's own API)."""
    page.locator(".rule-editor .ace_editor").first.evaluate("(el, src) => el.env.editor.setValue(src, 1)", source)
    page.wait_for_timeout(400)  # the editor syncs its value to the server on change


def table_rewards(page) -> list[str]:
    return page.locator(".rollout-table .tabulator-row [tabulator-field=reward]").all_inner_texts()


def pick_shown(page, startswith: str) -> None:
    sel = page.locator(".version-shown select")
    label = next(o for o in sel.locator("option").all_inner_texts() if o.startswith(startswith))
    sel.select_option(label=label)


def test_edit_apply_diff_and_switch_version_back(page):
    page.locator(".lower-tabs .bk-tab", has_text="Reward rules").click()
    expect(page.locator(".rule-editor .ace_content")).to_be_visible(timeout=20_000)
    assert "def reward(prompt, completion, gold, steps, **ctx)" in text(page.locator(".rule-editor"))

    # a syntax error is shown at its line, in the status and in the editor's gutter
    set_source(page, "def reward(prompt, completion, gold, steps, **ctx):\n    return (1 +\n")
    page.locator(".rule-check button").click()
    wait_text(page, page.locator(".rule-status"), "line 2:")
    expect(page.locator(".rule-editor .ace_gutter-cell.ace_error")).to_have_count(1, timeout=10_000)

    # a real rule: applied to all 512 stored rollouts in the sandbox
    before = table_rewards(page)
    set_source(page, LENGTHY)
    page.locator(".rule-name input").fill("lengthy")
    page.locator(".rule-name input").press("Tab")
    page.locator(".rule-apply button").click()
    status = wait_text(page, page.locator(".rule-status"), "rollouts scored", timeout_s=120)
    assert re.search(r"lengthy@[0-9a-f]{10}: 512 rollouts scored", status), status
    summary = wait_text(page, page.locator(".rule-diff .diff-summary"), "512 rollouts scored by both")
    changed = int(re.search(r"([\d,]+) changed reward", summary).group(1).replace(",", ""))
    assert changed > 0
    rows = page.locator(".rule-diff tr.diff-row")
    assert 0 < rows.count() <= 40
    expect(page.locator(".version-b select")).to_have_value(re.compile(r"^lengthy@"), timeout=10_000)
    expect(page.locator(".version-a select")).to_have_value(re.compile(r"^arithmetic@"))

    # a diff row opens its rollout in the token strip
    completion = rows.first.locator("td").nth(1).inner_text().strip()
    rows.first.click()
    deadline = time.time() + 20
    while True:
        shown = "".join(page.locator(".token-strip .tok").evaluate_all("els => els.map(e => e.firstChild.textContent)"))
        if shown.startswith(completion) or time.time() > deadline:
            assert shown.startswith(completion), (shown, completion)
            break
        page.wait_for_timeout(200)

    # the views follow the version picked in the sidebar, and come back
    pick_shown(page, "lengthy@")
    expect(page.locator(".rollout-table .tabulator-row").first).to_be_visible()
    page.wait_for_timeout(1500)
    with_new = table_rewards(page)
    assert with_new != before
    pick_shown(page, "arithmetic@")
    page.wait_for_timeout(1500)
    assert table_rewards(page) == before


def test_hacking_tab_compares_the_new_version_with_the_built_in_rule(page):
    """After the rule above, the hacking tab shows its length correlation, the variance
    shares and the disagreement matrix against the built-in rule."""
    page.locator(".lower-tabs .bk-tab", has_text="Reward hacking").click()
    expect(page.locator(".source-b select")).to_have_value(re.compile(r"^lengthy@"), timeout=20_000)
    summary = wait_text(page, page.locator(".disagreement"), "agree on")
    assert "A = arithmetic@" in summary and "B = lengthy@" in summary
    cells = page.locator(".disagreement table.matrix td").all_inner_texts()
    assert len(cells) == 4 and sum(int(c.split()[0].replace(",", "")) for c in cells) == 512
    corr = text(page.locator(".length-corr"))
    assert "lengthy@" in corr and "arithmetic@" in corr
