"""Entropy forks in real Chromium: pick a token, branch there with the real sample policy,
read the rollout tree, open a branch and branch it again; the strip's ▾ (unsure) marks under
the sidebar's fork rule, the same on a branch's shared prefix as on its root, and the ◆ the tree
puts on a pivotal token."""
from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import expect

from .harness import completion_text, eventually, open_sampled_row, rollouts_total, text, wait_strip, wait_text

pytestmark = pytest.mark.ui

AS_SAMPLED = "as sampled (draw again)"
BRANCH_TIMEOUT_MS = 180_000  # the first request spawns the worker and loads the policy
SHOWN_TO_TEXT = str.maketrans({"↵": "\n", "⇥": "\t", "␣": " "})  # undo the choice labels' whitespace marks


# ---------------------------------------------------------------------------- reading the page


def middle_fork(tokens: list[tuple[int, str, str]], after: int = -1) -> int:
    """A forking token near the middle of the strip (after position ``after``) that has tokens
    after it; a middle token when no fork qualifies."""
    last = len(tokens) - 1
    cands = [pos for pos, _, cls in tokens if "fork" in cls.split() and after < pos < last - 1]
    if not cands:
        cands = [pos for pos, _, _ in tokens if after < pos < last - 1]
    assert cands, f"no token after {after} to branch at in {tokens}"
    return cands[len(cands) // 2]


def pick_token(page, pos: int) -> list[str]:
    """Click the token at ``pos``; return the choice labels the fork panel offers there."""
    page.locator(f'.token-strip .tok[data-pos="{pos}"]').click()
    page.locator(f'.token-strip .tok.picked[data-pos="{pos}"]').wait_for(timeout=20_000)
    page.locator(".fork-head-info .meta-line", has_text=f"fork at token {pos}:").wait_for(timeout=20_000)
    expect(page.locator(".fork-choices input").last).to_be_visible(timeout=20_000)
    labels = [t.strip() for t in page.locator(".fork-choices label").all_text_contents()]
    assert labels[-1] == AS_SAMPLED
    assert sum("← sampled" in lab for lab in labels) == 1, labels
    return labels


def choose_only(page, *wanted: str) -> None:
    """Uncheck every choice, then check exactly ``wanted`` (as a person clicks them)."""
    boxes = page.locator(".fork-choices label").all()
    names = [b.text_content().strip() for b in boxes]
    for box in boxes:
        if box.locator("input").is_checked():
            box.locator("input").uncheck()
    for want in wanted:
        boxes[names.index(want)].locator("input").check()  # exact label: "1  p …" must not pick "11  p …"
    checked = [name for name, b in zip(names, boxes) if b.locator("input").is_checked()]
    assert checked == [n for n in names if n in wanted]


def press_branch(page, n: int) -> str:
    """Set N per choice, press Branch and wait for the outcome; return the status line."""
    field = page.locator(".branch-n input")
    field.fill(str(n))
    field.press("Tab")
    # mark the banner shown now, so the wait below can only match the outcome of this press (a
    # cheap branch may finish before a check that Cancel is enabled would run)
    page.locator(".branch-status .banner").evaluate_all("els => els.forEach(e => e.dataset.stale = '1')")
    page.locator(".branch-button button").click()
    status = page.locator(".branch-status .banner:not([data-stale])",
                          has_text=re.compile("stored and scored|failed|cancelled"))
    status.wait_for(timeout=BRANCH_TIMEOUT_MS)
    got = status.inner_text()
    assert "stored and scored" in got, got
    expect(page.locator(".branch-cancel button")).to_be_disabled()
    expect(page.locator(".branch-button button")).to_be_enabled()
    return got


def tree_root(page) -> str:
    return page.locator(".fork-tree .crumbs .link[data-click=branches]").get_attribute("data-value")


def crumbs(page) -> list[str]:
    return [c.strip() for c in page.locator(".fork-tree .crumbs .link[data-click=open]").all_inner_texts()]


def block(page, pos: int):
    return page.locator(f'.fork-tree .fork-block[data-fork-pos="{pos}"]')


def branch_rows(blk) -> list[list[str]]:
    """The data rows of a fork block's branches table, one list of cell texts per choice."""
    rows = blk.locator("table.branches tr")
    return [rows.nth(i).locator("td").all_inner_texts() for i in range(1, rows.count())]


def comps(page, blk) -> list[dict]:
    """Every completion listed under a fork block (the list unfolded first, as a person does)."""
    details = blk.locator("details.comps")
    for _ in range(10):  # a tree redrawn after the click (a busy machine) comes back folded: unfold it again
        if details.get_attribute("open") is None:
            details.locator("summary").click()
        if blk.locator(".comp").first.is_visible():
            break
        page.wait_for_timeout(1000)
    expect(blk.locator(".comp").first).to_be_visible()
    out = []
    for c in blk.locator(".comp").all():
        spans = c.locator(":scope > span")
        out.append({"id": c.get_attribute("data-value"), "reward": spans.nth(0).inner_text().strip(),
                    "verdict": spans.nth(1).inner_text().strip(),
                    "pre": spans.nth(2).locator(".pre").text_content(),
                    "text": spans.nth(2).text_content(), "current": "current" in c.get_attribute("class")})
    return out


def open_comp(page, pos: int, rollout_id: str) -> None:
    """Click a completion in the tree (unfolding its list first)."""
    blk = block(page, pos)
    details = blk.locator("details.comps")
    if details.get_attribute("open") is None:
        details.locator("summary").click()
    blk.locator(f'.comp[data-value="{rollout_id}"]').click()
    # the tree re-renders around the opened rollout and marks it current
    page.locator(f'.fork-tree .comp.current[data-value="{rollout_id}"]').wait_for(state="attached", timeout=20_000)


def branch_header(page) -> str:
    loc = page.locator(".meta-line span", has_text="branch of")
    loc.wait_for(timeout=20_000)
    return loc.inner_text()


def show_all_in_table(page, root: str) -> list[int]:
    """Press the tree's "show all in table" link; return the fork positions the filtered table's
    fork column shows (a sampled rollout's cell is blank)."""
    page.locator(".fork-tree .crumbs .link[data-click=branches]").click()
    expect(page.locator(".branches-of input")).to_have_value(root, timeout=20_000)
    cells = page.locator(".rollout-table .tabulator-row [tabulator-field=fork_pos]")
    deadline = time.time() + 20
    while time.time() < deadline:
        got = cells.all_inner_texts()
        if got and all(re.search(r"\d", c) for c in got):
            break
        page.wait_for_timeout(200)
    return [int(re.search(r"\d+", c).group()) for c in cells.all_inner_texts()]


# ---------------------------------------------------------------------------- the tests

def test_branch_at_a_fork_on_one_forced_alternative(page):
    total = rollouts_total(page)
    _, parent = open_sampled_row(page, 0)
    fork = middle_fork(parent)
    root = tree_root(page)
    assert crumbs(page) == [f"root · {root[-6:]}"]
    expect(page.locator(".fork-tree .fork-block")).to_have_count(0)

    labels = pick_token(page, fork)
    sampled = next(lab for lab in labels if "← sampled" in lab)
    assert sampled.split("  p ")[0].translate(SHOWN_TO_TEXT) == parent[fork][1]
    # the first alternative that is neither the sampled token nor a special one
    alt = next(lab for lab in labels if lab not in (sampled, AS_SAMPLED) and not lab.startswith("<"))
    alt_shown = alt.split("  p ")[0]
    forced = alt_shown.translate(SHOWN_TO_TEXT)
    choose_only(page, alt)

    status = press_branch(page, 4)
    assert "4 branch completions stored and scored" in status

    # the tree: one fork, one branch (the forced alternative) with four completions
    blk = block(page, fork)
    blk.wait_for(timeout=20_000)
    expect(page.locator(".fork-tree .fork-block")).to_have_count(1)
    assert f"token {fork} of {root[-6:]}" in blk.locator(".fork-head").inner_text()
    rows = branch_rows(blk)
    assert len(rows) == 1, rows
    choice, p, n, value, correct, _ = rows[0]
    assert choice == alt_shown and p == alt.split("  p ")[1] and n == "4"
    assert re.fullmatch(r"-?\d+\.\d{3}(\s±\s\d+\.\d\d)?", value.strip()), value
    assert re.fullmatch(r"\d+%", correct.strip()), correct
    assert "4 branch rollouts" in page.locator(".fork-tree .crumbs").inner_text()

    done = comps(page, blk)
    assert len(done) == 4 and len({c["id"] for c in done}) == 4
    prefix = completion_text(parent[:fork])
    for c in done:
        assert re.fullmatch(r"-?\d+\.\d\d", c["reward"]), c  # every completion shows its reward
        assert c["verdict"] in ("✓", "✗")
        assert c["pre"] == prefix[-12:]  # the shared prefix (its tail, greyed)...
        assert c["text"][len(c["pre"]):].startswith(forced), (c, forced)  # ...then the forced token

    # the table grew by the four branches
    wait_text(page, page.locator(".table-count"), f"of {total + 4:,} rollouts")

    # each completion opens in the strip: the parent's prefix, the forced token at the fork
    for c in done:
        open_comp(page, fork, c["id"])
        toks = wait_strip(page, prefix + c["text"][len(c["pre"]):])
        assert [t for _, t, _ in toks[:fork]] == [t for _, t, _ in parent[:fork]]
        assert toks[fork][0] == fork and toks[fork][1] == forced
        assert page.locator(f'.token-strip .tok[data-pos="{fork}"]').first.evaluate(
            "e => e.firstChild.textContent").translate(SHOWN_TO_TEXT) == forced
        assert branch_header(page) == f"branch of {root} at token {fork}"
        assert crumbs(page) == [f"root · {root[-6:]}", f"@{fork} {alt_shown} · {c['id'][-6:]}"]

    # "show all in table" filters the table to the four branches, each marked with its fork
    assert show_all_in_table(page, root) == [fork] * 4
    assert re.search(r"\b4 of ", text(page.locator(".table-count")))


def test_branch_again_from_a_branch(page):
    _, parent = open_sampled_row(page, 5)
    root = tree_root(page)
    first = middle_fork(parent)
    labels = pick_token(page, first)
    sampled = next(lab for lab in labels if "← sampled" in lab)
    choose_only(page, sampled)  # a cheap first level: the sampled token, forced
    assert "2 branch completions stored and scored" in press_branch(page, 2)
    blk = block(page, first)
    blk.wait_for(timeout=20_000)
    kids = comps(page, blk)
    assert len(kids) == 2

    # open the longest first-level branch and branch it again later on, "as sampled"
    prefix = completion_text(parent[:first])
    kid = max(kids, key=lambda c: len(c["text"]))
    open_comp(page, first, kid["id"])
    kid_toks = wait_strip(page, prefix + kid["text"][len(kid["pre"]):])
    assert branch_header(page) == f"branch of {root} at token {first}"
    second = middle_fork(kid_toks, after=first)
    pick_token(page, second)
    choose_only(page, AS_SAMPLED)
    assert "2 branch completions stored and scored" in press_branch(page, 2)

    # the tree now holds the nested fork too, under the branch it was taken from
    nested = block(page, second)
    nested.wait_for(timeout=20_000)
    expect(page.locator(".fork-tree .fork-block")).to_have_count(2)
    assert f"token {second} of {kid['id'][-6:]}" in nested.locator(".fork-head").inner_text()
    rows = branch_rows(nested)
    assert len(rows) == 1 and rows[0][0] == "as sampled" and rows[0][1] == "–" and rows[0][2] == "2", rows
    assert "4 branch rollouts" in page.locator(".fork-tree .crumbs").inner_text()
    assert crumbs(page)[0] == f"root · {root[-6:]}" and len(crumbs(page)) == 2  # viewing the depth-1 branch

    grandkids = comps(page, nested)
    assert len(grandkids) == 2
    kid_prefix = completion_text(kid_toks[:second])
    for g in grandkids:
        assert re.fullmatch(r"-?\d+\.\d\d", g["reward"]), g
        assert g["pre"] == kid_prefix[-12:]

    # a nested completion: its header names the branch it came from, the crumbs show depth 2
    g = grandkids[0]
    open_comp(page, second, g["id"])
    toks = wait_strip(page, kid_prefix + g["text"][len(g["pre"]):])
    assert [t for _, t, _ in toks[:second]] == [t for _, t, _ in kid_toks[:second]]
    assert branch_header(page) == f"branch of {kid['id']} at token {second}"
    path = crumbs(page)
    assert len(path) == 3, path
    assert path[0] == f"root · {root[-6:]}"
    assert path[1].startswith(f"@{first} ") and path[1].endswith(kid["id"][-6:])
    assert path[2].startswith(f"@{second} ") and path[2].endswith(g["id"][-6:])
    # the breadcrumbs lead back: the root crumb opens the sampled rollout again
    page.locator(".fork-tree .crumbs .link[data-click=open]").first.click()
    wait_strip(page, completion_text(parent))
    expect(page.locator(".meta-line span", has_text="branch of")).to_have_count(0)

    # "show all in table" lists branches at any depth of the root
    forks_col = show_all_in_table(page, root)
    assert sorted(forks_col) == sorted([first] * 2 + [second] * 2)


def marked(page, cls: str) -> set[int]:
    """The positions of the strip's tokens that carry the class ``cls`` (``fork``: ▾, ``pivot``: ◆)."""
    return set(page.locator(f".token-strip .tok.{cls}").evaluate_all("els => els.map(e => +e.dataset.pos)"))


def answer_start(tokens: list[tuple[int, str, str]]) -> int:
    """The position of the first token of the stated answer (after "A:")."""
    text, starts = "", []
    for pos, tok, _ in tokens:
        starts.append((len(text), pos))
        text += tok
    at = text.rindex("A:") + 2
    return next(pos for start, pos in starts if start >= at)


def test_unsure_marks_follow_the_rule_and_the_tree_marks_a_pivotal_token(page):
    """The sidebar's fork rule shows only the settings of its mode; a minimum of 0 (TRL's top 20 %
    alone) marks more tokens, and the legend says which rule decides. Branching at the stated answer
    on the sampled digit and the runner-up is pivotal: the strip marks that token ◆ with the spread in
    its card, and a branch shows its root's ▾ on the prefix they share."""
    for nth in range(8):  # a correct sampled rollout with a stated answer
        completion, parent = open_sampled_row(page, nth)
        if "A:" in completion and "✓" in text(page.locator(".strip-header")):
            break
    legend = page.locator(".strip-legend")
    wait_text(page, legend, "0.50-nat minimum")
    assert "unsure" in text(legend)
    default = marked(page, "fork")

    page.locator(".fork-card .card-header").first.click()
    expect(page.locator(".fork-min input")).to_be_visible(timeout=10_000)
    expect(page.locator(".fork-abs input")).to_be_hidden()  # settings appear only where they act
    page.locator(".fork-min input").fill("0")
    page.locator(".fork-min input").press("Tab")
    wait_text(page, legend, "the top 20% of the tokens of this run decides")
    assert "minimum" not in text(legend)
    # the top 20 % alone marks tokens the policy was sure of (the strip is redrawn after the legend)
    trl = eventually(page, lambda: marked(page, "fork"), lambda got: default < got, what="the strip's forks")

    root = tree_root(page)
    ans = answer_start(parent)
    labels = pick_token(page, ans)
    sampled = next(lab for lab in labels if "← sampled" in lab)
    alt = next(lab for lab in labels if lab not in (sampled, AS_SAMPLED) and not lab.startswith("<"))
    choose_only(page, sampled, alt)
    assert "4 branch completions stored and scored" in press_branch(page, 2)
    blk = block(page, ans)
    blk.wait_for(timeout=20_000)
    assert "pivotal" in blk.get_attribute("class").split()  # a wrong answer digit, forced: the outcome changes
    spread = re.search(r"spread (\d+\.\d+)", blk.locator(".fork-head").inner_text()).group(1)

    # the strip: ◆ on the answer's first token, the spread and each choice's value in its card
    pivot = page.locator(f'.token-strip .tok.pivot[data-pos="{ans}"]')
    expect(pivot).to_have_count(1, timeout=20_000)
    assert marked(page, "pivot") == {ans}
    pivot.hover()
    card = pivot.locator(".card")
    expect(card).to_be_visible()
    assert f"spread {float(spread):.2f}" in card.inner_text() and "◆ pivotal" in card.inner_text()
    wait_text(page, legend, "pivotal")
    assert "1 pivotal" in text(page.locator(".strip-header"))

    # a branch: its root's ▾ on the prefix they share (one population for the tree), the ◆ too
    kid = comps(page, blk)[0]
    open_comp(page, ans, kid["id"])
    toks = wait_strip(page, completion_text(parent[:ans]) + kid["text"][len(kid["pre"]):])
    assert {p for p in marked(page, "fork") if p < ans} == {p for p in trl if p < ans}
    assert marked(page, "pivot") == {ans} and toks[ans][0] == ans
    wait_text(page, legend, "the root's run")
    assert root in branch_header(page)

    # absolute mode: only its threshold shows
    page.locator(".fork-mode button", has_text="absolute").click()
    expect(page.locator(".fork-abs input")).to_be_visible(timeout=10_000)
    expect(page.locator(".fork-min input")).to_be_hidden()
    expect(page.locator(".fork-scope select")).to_be_hidden()
    wait_text(page, legend, "a fixed threshold")


def test_landscape_and_policy_comparison_tabs(page):
    """The entropy landscape draws its four plots with the fork share; comparing with the
    early checkpoint lists tokens whose entropy moved, and a click opens one at its token."""
    page.locator(".lower-tabs .bk-tab", has_text="Entropy landscape").click()
    summary = page.locator(".landscape-summary")
    expect(summary).to_contain_text(re.compile(r"\d+\.\d% of [\d,]+ tokens are forks"), timeout=30_000)
    expect(summary).to_contain_text("forks per rollout: correct")
    expect(page.locator(".landscape-plots canvas").first).to_be_visible(timeout=30_000)
    expect(page.locator(".landscape-plots canvas").nth(3)).to_be_visible(timeout=30_000)  # four plots
    open_sampled_row(page, 0)
    page.locator(".lower-tabs .bk-tab", has_text="Compare policies").click()
    page.locator(".compare-button button").click()
    rows = page.locator(".compare-table tr.dh-row")
    expect(rows.first).to_be_visible(timeout=BRANCH_TIMEOUT_MS)
    expect(page.locator(".compare-status")).to_contain_text("rollouts scored by policy_early@")
    assert 0 < rows.count() <= 20  # the twenty largest changes
    first = rows.first.inner_text()
    assert "→" in first  # p(token) A → B
    rows.first.click()
    expect(page.locator(".token-strip .tok.picked")).to_have_count(1, timeout=20_000)


def test_branching_left_no_server_traceback(server):
    """Over the whole module (every page, every branch request), the server logged no traceback."""
    log = server.output()
    assert not server.tracebacks(), server.tracebacks()
    assert "branching failed" not in log
