"""Reward rules in real Chromium: edit a rule, see Check's verdict and problems at their line,
apply it in the sandbox, read the diff (collapsed, filtered to sign flips and by component),
switch the shown version and back; the hacking tab compares two different versions; both tabs
fit the page at laptop sizes."""
from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import expect

from .harness import eventually, text, wait_text

pytestmark = pytest.mark.ui

LENGTHY = '''from studio.rewardlib import answer_correct, length_penalty


def reward(prompt, completion, gold, steps, **ctx):
    return {"accuracy": answer_correct(ctx["parsed"], gold, ctx["task"]),
            "length": length_penalty(len(completion), 20, 0.05)}
'''

# what of a tab's content lies past the right edge of the page's main area, and what scrolls inside
# it (the page itself is the one scroll area); the tab headers and the editor's own layers are left out
LAYOUT_PROBLEMS = """() => {
  const main = document.querySelector('.lower-tabs').closest('.mh-100') || document.scrollingElement;
  const edge = main.getBoundingClientRect().left + main.clientWidth + 1;
  const out = main.scrollWidth > main.clientWidth + 1 ? ['the page scrolls sideways'] : [];
  const walk = n => {
    for (const c of [...(n.shadowRoot ? n.shadowRoot.children : []), ...n.children]) {
      const cls = typeof c.className === 'string' ? c.className : '';
      if (/ace_|bk-header|bk-tab/.test(cls) || (c.checkVisibility && !c.checkVisibility())) continue;
      const r = c.getBoundingClientRect(), st = getComputedStyle(c);
      if (r.width > 0 && r.right > edge) out.push(`${cls || c.tagName} ends at ${Math.round(r.right)} > ${Math.round(edge)}`);
      for (const [size, client, ov] of [[c.scrollWidth, c.clientWidth, st.overflowX], [c.scrollHeight, c.clientHeight, st.overflowY]])
        if (client > 0 && size > client + 1 && (ov === 'auto' || ov === 'scroll')) out.push(`${cls || c.tagName} scrolls`);
      walk(c);
    }
  };
  walk(document.querySelector('.lower-tabs'));
  return out;
}"""


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


def count(summary: str, label: str) -> int:
    return int(re.search(rf"([\d,]+) {label}", summary).group(1).replace(",", ""))


def listed(page) -> tuple[list[int], list[str]]:
    """The diff list: how many rollouts each of its lines counts (``data-n``; the last may stand for
    the lines not drawn), and the text of every rollout row it lists (shown or in a closed line)."""
    lines = page.locator(".rule-diff details.change, .rule-diff .change.more")
    counts = [int(n) for n in lines.evaluate_all("els => els.map(e => e.dataset.n)")]
    rows = page.locator(".rule-diff tr.diff-row").evaluate_all("els => els.map(e => e.textContent)")
    return counts, rows


def show(page, label: str, needle: str) -> str:
    """Pick a view of the diff list; wait until its count line names it."""
    page.locator(".diff-show button", has_text=re.compile(rf"^{label}$")).click()
    return wait_text(page, page.locator(".rule-diff"), needle)


