"""The served studio in real Chromium: what a person sees and does."""
from __future__ import annotations

import re
import time

import numpy as np
import pytest
from playwright.sync_api import expect

from studio.store.runs import start_run

from .harness import (
    Server,
    eventually,
    open_row,
    rollouts_total,
    set_sidebar,
    start_generate,
    strip_text,
    studio_page,
    text,
    wait_text,
)

pytestmark = pytest.mark.ui


def strip_colours(page) -> list[str]:
    return page.locator(".token-strip .tok").evaluate_all("els => els.map(e => e.style.background)")


SHEET_LINKS = """() => {
  let n = 0;
  const walk = root => {
    for (const el of root.querySelectorAll('*')) {
      if (el.shadowRoot) { n += el.shadowRoot.querySelectorAll('link[rel="stylesheet"]').length; walk(el.shadowRoot); }
    }
  };
  walk(document);
  return n;
}"""


def test_a_first_click_restyles_nothing(page):
    """The page's panes have all their stylesheets from the start: a first click adds none (Panel
    would send them with each pane's first update, and Bokeh walks the whole page for each)."""
    before = page.evaluate(SHEET_LINKS)
    open_row(page, 4)
    page.wait_for_timeout(500)
    assert before > 20 and page.evaluate(SHEET_LINKS) == before
    open_row(page, 9)
    page.wait_for_timeout(500)
    assert page.evaluate(SHEET_LINKS) == before


def test_page_loads_with_table_legend_and_no_traceback(page):
    assert "Rollout Studio" in page.title()
    count = text(page.locator(".table-count"))
    assert re.search(r"\d+ of \d+ rollouts match · rows 1–\d+ shown", count)
    assert page.locator(".tabulator-row").count() >= 10
    # it opens on a rollout of a group with right and wrong answers, its row selected
    page.wait_for_selector(".token-strip .tok", timeout=30_000)
    assert page.locator(".rollout-table .tabulator-row.tabulator-selected").count() == 1
    cards = text(page.locator(".group-grid"))
    assert "✓" in cards and "✗" in cards
    assert "Traceback" not in page.content()


TABS = {  # each lower tab, and an element only its view draws
    "Group view": ".group-grid", "Entropy landscape": ".landscape-summary", "Compare policies": ".compare-button",
    "Mismatch": ".mismatch-summary",
    "Reward rules": ".rule-editor", "Reward hacking": ".length-corr", "Advantages & steps": ".ig-button",
    "Mini-runs": ".start-run", "Preference data": ".build-pairs", "Timeline & diff": ".timeline-prompt",
    "Import & enrich": ".import-source", "SQL": ".sql-run",
}


def test_every_tab_draws_when_opened_and_nothing_leaves_loopback(browser, server):
    """Tabs other than the first are built when first opened (a page costs one tab, not eleven);
    each then draws its view, with every resource from this server, none from a CDN."""
    ctx = browser.new_context(viewport={"width": 1600, "height": 1000})
    page = ctx.new_page()
    outside: list[str] = []
    page.on("request", lambda r: outside.append(r.url) if not r.url.startswith(("http://127.0.0.1", "ws://127.0.0.1",
                                                                                "data:", "blob:")) else None)
    errors: list[str] = []  # a widget updated before the browser built it fails here, in its JavaScript
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(server.url)
        page.wait_for_selector(".tabulator-row", timeout=60_000)
        for name, marker in list(TABS.items())[1:]:
            assert page.locator(marker).count() == 0, f"{name} was built before it was opened"
        for name, marker in TABS.items():
            page.locator(".lower-tabs .bk-tab", has_text=name).click()
            page.locator(marker).first.wait_for(state="attached", timeout=30_000)
        page.locator(".lower-tabs .bk-tab", has_text="Group view").click()  # kept, not rebuilt
        page.locator(".group-grid").first.wait_for(state="attached", timeout=10_000)
        page.wait_for_timeout(1000)  # late updates of the last tab opened
        assert outside == [], outside
        assert errors == [], errors
    finally:
        ctx.close()


def test_selecting_a_row_shows_its_tokens(page):
    completions = page.locator(".tabulator-row [tabulator-field=completion]").all_inner_texts()
    first, other = 0, next(i for i, c in enumerate(completions) if c != completions[0])
    for n in (first, other):
        page.locator(".tabulator-row").nth(n).click()
        deadline = time.time() + 20
        while strip_text(page) != completions[n] and time.time() < deadline:
            page.wait_for_timeout(200)
        assert strip_text(page) == completions[n]


