"""Concurrent sessions: request-to-rendered-update latency at N = 1, 5, 20 browser sessions.

Run: ``python benchmarks/bench_load.py`` (about 2-3 minutes on a 2-core CPU).

Starts ``launch.py`` on a fresh store on a free loopback port, then drives N real
Chromium pages (one browser, async Playwright) against it at once. Each session opens a
different rollout about once a second: it clicks a table row and the clock stops when the
token strip shows that rollout's text (HTTP + websocket round trip, server query and
render, browser paint). Everything stays on 127.0.0.1 and every loop is bounded by
``--seconds``. Errors are page errors, updates that never arrive (10 s), and server
tracebacks. Figures: ``load_p95_ms_n20`` against the N = 1 p95 (target: within 3x), and
``load_errors`` (target: 0).

Options: --seconds (per level, default 20), --levels (default 1,5,20).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: import the project's packages

from tests.ui.harness import CHROMIUM, FLAGS, free_port, server_tracebacks  # noqa: E402

STRIP_JS = "els => els.map(e => e.firstChild.textContent).filter(t => t !== '<eos>').join('')"


def start_server(db: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    proc = subprocess.Popen([sys.executable, "launch.py", "--db", str(db), "--no-show", "--port", str(port)],
                            cwd=REPO, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=30)  # a first page takes seconds on 2 busy cores
            return proc, url
        except OSError:
            time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGKILL)
    raise RuntimeError(f"server did not start:\n{log.read_text()[-2000:]}")


def server_errors(log: Path, since: int) -> int:
    return len(server_tracebacks(log.read_text()[since:]))


class Ready:
    """Starts the clocks once every session has loaded its page (or failed to)."""

    def __init__(self, n: int):
        self.n, self.settled, self.event = n, 0, asyncio.Event()

    def settle(self) -> None:
        self.settled += 1
        if self.settled == self.n:
            self.event.set()


async def session(browser, url: str, index: int, seconds: float, latencies: list, errors: list,
                  ready: Ready) -> None:
    ctx = await browser.new_context(viewport={"width": 1600, "height": 1000})
    page = await ctx.new_page()
    page.on("pageerror", lambda e: errors.append(f"session {index}: {e}"))
    try:
        await asyncio.sleep(0.5 * index)  # people arrive one after another, not all at once
        try:
            await page.goto(url, timeout=120_000)
            await page.wait_for_selector(".tabulator-row", timeout=120_000)
            texts = await page.locator(".tabulator-row [tabulator-field=completion]").all_inner_texts()
        except Exception as exc:  # a page that never loads is an error, not a crash of the benchmark
            errors.append(f"session {index}: page did not load: {type(exc).__name__}")
            return
        finally:
            ready.settle()
        await ready.event.wait()  # measure steady browsing, not N page loads at once
        shown, k = None, index
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            # the next row (round-robin from this session's offset) whose text differs from what is shown
            k = next(j for j in range(k + 1, k + 1 + len(texts)) if texts[j % len(texts)] != shown) % len(texts)
            started = time.perf_counter()
            try:
                await page.locator(".tabulator-row").nth(k).click(timeout=10_000)
            except Exception as exc:  # a click the page could not take in 10 s is an error
                errors.append(f"session {index}: click on row {k} failed: {type(exc).__name__}")
                continue
            while True:
                strip = await page.locator(".token-strip .tok").evaluate_all(STRIP_JS)
                if strip == texts[k]:
                    latencies.append((time.perf_counter() - started) * 1000)
                    shown = strip
                    break
                if time.perf_counter() - started > 10:
                    errors.append(f"session {index}: row {k} not shown within 10 s")
                    break
                await asyncio.sleep(0.02)
            await asyncio.sleep(max(0.0, 1.0 - (time.perf_counter() - started)))  # about once a second
    finally:
        await ctx.close()


async def level(url: str, n: int, seconds: float) -> tuple[list[float], list[str]]:
    from playwright.async_api import async_playwright

    latencies: list[float] = []
    errors: list[str] = []
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            ready = Ready(n)
            await asyncio.gather(*(session(browser, url, i, seconds, latencies, errors, ready) for i in range(n)))
        finally:
            await browser.close()
    return latencies, errors


def p95(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=20)[-1] if len(xs) >= 2 else (xs[0] if xs else float("nan"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="how long each level runs")
    ap.add_argument("--levels", default="1,5,20", help="numbers of concurrent sessions")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]

    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "server.log"
        proc, url = start_server(Path(tmp) / "load.duckdb", log)
        results = {}
        try:
            for n in levels:
                since = len(log.read_text())
                lat, errs = asyncio.run(level(url, n, args.seconds))
                errs += [f"server traceback {i}" for i in range(server_errors(log, since))]
                results[n] = (lat, errs)
                print(f"N={n:>3}: {len(lat):4d} updates  p50 {statistics.median(lat) if lat else float('nan'):7.1f} ms"
                      f"  p95 {p95(lat):7.1f} ms  errors {len(errs)}", flush=True)
                for e in errs[:5]:
                    print("   ", e)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(10)

    base, top = p95(results[levels[0]][0]), p95(results[levels[-1]][0])
    n_errors = sum(len(e) for _, e in results.values())
    print(f"\ntarget: p95 at N={levels[-1]} within 3x of N={levels[0]}: {top / base:.2f}x "
          f"{'met' if top <= 3 * base else 'NOT met'}; errors {n_errors} {'met' if n_errors == 0 else 'NOT met'}\n")
    print(json.dumps({"figure": f"load_p95_ms_n{levels[-1]}", "value": round(top, 1), "unit": "ms",
                      "baseline": f"load_p95_ms_n{levels[0]}", "baseline_value": round(base, 1),
                      "ratio": round(top / base, 3)}))
    print(json.dumps({"figure": "load_errors", "value": n_errors, "unit": "count", "baseline": None,
                      "baseline_value": None, "ratio": None}))


if __name__ == "__main__":
    main()
