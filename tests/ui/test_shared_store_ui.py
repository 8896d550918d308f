"""The served studio on a shared store, in real Chromium: ``launch.py --db FOLDER`` (a SQLite
catalog) and ``launch.py --db postgresql://…`` (a real PostgreSQL server) serve it, the header
names it, rollouts that another OS process writes into the store while the server holds it open
arrive in the open page without a reload (header, table, token strip), the page's own Generate
still stores its rows beside them, and the page fits both laptop sizes."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from playwright.sync_api import expect

from sample_data import ROLLOUTS_DIR
from studio.store import Store, lake

from .harness import ROOT, Server, eventually, open_sampled_row, start_generate, studio_page, text
from .test_import import verl_dump
from .test_layout import OVERFLOW, SIZES

pytestmark = pytest.mark.ui

ARRIVAL_S = 60  # the pages poll every 2 s; a busy 2-core machine draws the refreshed page in seconds


def cli(*args: str) -> None:
    """``rollout-studio ARGS`` in its own OS process (as a user's terminal beside the server runs it)."""
    r = subprocess.run([sys.executable, "-m", "studio.face.cli", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def header_count(page) -> int:
    """The rollout count the sidebar's header line shows ("shared store NAME · N rollouts")."""
    return int(re.search(r"([\d,]+) rollouts", text(page.locator(".store-info"))).group(1).replace(",", ""))


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """``launch.py`` serving a shared store (a SQLite catalog in its folder) seeded with the arithmetic world."""
    folder = tmp_path_factory.mktemp("lake") / "team-runs"
    lake.create_shared(folder)
    Store.open(folder, seed_dir=ROLLOUTS_DIR).close()
    server = Server(folder, seed=None)
    yield server, folder
    server.stop()


def test_another_process_rows_arrive_in_the_open_page(browser, shared):
    server, folder = shared
    with studio_page(browser, server) as page:
        header = page.locator(".store-info .meta-line")
        expect(header).to_contain_text("shared store team-runs")
        before = header_count(page)

        # a second OS process samples a group into the same store while the server keeps it open
        cli("generate", "--db", str(folder), "--prompt", "Q: 91+8-13=", "--group-size", "4", "--name", "beside")
        expect(header).to_contain_text(f"{before + 4:,} rollouts", timeout=ARRIVAL_S * 1000)
        expect(page.locator(".table-count")).to_contain_text(f"of {before + 4:,} rollouts", timeout=ARRIVAL_S * 1000)
        rows = page.locator(".rollout-table .tabulator-row")
        expect(rows.first.locator("[tabulator-field=prompt]")).to_have_text("Q: 91+8-13=",
                                                                            timeout=ARRIVAL_S * 1000)
        expect(page.locator(".table-filters select option", has_text="beside")).to_have_count(1)  # the run picker
        # its tokens (the other process's Parquet files) open in the strip, as the table shows them
        completion, tokens = open_sampled_row(page, 0)
        assert tokens and completion

        # the server's own write beside the other process's: the page's Generate stores its rows
        start_generate(page, group_size=2, typed="Q: 5+6=")
        page.locator(".generate-status .banner", has_text="done:").wait_for(timeout=180_000)
        assert "done: 2 rollouts stored" in text(page.locator(".generate-status"))
        expect(header).to_contain_text(f"{before + 6:,} rollouts", timeout=ARRIVAL_S * 1000)
        expect(rows.first.locator("[tabulator-field=prompt]")).to_have_text("Q: 5+6=", timeout=ARRIVAL_S * 1000)
        completion, tokens = open_sampled_row(page, 0)
        assert tokens and completion


def test_rows_from_elsewhere_wait_behind_a_button_while_a_person_clicks_through_the_page(browser, shared):
    """Rows another process writes do not move the rows a person is clicking through (a row moved under
    the pointer opens another rollout than the one aimed at): the counts grow, a button shows them."""
    server, folder = shared
    with studio_page(browser, server) as page:
        rows = page.locator(".rollout-table .tabulator-row")
        count = page.locator(".table-count")
        before = header_count(page)
        first = rows.first.locator("[tabulator-field=completion]").inner_text()
        writer = subprocess.Popen([sys.executable, "-m", "studio.face.cli", "generate", "--db", str(folder),
                                   "--prompt", "Q: 7+70-3=", "--group-size", "3", "--name", "held"],
                                  cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            clicks = 0
            while f"of {before + 3:,} rollouts" not in text(count):  # a person clicking rows meanwhile
                assert clicks < ARRIVAL_S * 3 and (writer.poll() in (None, 0)), writer.stdout.read()
                completion, _ = open_sampled_row(page, 1 + clicks % 2)
                clicks += 1
                page.wait_for_timeout(500)
            assert writer.wait(timeout=120) == 0
        finally:
            writer.kill()
        button = page.locator(".show-new-rows button")
        expect(button).to_have_text("3 new rollouts · show")
        assert rows.first.locator("[tabulator-field=completion]").inner_text() == first  # nothing moved
        selected = page.locator(".rollout-table .tabulator-row.tabulator-selected [tabulator-field=completion]")
        assert selected.inner_text() == completion
        if os.environ.get("STUDIO_SHOTS"):
            page.screenshot(path=os.path.join(os.environ["STUDIO_SHOTS"], "rows-held.png"))
        button.click()
        expect(rows.first.locator("[tabulator-field=prompt]")).to_have_text("Q: 7+70-3=", timeout=30_000)
        expect(button).to_be_hidden()
        assert f"of {before + 3:,} rollouts" in text(count)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_shared_store_page_fits(browser, shared, size):
    server, _ = shared
    with studio_page(browser, server) as page:
        page.set_viewport_size({"width": size[0], "height": size[1]})
        page.wait_for_selector(".token-strip .tok", timeout=30_000)
        line = page.locator(".store-info .meta-line span").first
        expect(line).to_contain_text("shared store team-runs")
        # the header's line is whole: not cut by its box
        # (laid out again in the frames after the resize)
        eventually(page, lambda: line.evaluate("el => el.scrollWidth <= el.clientWidth + 1 && "
                                               "el.scrollHeight <= el.clientHeight + 1"), bool, what="the store line cut")
        eventually(page, lambda: page.evaluate(OVERFLOW), lambda got: got == [], what="the overflowing elements")
        if os.environ.get("STUDIO_SHOTS"):
            page.screenshot(path=os.path.join(os.environ["STUDIO_SHOTS"], f"shared-store-{size[0]}.png"))


def test_a_team_catalog_url_is_served(browser, postgres, tmp_path, monkeypatch):
    """``--db postgresql://user@host:port/db``: the URL is a store, not a path; the password comes from
    PGPASSWORD (never the URL); rows a CLI import writes through the same URL arrive in the page."""
    pg = postgres.new_database("served_team")
    monkeypatch.setenv("PGPASSWORD", pg.password)  # the server and the CLI below inherit it, as a user's shell
    folder = tmp_path / "team"
    lake.create_shared(folder, catalog=pg.url)  # the data files in the folder; their path is kept in the catalog
    Store.open(folder, seed_dir=ROLLOUTS_DIR).close()
    # the harness serves --db FOLDER; the later --db (the URL) is the one launch.py opens
    server = Server(folder, extra=["--db", pg.url], seed=None)
    try:
        assert f"shared store {pg.url}" in server.output() and pg.password not in server.output()
        with studio_page(browser, server) as page:
            header = page.locator(".store-info .meta-line")
            expect(header).to_contain_text("shared store served_team")
            if os.environ.get("STUDIO_SHOTS"):
                page.locator(".store-info").screenshot(path=os.path.join(os.environ["STUDIO_SHOTS"], "team-header.png"))
            before = header_count(page)
            run_dir = tmp_path / "verl-run"
            run_dir.mkdir()
            verl_dump(run_dir, 1, 6)
            cli("import", "--db", pg.url, "--name", "imported-beside", str(run_dir))
            expect(header).to_contain_text(f"{before + 6:,} rollouts", timeout=ARRIVAL_S * 1000)
            expect(page.locator(".table-count")).to_contain_text(f"of {before + 6:,} rollouts",
                                                                 timeout=ARRIVAL_S * 1000)
            # a seeded rollout's tokens still open (the catalog's data path, read through the URL)
            completion, tokens = open_sampled_row(page, 6)
            assert tokens and completion
        assert (folder / "data").is_dir() and not (ROOT / "postgresql:").exists()
    finally:
        server.stop()