def test_quick_clicks_end_on_the_last_row_in_every_view(page):
    """Rows clicked faster than a click's reads take (they run on a thread before the views redraw):
    the strip and the group view end on the last row clicked, and stay there (a later click
    replaces one still reading; none lands after it)."""
    completions = page.locator(".tabulator-row [tabulator-field=completion]").all_inner_texts()
    rows = [0, 9, 17]  # rows of different groups (groups of 8 completions)
    last = next(i for i in range(1, len(completions)) if i not in rows and completions.count(completions[i]) == 1)
    for n in [*rows, last]:
        page.locator(".tabulator-row").nth(n).click()
    deadline = time.time() + 20
    while strip_text(page) != completions[last] and time.time() < deadline:
        page.wait_for_timeout(200)
    assert strip_text(page) == completions[last]
    page.wait_for_timeout(1500)  # an earlier click still in flight would land by now
    assert strip_text(page) == completions[last]
    shown = page.locator(".token-strip .strip").get_attribute("data-rollout")
    page.wait_for_selector(f'.group-card.selected[data-rollout="{shown}"]', timeout=10_000)
    assert page.locator(".group-card.selected").count() == 1


def rewards_shown(page) -> list[float]:
    return [float(x) for x in page.locator(".rollout-table .tabulator-row [tabulator-field=reward]").all_inner_texts()]


def test_the_table_pages_and_sorts_every_row_in_the_store(page):
    """The table holds one page; the store filters, sorts and pages: page 2 holds the next rows,
    a row there opens, and a header sort orders every row, not just the page shown."""
    assert re.search(r"\b512 of 512 rollouts match · rows 1–18 shown", text(page.locator(".table-count")))
    assert page.locator(".tabulator-row").count() == 18
    first = page.locator(".tabulator-row [tabulator-field=completion]").all_inner_texts()
    page.locator(".page-older button").click()
    wait_text(page, page.locator(".table-count"), "rows 19–36 shown")
    second = page.locator(".tabulator-row [tabulator-field=completion]").all_inner_texts()
    assert len(second) == 18 and second != first
    open_row(page, 4)
    deadline = time.time() + 20
    while strip_text(page) != second[4] and time.time() < deadline:
        page.wait_for_timeout(200)
    assert strip_text(page) == second[4]
    prompt = page.locator(".tabulator-row [tabulator-field=prompt]").nth(4).inner_text()
    picker = page.locator(".group-picker select")
    expect(picker.locator("option:checked")).to_contain_text(prompt)  # the picker offers the page's groups
    header = page.locator(".rollout-table .tabulator-col[tabulator-field=reward] .tabulator-col-title")
    header.click()  # ascending, from the first page
    wait_text(page, page.locator(".table-count"), "rows 1–18 shown")
    deadline = time.time() + 20
    while rewards_shown(page) != sorted(rewards_shown(page)) and time.time() < deadline:
        page.wait_for_timeout(200)
    lowest = rewards_shown(page)
    header.click()  # descending: the browser re-orders its page at once, the store's top rows follow
    deadline = time.time() + 20
    while min(rewards_shown(page)) <= max(lowest) and time.time() < deadline:
        page.wait_for_timeout(200)
    top = rewards_shown(page)
    assert top == sorted(top, reverse=True) and min(top) > max(lowest)
    page.locator(".page-older button").click()
    wait_text(page, page.locator(".table-count"), "rows 19–36 shown")
    page.wait_for_timeout(500)
    assert max(rewards_shown(page)) <= min(top)  # sorted in the store: page 2 continues page 1


HEADERS = """() => {
  let out = null;
  const walk = root => {
    for (const el of root.querySelectorAll('*')) {
      if (el.shadowRoot) walk(el.shadowRoot);
      if (el.classList.contains('tabulator') && el.querySelector('.tabulator-col[tabulator-field=completion]')) {
        const hold = el.querySelector('.tabulator-tableholder');
        const cols = [...el.querySelectorAll('.tabulator-col[tabulator-field]')].filter(c => c.offsetParent !== null);
        out = {scroll: hold.scrollWidth - hold.clientWidth,
               titles: cols.map(c => c.querySelector('.tabulator-col-title')).map(t => [t.innerText, t.scrollWidth <= t.clientWidth])};
      }
    }
  };
  walk(document);
  return out;
}"""