def test_edit_check_apply_diff_and_switch_version_back(page):
    # one version stored: the comparisons say so instead of comparing it with itself
    page.locator(".lower-tabs .bk-tab", has_text="Reward hacking").click()
    wait_text(page, page.locator(".hacking-note"), "Only one reward version is stored")
    page.locator(".lower-tabs .bk-tab", has_text="Reward rules").click()
    expect(page.locator(".rule-editor .ace_content")).to_be_visible(timeout=20_000)
    assert "def reward(prompt, completion, gold, steps, **ctx)" in text(page.locator(".rule-editor"))
    wait_text(page, page.locator(".diff-head"), "Only one reward version is stored")

    # Check says what it found where it can be seen: a syntax error at its line (and in the gutter)...
    set_source(page, "def reward(prompt, completion, gold, steps, **ctx):\n    return (1 +\n")
    page.locator(".rule-check button").click()
    status = wait_text(page, page.locator(".rule-status"), "line 2:")
    assert "✗ Check" in status and "1 problem" in status
    expect(page.locator(".rule-status")).to_be_in_viewport()
    expect(page.locator(".rule-editor .ace_gutter-cell.ace_error")).to_have_count(1, timeout=10_000)
    # ...and a rule without problems
    set_source(page, LENGTHY)
    page.locator(".rule-check button").click()
    assert "no problems" in wait_text(page, page.locator(".rule-status"), "✓ Check")
    expect(page.locator(".rule-status")).to_be_in_viewport()
    expect(page.locator(".rule-editor .ace_gutter-cell.ace_error")).to_have_count(0, timeout=10_000)

    # a real rule: applied to all 512 stored rollouts in the sandbox
    before = table_rewards(page)
    page.locator(".rule-name input").fill("lengthy")
    page.locator(".rule-name input").press("Tab")
    page.locator(".rule-apply button").click()
    status = wait_text(page, page.locator(".rule-status"), "rollouts scored", timeout_s=120)
    assert re.search(r"lengthy@[0-9a-f]{10}: 512 rollouts scored", status), status
    summary = wait_text(page, page.locator(".diff-head .diff-summary"), "512 rollouts scored by both")
    changed, flips = count(summary, "changed reward"), count(summary, "advantage changed sign")
    assert changed > 0 and flips > 0
    expect(page.locator(".version-b select")).to_have_value(re.compile(r"^lengthy@"), timeout=10_000)
    expect(page.locator(".version-a select")).to_have_value(re.compile(r"^arithmetic@"))

    # identical changes are one line each; the lines' counts add up to the changed rollouts
    wait_text(page, page.locator(".rule-diff"), f"{changed:,} rollouts (changed reward)")
    counts, _ = listed(page)
    assert sum(counts) == changed and 0 < len(counts) < changed

    # a line opens onto its rollouts; a rollout opens in the token strip
    first = page.locator(".rule-diff details.change").first
    first.locator("summary").click()
    row = first.locator("tr.diff-row").first
    completion = row.locator("td").nth(1).inner_text().strip()
    row.click()
    deadline = time.time() + 20
    while True:
        shown = "".join(page.locator(".token-strip .tok").evaluate_all("els => els.map(e => e.firstChild.textContent)"))
        if shown.startswith(completion) or time.time() > deadline:
            assert shown.startswith(completion), (shown, completion)
            break
        page.wait_for_timeout(200)

    # sign flips: exactly the rollouts whose advantage changed sign, every one marked
    show(page, "sign flips", f"{flips:,} rollouts (advantage changed sign)")
    counts, rows = listed(page)
    assert sum(counts) == flips and len(counts) <= 30  # every flipped rollout in a drawn line, up to 10 rows each
    assert len(rows) == sum(min(n, 10) for n in counts) and all("sign flip" in r for r in rows)
    # by component: accuracy is the same check in both rules, the length penalty is new everywhere
    page.locator(".diff-component select").select_option("accuracy")
    wait_text(page, page.locator(".rule-diff"), "No rollout's advantage changed sign.")
    page.locator(".diff-component select").select_option("length")
    show(page, "changed", f"{changed:,} rollouts (changed reward · component length)")
    assert sum(listed(page)[0]) == changed
    # the summary's counts pick their view too
    page.locator(".diff-head .pick", has_text="advantage changed sign").click()
    wait_text(page, page.locator(".rule-diff"), f"{flips:,} rollouts (advantage changed sign · component length)")

    # the views follow the version picked in the sidebar, and come back
    pick_shown(page, "lengthy@")
    expect(page.locator(".rollout-table .tabulator-row").first).to_be_visible()
    eventually(page, lambda: table_rewards(page), lambda got: got != before, what="the table's rewards")
    pick_shown(page, "arithmetic@")
    eventually(page, lambda: table_rewards(page), lambda got: got == before, what="the table's rewards")


def test_hacking_tab_compares_the_new_version_with_the_built_in_rule(page):
    """After the rule above, the hacking tab opens on the two versions (not one with itself) and
    shows the new one's length correlation, the variance shares and the disagreement matrix."""
    page.locator(".lower-tabs .bk-tab", has_text="Reward hacking").click()
    expect(page.locator(".source-b select")).to_have_value(re.compile(r"^lengthy@"), timeout=20_000)
    expect(page.locator(".source-a select")).to_have_value(re.compile(r"^arithmetic@"))
    summary = wait_text(page, page.locator(".disagreement"), "agree on")
    assert "A = arithmetic@" in summary and "B = lengthy@" in summary
    cells = page.locator(".disagreement table.matrix td").all_inner_texts()
    assert len(cells) == 4 and sum(int(c.split()[0].replace(",", "")) for c in cells) == 512
    corr = text(page.locator(".length-corr"))
    assert "lengthy@" in corr and "arithmetic@" in corr


@pytest.mark.parametrize("size", [(1280, 800), (1440, 900)])
def test_both_tabs_fit_the_page_with_the_sidebar_open(page, size):
    """Nothing of either tab past the right edge and nothing scrolling inside it, the diff's
    longest prompts included."""
    page.set_viewport_size({"width": size[0], "height": size[1]})
    page.locator(".lower-tabs .bk-tab", has_text="Reward rules").click()
    wait_text(page, page.locator(".rule-diff"), "distinct changes")
    page.locator(".rule-diff details.change summary").first.click()
    page.wait_for_timeout(500)
    assert page.evaluate(LAYOUT_PROBLEMS) == []
    page.locator(".lower-tabs .bk-tab", has_text="Reward hacking").click()
    wait_text(page, page.locator(".disagreement"), "agree on")
    page.wait_for_timeout(500)
    assert page.evaluate(LAYOUT_PROBLEMS) == []
