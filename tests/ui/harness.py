"""What browser tests and benchmarks share: Debian's Chromium as they launch it (never
downloaded), a free loopback port, and the reading of a studio server's log."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from sample_data import ROLLOUTS_DIR
from studio.store import Store

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# what a browser leaving causes in Tornado/Bokeh: a write to a closed websocket, and Bokeh
# receiving a last event from a connection whose session it already detached
BENIGN = ("WebSocketClosedError", "StreamClosedError", "assert self._session is not None")


def server_tracebacks(log: str) -> list[str]:
    """The tracebacks in a studio server's log, except the benign ones above."""
    blocks = re.split(r"(?=Traceback \(most recent call last\))", log)[1:]
    return [b for b in blocks if not any(x in b for x in BENIGN)]


def stop_server(proc: subprocess.Popen) -> None:
    """Stop a server started in its own process group (Bokeh/Tornado and its worker)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


ROOT = Path(__file__).resolve().parents[2]


class Server:
    """``launch.py`` on ``db``. A store not made yet is seeded with the arithmetic world alone (``seed``), the one
    these tests walk; the served default seeds both worlds (tests/test_api.py, tests/test_cli.py check that)."""

    def __init__(self, db: Path, extra: list[str] | None = None, seed: Path | None = ROLLOUTS_DIR):
        if seed is not None and not db.exists():
            Store.open(db, seed_dir=seed).close()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log = db.with_suffix(".log")
        cmd = [sys.executable, str(ROOT / "launch.py"), "--db", str(db), "--no-show", "--port", str(self.port), *(extra or [])]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=open(self.log, "w"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.time() + 90
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"studio exited early:\n{self.log.read_text()}")
            try:
                urllib.request.urlopen(self.url, timeout=30)  # a first page takes seconds on 2 busy cores
                return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"studio did not answer in 90 s:\n{self.log.read_text()}")

    def output(self, since: int = 0) -> str:
        return self.log.read_text()[since:]

    def tracebacks(self, since: int = 0) -> list[str]:
        """Server tracebacks since offset ``since`` of the log (benign ones left out)."""
        return server_tracebacks(self.output(since))

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


@contextmanager
def studio_page(browser, server: Server):
    """A fresh page on ``server``; fails on any page error, failed request or server traceback."""
    ctx = browser.new_context(viewport={"width": 1600, "height": 1000})
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    pg.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
    since = len(server.output())
    pg.goto(server.url)
    pg.wait_for_selector(".tabulator-row", timeout=60_000)
    yield pg
    ctx.close()
    assert not errors, errors
    assert not server.tracebacks(since), server.tracebacks(since)


DEEP_TEXT = """el => {
  const walk = n => {
    let t = n.shadowRoot ? walk(n.shadowRoot) : "";
    for (const c of n.childNodes) t += c.nodeType === 3 ? c.textContent : walk(c);
    return t;
  };
  return walk(el);
}"""


def text(locator) -> str:
    """Text of an element including its shadow roots (Panel renders into shadow DOM)."""
    return locator.first.evaluate(DEEP_TEXT)


def wait_text(page, locator, needle: str, timeout_s: float = 20) -> str:
    """Poll the shadow-DOM text of ``locator`` until it contains ``needle``."""
    deadline = time.time() + timeout_s
    while True:
        got = text(locator)
        if needle in got or time.time() > deadline:
            assert needle in got, f"{needle!r} not in {got!r}"
            return got
        page.wait_for_timeout(200)


def eventually(page, read, ok, timeout_s: float = 20, what: str = "the page"):
    """Poll ``read()`` until ``ok(value)`` holds; return that value. For page state that a callback
    updates in several messages, after the one a test waited for."""
    deadline = time.time() + timeout_s
    while True:
        got = read()
        if ok(got) or time.time() > deadline:
            assert ok(got), f"{what} stayed {got!r}"
            return got
        page.wait_for_timeout(200)


def open_row(page, n: int) -> None:
    """Open the table's ``n``-th row and wait until the strip shows that rollout (not the one shown
    before the click: a card hovered on the old strip is redrawn away)."""
    row = page.locator(".rollout-table .tabulator-row").nth(n)
    completion = row.locator("[tabulator-field=completion]").inner_text()
    row.click()
    page.wait_for_selector(".token-strip .tok", timeout=20_000)
    wait_strip(page, completion)


def rollouts_total(page) -> int:
    return int(re.search(r"of ([\d,]+) rollouts", text(page.locator(".table-count"))).group(1).replace(",", ""))


def start_generate(page, group_size: int, typed: str | None = None, fresh: int | None = None) -> None:
    """Fill the Generate form as a person does (typing, then leaving each field) and press it."""
    fields = [(".typed-prompts textarea", typed), (".fresh-prompts input", fresh), (".group-size input", group_size)]
    for selector, value in fields:
        if value is not None:
            page.locator(selector).fill(str(value))
            page.locator(selector).press("Tab")
    page.locator(".generate-button button").click()


def open_sampled_row(page, nth: int) -> tuple[str, list[tuple[int, str, str]]]:
    """Open the ``nth`` sampled (non-branch) rollout of the table's first page; return its
    completion and its tokens once the strip shows it."""
    rows = page.locator(".rollout-table .tabulator-row")
    fork_cells = rows.locator("[tabulator-field=fork_pos]").all_inner_texts()
    sampled = [i for i, f in enumerate(fork_cells) if not f.strip()]
    row = rows.nth(sampled[nth])
    completion = row.locator("[tabulator-field=completion]").inner_text()
    row.click()
    return completion, wait_strip(page, completion)


def strip_tokens(page) -> list[tuple[int, str, str]]:
    """(pos, text as stored, class) of every token in the strip."""
    rows = page.locator(".token-strip .tok").evaluate_all(
        "els => els.map(e => [+e.dataset.pos, e.firstChild.textContent, e.className])")
    return [(pos, STRIP_SPECIAL.get(shown, shown), cls) for pos, shown, cls in rows]


def completion_text(tokens: list[tuple[int, str, str]]) -> str:
    """What the table and the tree show for a rollout: its tokens, ``<eos>``-like specials left out."""
    return "".join(t for _, t, cls in tokens if not (t.startswith("<") and t.endswith(">") and len(t) > 2))


def wait_strip(page, expected: str, timeout_s: float = 20) -> list[tuple[int, str, str]]:
    """Poll until the strip shows the completion ``expected``; return its tokens."""
    deadline = time.time() + timeout_s
    while True:
        toks = strip_tokens(page)
        if completion_text(toks) == expected or time.time() > deadline:
            assert completion_text(toks) == expected
            return toks
        page.wait_for_timeout(200)


STRIP_SPECIAL = {"↵": "\n", "⇥": "\t"}  # the strip shows these two tokens as marks


def strip_text(page) -> str:
    toks = page.locator(".token-strip .tok").evaluate_all("els => els.map(e => e.firstChild.textContent)")
    return "".join(t for t in toks if t != "<eos>")


TAB_MARKERS = {  # each lower tab, and an element only its view draws
    "Group view": ".group-grid", "Entropy landscape": ".landscape-summary", "Compare policies": ".compare-button",
    "Mismatch": ".mismatch-summary",
    "Reward rules": ".rule-editor", "Reward hacking": ".length-corr", "Advantages & steps": ".ig-button",
    "Mini-runs": ".start-run", "Preference data": ".build-pairs", "Timeline & diff": ".timeline-prompt",
    "Import & enrich": ".import-source", "SQL": ".sql-run",
}


def open_tab(page, title: str, wait: bool = True) -> None:
    """Open the lower tab ``title`` as a person does (a click on its header); with ``wait``, until its
    view's marker (:data:`TAB_MARKERS`) is visible."""
    page.locator(".lower-tabs .bk-tab", has_text=title).click()
    if wait and title in TAB_MARKERS:
        page.locator(TAB_MARKERS[title]).first.wait_for(state="visible", timeout=30_000)


def set_sidebar(page, open: bool) -> None:
    """Open or close the page's sidebar with the header's toggle, as a person does."""
    toggle = page.locator("#sidebar-toggle")
    if (toggle.get_attribute("aria-expanded") == "true") != open:
        toggle.click()
        # Bootstrap slides it (class "collapsing" meanwhile); then the page lays out again, in the next frames
        page.wait_for_function("o => { const c = document.getElementById('sidebar').classList;"
                               " return !c.contains('collapsing') && c.contains('show') === o; }", arg=open)
        page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")


def unfold(page, group: str) -> None:
    """Open the sidebar's folded group ``group`` (``"credit-card"``, ``"fork-card"``) with a click on its header."""
    card = page.locator(f".{group}").first
    if card.bounding_box()["height"] < 60:  # folded: its header alone
        card.locator(".card-header").first.click()
        page.wait_for_function("el => el.getBoundingClientRect().height >= 60", arg=card.element_handle())