@pytest.mark.parametrize("width,height", [(1280, 800), (1440, 900)])
def test_the_table_fits_its_card_with_every_header_whole(browser, server, width, height):
    """What RL needs (reward, advantage, correct, length, fork position) shows without a horizontal
    scroll and with no header cut, the sidebar open or closed."""
    ctx = browser.new_context(viewport={"width": width, "height": height})
    page = ctx.new_page()
    try:
        page.goto(server.url)
        page.wait_for_selector(".tabulator-row", timeout=60_000)
        for sidebar in ("open", "closed"):
            if sidebar == "closed":
                set_sidebar(page, False)  # the sidebar slides away, the table widens
            got = eventually(page, lambda: page.evaluate(HEADERS),
                             lambda got: all(whole for _, whole in got["titles"]) and got["scroll"] <= 0,
                             what=f"the headers with the sidebar {sidebar}")
            assert [t for t, _ in got["titles"]] == ["prompt", "completion", "reward", "adv.", "ok", "len", "fork"]
    finally:
        ctx.close()


def test_an_empty_table_says_so_and_stays_current_as_the_version_changes(page):
    """Issue 32's sequence: a row selected, the table filtered to no rows, the shown reward version
    changed, the filter cleared. No traceback; the table follows each step (no stale count), says
    "no rollouts match" when empty, and selects the shown rollout's row again when it is back."""
    row = page.locator(".rollout-table .tabulator-row").nth(5)
    completion = row.locator("[tabulator-field=completion]").inner_text()
    row.click()
    deadline = time.time() + 20
    while strip_text(page) != completion and time.time() < deadline:
        page.wait_for_timeout(200)
    shown = page.locator(".token-strip .strip").get_attribute("data-rollout")
    assert "rewards from arithmetic@" in text(page.locator(".table-count"))
    assert not page.locator(".train-step").is_visible()  # no rollout here was sampled in training
    box = page.get_by_placeholder("e.g. 48-7")
    box.fill("zz-no-such-prompt")
    box.press("Enter")
    wait_text(page, page.locator(".table-count"), "0 of")
    page.locator(".rollout-table .tabulator-placeholder", has_text="no rollouts match").wait_for(timeout=10_000)
    assert not page.locator(".table-pager").is_visible()  # no "of 1 pages" under an empty table
    version = page.locator(".version-shown select")
    version.select_option(index=1)
    page.wait_for_timeout(1500)
    assert re.search(r"\b0 of [\d,]+ rollouts match$", text(page.locator(".table-count")))
    box.fill("")
    box.press("Enter")
    wait_text(page, page.locator(".table-count"), "rows 1–18 shown")
    page.wait_for_selector(".rollout-table .tabulator-row.tabulator-selected", timeout=10_000)
    selected = page.locator(".rollout-table .tabulator-row.tabulator-selected")
    assert selected.count() == 1 and selected.locator("[tabulator-field=completion]").inner_text() == strip_text(page)
    assert page.locator(".token-strip .strip").get_attribute("data-rollout") == shown


def test_switching_the_channel_recolours_the_strip(page):
    open_row(page, 1)
    before = strip_colours(page)
    assert page.locator(".token-strip .strip").get_attribute("data-channel") == "entropy"
    page.locator(".channel-picker button", has_text="logprob").click()
    page.wait_for_selector('.token-strip .strip[data-channel="logprob"]', timeout=10_000)
    after = strip_colours(page)
    assert len(after) == len(before) and after != before
    page.locator(".channel-picker button", has_text="advantage").click()
    page.wait_for_selector('.token-strip .strip[data-channel="advantage"]', timeout=10_000)
    adv = strip_colours(page)
    assert len(set(adv)) == 1  # a sequence-level advantage colours every token alike
    assert "GRPO (std-normalised)" in text(page.locator(".strip-legend"))


def test_hover_card_shows_value_and_top5_alternatives(page):
    open_row(page, 2)
    tok = page.locator(".token-strip .tok").nth(1)
    card = tok.locator(".card")
    assert not card.is_visible()
    tok.hover()
    card.wait_for(state="visible", timeout=5_000)
    card_text = card.inner_text()
    assert "top-5 alternatives" in card_text and "entropy" in card_text and "log-prob" in card_text
    probs = [float(x) for x in re.findall(r"\b0\.\d{3}\b|\b1\.000\b", card_text)]
    assert card.locator("tr").count() == 6  # header + 5 alternatives
    assert len(probs) >= 5 and all(0 <= p <= 1 for p in probs)
    # alternatives come sorted by probability
    alt = card.locator("tr td:last-child").all_inner_texts()
    vals = [float(v) for v in alt if re.fullmatch(r"[01]\.\d{3}", v)]
    assert vals == sorted(vals, reverse=True)


