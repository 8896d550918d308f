"""Make ``docs/studio.png``, the README's picture, from the real app.

Serves ``launch.py`` on a fresh temporary store (seeded with both sample worlds, as a first launch
seeds it) and opens it in Debian's Chromium at 1440x900. With a rollout in the token strip (the one
the page opens on, else a word problem's), once the worker has loaded the policy, it clicks the
strip's most uncertain forking token (the fork panel lists the alternatives) and hovers it (the
token's card), then writes the first screen as the PNG. Run it again whenever the page changes::

    python docs/screenshot.py            # writes docs/studio.png
    python docs/screenshot.py --out x.png
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere: tests.ui.harness is the project's

from tests.ui.harness import CHROMIUM, FLAGS, Server, text  # noqa: E402

VIEWPORT = {"width": 1440, "height": 900}


def open_a_rollout(page) -> None:
    """Select a rollout as a person would: a word problem's (the richer strip) when the page shows one."""
    rows = page.locator(".rollout-table .tabulator-row")
    prompts = rows.locator("[tabulator-field=prompt]").all_inner_texts()
    pick = next((i for i, p in enumerate(prompts) if not p.lstrip().startswith("Q:")), 0)
    rows.nth(pick).click()
    page.wait_for_selector(".token-strip .tok", timeout=30_000)


def show_a_fork(page) -> None:
    """Click the strip's most uncertain forking token (the fork panel fills in) and leave the mouse on it (its
    card: the alternatives the policy weighed there)."""
    forks = page.locator(".token-strip").first.locator(".tok.fork")
    values = forks.evaluate_all("els => els.map(e => parseFloat(e.dataset.channelValue) || 0)")  # entropy (nats)
    if not values:
        return
    fork = forks.nth(max(range(len(values)), key=values.__getitem__))
    fork.scroll_into_view_if_needed()
    fork.click()
    page.wait_for_timeout(1500)  # the fork panel's alternatives come back from the server
    fork.hover()
    page.wait_for_timeout(300)


def wait_for_the_policy(page, timeout_ms: int = 30_000) -> None:
    """Give the worker time to load the policy, so Generate's line names its device rather than "loading…"."""
    card = page.locator(".generate-card")
    for _ in range(timeout_ms // 500):
        if card.count() == 0 or "loading" not in text(card):
            return
        page.wait_for_timeout(500)


def screenshot(out: Path) -> None:
    """Serve the studio on a fresh store and write its first screen to ``out``."""
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        server = Server(Path(tmp) / "studio.duckdb", seed=None)  # launch.py seeds both sample worlds
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
                page = browser.new_page(viewport=VIEWPORT)
                page.goto(server.url)
                page.wait_for_selector(".rollout-table .tabulator-row", timeout=90_000)
                if page.locator(".token-strip .tok").count() == 0:
                    open_a_rollout(page)
                wait_for_the_policy(page)
                show_a_fork(page)
                out.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(out))
                browser.close()
        finally:
            server.stop()
    print(f"wrote {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "studio.png", help="the PNG to write")
    screenshot(parser.parse_args().out)
