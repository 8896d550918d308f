"""Static HTML export opened from file:// in Chromium: tokens and hover cards with no server,
and a completion that carries HTML shows as text and runs nothing."""
from __future__ import annotations

import json
import time

import pytest

import studio
from sample_data import ROLLOUTS_DIR
from studio.store import Store

pytestmark = pytest.mark.ui

HOSTILE = '<script>window.__p=1</script><img src=x onerror="window.__p=2">**b**'  # fits the sample policy's 96 positions


@pytest.fixture()
def s(tmp_path):
    Store.open(tmp_path / "s.duckdb", seed_dir=ROLLOUTS_DIR).close()
    with studio.open(tmp_path / "s.duckdb") as st:
        yield st


def open_file(browser, path):
    ctx = browser.new_context(viewport={"width": 1300, "height": 900})
    pg = ctx.new_page()
    requests, dialogs = [], []
    pg.on("request", lambda r: requests.append(r.url))
    pg.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    pg.goto(path.as_uri())
    return ctx, pg, requests, dialogs


def test_rollout_page_shows_tokens_and_hover_cards_offline(browser, s, tmp_path):
    rid = s.rollouts(correct=False, limit=1).rollout_id.iloc[0]
    toks = s.tokens(rid)
    page = s.save_html(tmp_path / "rollout.html", rollout=rid)
    ctx, pg, requests, _ = open_file(browser, page)
    try:
        shown = pg.locator(".strip .tok")
        assert shown.count() == len(toks)
        assert pg.locator(".tok .card").first.is_hidden()
        i = int(toks.entropy.idxmax())
        shown.nth(i).hover()
        card = pg.locator(".tok:hover .card")
        assert card.is_visible()
        text = card.inner_text()
        assert f"pos {i}" in text and "entropy" in text and "top-5 alternatives" in text
        assert f"{toks.entropy[i]:.3f}" in text
        assert requests == [page.as_uri()]  # the page alone: nothing else loaded
    finally:
        ctx.close()


def test_group_and_fork_tree_pages(browser, s, tmp_path):
    ro = s.rollout(s.rollouts(limit=1).rollout_id.iloc[0])
    page = s.save_html(tmp_path / "group.html", group=ro["group_id"], channel="logprob")
    ctx, pg, requests, _ = open_file(browser, page)
    try:
        assert pg.locator("section.box").count() == 1 + 8  # the summary, then each completion
        assert pg.locator(".strip[data-channel='logprob']").count() == 8
        pg.locator(".tok").nth(40).hover()
        assert pg.locator(".tok:hover .card").is_visible()
        assert requests == [page.as_uri()]
    finally:
        ctx.close()
    tree = s.save_html(tmp_path / "tree.html", fork_tree=ro["rollout_id"])
    ctx, pg, requests, _ = open_file(browser, tree)
    try:
        assert pg.locator("text=Rollout tree").count() == 1 and pg.locator(".crumbs").count() == 1
        assert requests == [tree.as_uri()]
    finally:
        ctx.close()


def test_hostile_completion_is_shown_as_text(browser, s, tmp_path):
    (tmp_path / "0.jsonl").write_text(json.dumps({"input": "Q: 1+1=", "output": HOSTILE, "gts": "2", "score": 0.0,
                                                  "step": 0}) + "\n")
    rep = s.import_run(tmp_path / "0.jsonl", "verl")
    rid = s.rollouts(run=rep.run_id).rollout_id.iloc[0]
    s.enrich(run=rep.run_id)  # the sample policy tokenizes it: the strip is made of its tokens
    page = s.save_html(tmp_path / "hostile.html", rollout=rid)
    assert "<script>" not in page.read_text() and "<img" not in page.read_text()
    ctx, pg, requests, dialogs = open_file(browser, page)
    try:
        strip_text = "".join(pg.locator(".strip .tok").evaluate_all("els => els.map(e => e.firstChild.textContent)"))
        assert "<script>window.__p=1</script>" in strip_text and 'onerror="window.__p=2"' in strip_text
        assert pg.evaluate("window.__p === undefined") and not dialogs
        assert pg.locator(".strip img, .strip script").count() == 0
        assert requests == [page.as_uri()]  # the <img src=x> was never requested
    finally:
        ctx.close()


def test_fork_tree_page_offers_nothing_only_the_server_can_do(s, tmp_path):
    rid = s.rollouts(limit=1).rollout_id.iloc[0]
    html = s.save_html(tmp_path / "t.html", fork_tree=rid).read_text()
    assert "show all in table" not in html and "branch it again" not in html and "click any token" not in html


def test_save_as_html_from_the_served_studio(browser, server, tmp_path):
    """The token strip card's *Save as HTML* downloads the shown rollout, its group or its tree."""
    from .harness import studio_page

    with studio_page(browser, server) as pg:
        pg.wait_for_selector(".token-strip .strip[data-rollout]", timeout=30_000)  # the page opens on a rollout
        assert pg.locator(".save-rollout button").is_enabled()
        first = pg.locator(".token-strip .strip").first.get_attribute("data-rollout")
        rows = pg.locator(".tabulator-row")
        rows.nth(1 if "tabulator-selected" in rows.nth(0).get_attribute("class") else 0).click()  # another row
        strip = pg.locator(".token-strip .strip[data-rollout]").first
        deadline = time.time() + 30
        while strip.get_attribute("data-rollout") == first and time.time() < deadline:
            pg.wait_for_timeout(200)
        assert strip.get_attribute("data-rollout") != first  # the clicked rollout is shown
        shown = len(pg.locator(".token-strip .strip .tok").all())
        got = {}
        for kind in ("rollout", "group", "fork-tree"):
            with pg.expect_download(timeout=60_000) as d:
                pg.locator(f".save-{kind} button").click()
            got[kind] = open(d.value.path(), encoding="utf-8").read()
            assert d.value.suggested_filename.startswith(kind) and d.value.suggested_filename.endswith(".html")
        assert got["rollout"].count('class="card"') == shown
        assert got["group"].count('<section class="box">') == 1 + 8
        assert "Rollout tree" in got["fork-tree"]