def test_group_view_shows_every_completion_with_advantages(page):
    open_row(page, 0)
    page.wait_for_selector(".group-card", timeout=20_000)
    cards = page.locator(".group-card")
    assert cards.count() >= 2
    grid = text(page.locator(".group-grid"))
    assert grid.count("reward") == cards.count() and "accuracy" in grid and "adv" in grid


def test_typed_prompt_that_cannot_be_parsed_is_reported(page, server):
    before = text(page.locator(".table-count"))
    start_generate(page, group_size=2, typed="what is two plus two?")
    page.wait_for_selector(".generate-status .banner.error", timeout=20_000)
    assert "cannot read 'what is two plus two?'" in text(page.locator(".generate-status"))
    assert text(page.locator(".table-count")) == before


def test_generate_adds_rows_while_the_page_stays_responsive(page):
    total = rollouts_total(page)
    open_row(page, 0)
    # 96 new prompts x 4: seconds of sampling and writing, even with the worker warm (the page loads
    # the policy as it opens)
    start_generate(page, group_size=4, fresh=96)
    page.locator(".generate-status .banner.info").wait_for(timeout=10_000)
    # while the worker samples, the page still answers: the strip recolours
    page.locator(".channel-picker button", has_text="logprob").click()
    page.wait_for_selector('.token-strip .strip[data-channel="logprob"]', timeout=10_000)
    assert "done:" not in text(page.locator(".generate-status"))  # it was still running
    page.locator(".generate-status .banner", has_text="done:").wait_for(timeout=180_000)
    assert "done: 384 rollouts stored" in text(page.locator(".generate-status"))
    wait_text(page, page.locator(".table-count"), f"of {total + 384:,} rollouts")
    # the group view switches to the first new group (4 completions) from the 8-card one
    expect(page.locator(".group-card")).to_have_count(4, timeout=20_000)


NASTY = ["<script>window.__pwned=1</script>", "<img src=x onerror=window.__pwned=2>", "**bold** [x](javascript:1)"]


@pytest.fixture(scope="module")
def hostile_server(tmp_path_factory):
    """A store holding completions that try to inject HTML/JS."""
    from backends import Generation
    from sample_data import ROLLOUTS_DIR
    from studio.rewards import ARITHMETIC_V1
    from studio.runs.generation import ingest
    from studio.store import Store
    from studio.tasks import get_task

    db = tmp_path_factory.mktemp("xss") / "xss.duckdb"
    store = Store.open(db, seed_dir=ROLLOUTS_DIR)
    task = get_task("arithmetic")
    prompt = task.parse_prompt("Q: 1+1=")
    gens = []
    for i, nasty in enumerate(NASTY):
        pieces = [nasty[j:j + 5] for j in range(0, len(nasty), 5)]
        T = len(pieces)
        gens.append(Generation(0, i, prompt.text, nasty, np.arange(T), pieces, np.full(T, -0.5, np.float32),
                               np.full(T, 0.3, np.float32), np.zeros((T, 5), np.int64) + 7,
                               np.full((T, 5), -1.0, np.float32), "stop"))
    run = start_run(store, "import", "hostile <b>run</b>", "sample", "arithmetic", {})
    ingest(store, run, task, [prompt], gens, ARITHMETIC_V1, None)
    store.close()
    s = Server(db)
    yield s
    s.stop()


@pytest.fixture()
def hostile_page(browser, hostile_server):
    with studio_page(browser, hostile_server) as pg:
        yield pg


def test_completions_render_as_text_never_as_html(hostile_page):
    pg = hostile_page
    seen = set()
    for n in range(pg.locator(".tabulator-row").count()):
        row = pg.locator(".tabulator-row").nth(n)
        shown = row.locator("[tabulator-field=completion]").inner_text()
        if shown not in NASTY:
            continue
        row.click()
        deadline = time.time() + 20
        while strip_text(pg) != shown and time.time() < deadline:
            pg.wait_for_timeout(200)
        assert strip_text(pg) == shown  # the strip shows the characters, literally
        seen.add(shown)
    assert seen == set(NASTY)  # each hostile completion was listed verbatim in the table and opened
    assert pg.evaluate("() => window.__pwned") is None
    assert pg.locator("img[src=x]").count() == 0


def test_generate_on_fresh_prompts_from_the_task_generator(page):
    total = rollouts_total(page)
    start_generate(page, group_size=2, fresh=2)
    page.locator(".generate-status .banner", has_text="done:").wait_for(timeout=120_000)
    assert "done: 4 rollouts stored" in text(page.locator(".generate-status"))
    wait_text(page, page.locator(".table-count"), f"of {total + 4:,} rollouts")
