"""Opening the lower tabs one after another: seconds from a tab's click until its view is drawn.

Run: ``python benchmarks/bench_tabs.py`` (about 3 minutes on a 2-core CPU).

The served studio (``launch.py`` on a fresh temporary store seeded with both sample worlds, as
the served default is) in headless Chromium at 1440x900, sidebar open. On one page, every lower
tab after the first (the *Group view*, open when the page loads) is opened in their order; each
of those tabs is also opened as the first tab of a fresh page: that is its baseline.

A tab's time runs from the click on its header (``tests.ui.harness.open_tab``) until its view is
*drawn*: its marker element (``tests.ui.harness.TAB_MARKERS``, an element only that view draws)
is visible, and the page has settled: no websocket message for ``QUIET_MS``, no long task of the
main thread for as long, every Bokeh view of an element on the page finished. The time drawn is the latest of: the marker
seen visible, the animation frame after the last websocket message, the end of the last long task
(what Chromium's ``longtask`` performance entries report: a browser busy laying out a growing
document shows there). Each time is the median over ``--reps`` repetitions.

Two figures:

``tab_open_s_max``
    The slowest tab opened in sequence on one page; baseline: the same tab opened first on a
    fresh page. Target: under 2 s.
``tab_open_growth``
    The last tab opened in sequence against the same tab opened first on a fresh page (the last
    as fast as the first). Target: at most 1.5.

Printed for people, per tab: both times, their ratio, and the page's size after the tab opened
(elements, counted through the shadow roots Panel renders into, and Bokeh views): the size a
growing document would show; and the time to go back to the first tab at the end.

Options: --reps, --tabs (how many tabs after the first; default all), --width/--height,
--sidebar closed, --smoke (one repetition of the first two tabs).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: import the project's packages

from benchmarks import smoke  # noqa: E402
from tests.ui.harness import CHROMIUM, FLAGS, TAB_MARKERS, Server, open_tab, set_sidebar  # noqa: E402

TARGET_S = 2.0
TARGET_GROWTH = 1.5
QUIET_MS = 800  # settled: this long without a websocket message or a long task
TIMEOUT_S = 90.0

# Installed before the page's own scripts: when the last websocket message was handled (the animation
# frame after it) and when the last long task of the main thread ended.
PROBE = """
window.__tabs = {ws: 0, long: 0};
new PerformanceObserver(list => {
  for (const e of list.getEntries()) window.__tabs.long = Math.max(window.__tabs.long, e.startTime + e.duration);
}).observe({type: "longtask", buffered: true});
const NativeWebSocket = window.WebSocket;
window.WebSocket = class extends NativeWebSocket {
  constructor(...args) {
    super(...args);
    this.addEventListener("message", () => requestAnimationFrame(() => { window.__tabs.ws = performance.now(); }));
  }
};
"""

STATE = """() => {
  let finished = true;
  if (window.Bokeh && Bokeh.index) {
    for (const v of Bokeh.index.all_views()) {  // views of the page's elements (tools and data views never finish)
      if (v.el instanceof Element && v.el.isConnected && !v.has_finished()) { finished = false; break; }
    }
  }
  return {now: performance.now(), ws: window.__tabs.ws, long: window.__tabs.long, finished};
}"""

SIZE = """() => {
  const count = root => {
    let n = 0;
    for (const el of root.querySelectorAll("*")) { n += 1; if (el.shadowRoot) n += count(el.shadowRoot); }
    return n;
  };
  return {elements: count(document), views: window.Bokeh ? [...Bokeh.index.all_views()].length : 0};
}"""


def settle(page, since: float) -> float:
    """Wait until the page has settled; the page time (ms) its last work after ``since`` ended."""
    deadline = time.time() + TIMEOUT_S
    while True:
        s = page.evaluate(STATE)
        last = max(since, s["ws"], s["long"])
        if s["finished"] and s["now"] - last >= QUIET_MS:
            return last
        if time.time() > deadline:
            raise RuntimeError(f"the page did not settle within {TIMEOUT_S:.0f} s: {s}")
        page.wait_for_timeout(100)


def open_timed(page, title: str) -> float:
    """Open tab ``title`` and return the seconds until its view is drawn."""
    t0 = page.evaluate("performance.now()")
    open_tab(page, title, wait=False)
    page.locator(TAB_MARKERS[title]).first.wait_for(state="visible", timeout=TIMEOUT_S * 1000)
    seen = page.evaluate("performance.now()")
    return (settle(page, seen) - t0) / 1000


def new_page(browser, url: str, size: tuple[int, int], sidebar: str):
    """A fresh page on the studio, loaded and settled."""
    ctx = browser.new_context(viewport={"width": size[0], "height": size[1]})
    ctx.add_init_script(PROBE)
    page = ctx.new_page()
    page.goto(url)
    page.wait_for_selector(".tabulator-row", timeout=TIMEOUT_S * 1000)
    set_sidebar(page, open=sidebar == "open")
    settle(page, 0.0)
    return ctx, page


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2, help="repetitions of the whole run (medians reported)")
    ap.add_argument("--tabs", type=int, default=None, help="how many tabs to open after the first (default: all)")
    ap.add_argument("--width", type=int, default=1440)
    ap.add_argument("--height", type=int, default=900)
    ap.add_argument("--sidebar", choices=["open", "closed"], default="open")
    args = smoke.parse_args(ap, reps=1, tabs=2)

    from playwright.sync_api import sync_playwright

    from studio.face.tabs import TABS

    titles = [t.title for t in TABS[1:]][:args.tabs]
    size = (args.width, args.height)
    seq: dict[str, list[float]] = {t: [] for t in titles}
    fresh: dict[str, list[float]] = {t: [] for t in titles}
    sizes: dict[str, dict] = {}
    first, back = TABS[0].title, []  # the tab open when the page loads, opened again at the end
    with tempfile.TemporaryDirectory(prefix="bench-tabs-") as tmp, sync_playwright() as p:
        server = Server(Path(tmp) / "studio.duckdb", seed=None)  # launch.py seeds both worlds, as served
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            for rep in range(args.reps):
                ctx, page = new_page(browser, server.url, size, args.sidebar)
                sizes["(page loaded)"] = page.evaluate(SIZE)
                for title in titles:
                    seq[title].append(open_timed(page, title))
                    sizes[title] = page.evaluate(SIZE)
                    print(f"rep {rep + 1} one page: {title:<20} {seq[title][-1]:6.2f} s   "
                          f"{sizes[title]['elements']:6d} elements {sizes[title]['views']:5d} views", flush=True)
                back.append(open_timed(page, first))
                print(f"rep {rep + 1} one page: back to {first}: {back[-1]:.2f} s", flush=True)
                ctx.close()
                for title in titles:
                    ctx, page = new_page(browser, server.url, size, args.sidebar)
                    fresh[title].append(open_timed(page, title))
                    ctx.close()
                    print(f"rep {rep + 1} fresh page: {title:<20} {fresh[title][-1]:6.2f} s", flush=True)
            if server.tracebacks():
                raise RuntimeError(f"the server logged tracebacks:\n{server.tracebacks()[0]}")
        finally:
            browser.close()
            server.stop()

    s = {t: statistics.median(v) for t, v in seq.items()}
    f = {t: statistics.median(v) for t, v in fresh.items()}
    print()
    print(f"{'tab (in the order opened)':<26}{'one page':>10}{'fresh page':>12}{'ratio':>8}")
    for t in titles:
        print(f"{t:<26}{s[t]:>9.2f}s{f[t]:>11.2f}s{s[t] / f[t]:>8.2f}")
    print(f"{'back to ' + first:<26}{statistics.median(back):>9.2f}s  (its view sent again)")
    slowest, last = max(titles, key=s.get), titles[-1]
    growth = s[last] / f[last]
    print(f"slowest on one page: {slowest}, {s[slowest]:.2f} s (target < {TARGET_S:.0f} s: "
          f"{'met' if s[slowest] < TARGET_S else 'NOT met'}); last opened / opened first: {growth:.2f} "
          f"(target <= {TARGET_GROWTH}: {'met' if growth <= TARGET_GROWTH else 'NOT met'})")
    print()
    print(json.dumps({"figure": "tab_open_s_max", "value": round(s[slowest], 3), "unit": "s",
                      "baseline": f"same_tab_fresh_page_s ({slowest})", "baseline_value": round(f[slowest], 3),
                      "ratio": round(s[slowest] / f[slowest], 3)}))
    print(json.dumps({"figure": "tab_open_growth", "value": round(growth, 3), "unit": "ratio",
                      "baseline": f"target_growth ({last}: last opened on one page / opened first on a fresh page)",
                      "baseline_value": TARGET_GROWTH, "ratio": round(growth / TARGET_GROWTH, 3)}))


if __name__ == "__main__":
    main()
