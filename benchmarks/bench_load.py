"""Concurrent sessions: request-to-update latency at N = 1, 5, 20 sessions while a Generate writes.

Run: ``python benchmarks/bench_load.py`` (about 10 minutes on a 2-core CPU).

Starts ``launch.py`` on a fresh store on a free loopback port. At each level, N sessions
open the page one after another (0.5 s apart, as people arrive) and, once all are open,
each opens a different rollout about once a second (a person's pace: every 0.5 to 1.5 s,
drawn per click from a seeded generator, and the sessions' first clicks spread over the first
second, as people who do not click in step) for ``--seconds``:
it clicks a row of the rollout table and the clock stops when the token strip of *that*
rollout arrives (its ``data-rollout``). Meanwhile one more session, the writer, presses
Generate again and again (4 new prompts x 8 completions each time: the worker samples, the
server stores and scores). Everything stays on 127.0.0.1, every wait is bounded.

Sessions are browser-like (``benchmarks/bokeh_session.py``): the HTTP page request, then
the Bokeh websocket carrying the same events Chromium sends for a row click (captured from
a real page) and the server's patches back. No browser renders: twenty Chromium renderers
on the benchmark's two cores would measure the cores, not the server, where in use every
person's browser runs on their own machine.

Errors: a page that does not open (120 s), an update that does not arrive within 10 s, a
strip showing another rollout than the one clicked, an ERROR reply, a server traceback,
and rows lost: the store's rollout count after each round must equal the seeded count plus
every "done: N rollouts stored" the writer saw.

The levels run in rounds, 1, 5, 20, then again (three rounds by default): one round's p95 at
N = 1 is the second-slowest of some 28 clicks, and the machine's noise moves a round's N = 20
p95 by a third. Every round repeats the same thing: a new server on a fresh copy of the seeded
store (the writer adds thousands of rollouts a level, so one store across rounds would make each
round heavier than the last), warmed by one session browsing for ``--warmup`` seconds before
the first level (a fresh process's first clicks fill its caches; unmeasured, its errors count). Each level's figure
is the median of its rounds' p95s (``../shared/BENCHMARKS.md``: medians of repetitions); every
round's own line and ratio are printed too. Figures: ``load_p95_ms_n20`` against the
N = 1 p95 (target: within 3x) and ``load_errors`` (target: 0).

Options: --seconds (per level, default 30), --levels (default 1,5,20), --rounds (default 3),
--warmup (default 5), --no-writer, --smoke (one round of 1 and 2 sessions for 3 s each, no
warm-up, the writer on: figures ``load_p95_ms_n2`` and ``load_errors``).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
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

from benchmarks import smoke  # noqa: E402
from benchmarks.bokeh_session import BokehSession  # noqa: E402
from tests.ui.harness import free_port, server_tracebacks  # noqa: E402

UPDATE_TIMEOUT_S = 10.0
OPEN_TIMEOUT_S = 120.0


def start_server(db: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    proc = subprocess.Popen([sys.executable, "launch.py", "--db", str(db), "--no-show", "--port", str(port)],
                            cwd=REPO, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=30)
            return proc, url
        except OSError:
            time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGKILL)
    raise RuntimeError(f"server did not start:\n{log.read_text()[-2000:]}")


def stored_rollouts(db: Path) -> int:
    """Rollouts in ``db`` (created and seeded with the sample rollouts when new, as the server does)."""
    from sample_data import ROLLOUTS_DIR
    from studio.store import Store

    store = Store.open(db, seed_dir=ROLLOUTS_DIR)
    try:
        return store.counts()["rollouts"]
    finally:
        store.close()


class Ready:
    """Starts the clocks once every session has opened its page (or failed to)."""

    def __init__(self, n: int):
        self.n, self.settled, self.event = n, 0, asyncio.Event()

    def settle(self) -> None:
        self.settled += 1
        if self.settled >= self.n:
            self.event.set()


def shown_rollout(s: BokehSession, strip: str) -> str | None:
    m = re.search(r'data-rollout="([^"]+)"', s.attr(strip, "object") or "")
    return m.group(1) if m else None


async def reader(url: str, index: int, n: int, seconds: float, latencies: list, errors: list, ready: Ready,
                 opens: list) -> None:
    s = BokehSession(url)
    try:
        await asyncio.sleep(0.5 * index)  # people arrive one after another, not all at once
        try:
            started = time.perf_counter()
            await s.open(OPEN_TIMEOUT_S)
            opens.append(time.perf_counter() - started)
            table = s.find(css_class="rollout-table", name_endswith="DataTabulator")[0]
            strip = s.ref(s.find(css_class="token-strip")[0], "data")
        except Exception as exc:  # a page that never opens is an error, not a crash of the benchmark
            errors.append(f"session {index}: page did not open: {type(exc).__name__}: {exc}"[:300])
            return
        finally:
            ready.settle()
        await ready.event.wait()  # measure steady browsing, not N page loads at once
        await asyncio.sleep(index / n)  # people do not click in step: first clicks over one second
        pace = random.Random(index)  # the same intervals in every run
        k, end = index, time.perf_counter() + seconds
        while time.perf_counter() < end:
            ids = s.attr(s.ref(table, "source"), "data")["rollout_id"]  # the page of rows shown now
            k = (k + 1) % len(ids)
            if ids[k] == shown_rollout(s, strip):
                k = (k + 1) % len(ids)
            want = ids[k]
            started = time.perf_counter()
            # what Panel's Tabulator sends for a click on a table holding its rows (not paged by
            # Panel): the selection model's indices, then the selection event
            await s.change(s.ref(s.ref(table, "source"), "selected"), "indices", [k])
            await s.event("selection-change", table, indices=[k], selected=True, flush=True)
            try:
                arrived = await s.wait_for(lambda want=want: shown_rollout(s, strip) == want, UPDATE_TIMEOUT_S)
                latencies.append((arrived - started) * 1000)
            except asyncio.TimeoutError:
                errors.append(f"session {index}: row {k} ({want}) not shown within {UPDATE_TIMEOUT_S:.0f} s"
                              f" (showing {shown_rollout(s, strip)})")
            await asyncio.sleep(max(0.0, pace.uniform(0.5, 1.5) - (time.perf_counter() - started)))
        errors.extend(f"session {index}: {e}" for e in s.errors)
    finally:
        await s.close()


async def writer(url: str, ready: Ready, stop: asyncio.Event, stored: list, errors: list) -> None:
    """Presses Generate (4 new prompts x 8) again and again until ``stop``."""
    s = BokehSession(url)
    try:
        await s.open(OPEN_TIMEOUT_S)
        for css, value in (("fresh-prompts", 4), ("group-size", 8)):
            [field] = s.find(css_class=css, where=lambda m: "value" in m["attributes"])
            await s.change(field, "value", value)
        [button] = s.find(css_class="generate-button", name_endswith="Button")
        [status] = s.find(css_class="generate-status")
    except Exception as exc:
        errors.append(f"writer: page did not open: {type(exc).__name__}: {exc}"[:300])
        return
    finally:
        ready.settle()
    await ready.event.wait()
    text = lambda: s.attr(status, "text") or ""  # noqa: E731
    try:
        while not stop.is_set():
            before = text()
            await s.event("button_click", button)
            try:  # the status moves on from the last outcome (which may read the same), then settles
                await s.wait_for(lambda before=before: text() != before, 30)
                await s.wait_for(lambda: re.search(r"done:|failed|error", text()), 120)
            except asyncio.TimeoutError:
                errors.append("writer: a Generate did not finish within 120 s")
                return
            done = re.search(r"done: (\d+) rollouts stored", text())
            if done is None:
                errors.append(f"writer: Generate did not succeed: {re.sub('<[^>]+>', '', text())[:200]}")
                return
            stored.append(int(done.group(1)))
        errors.extend(f"writer: {e}" for e in s.errors)
    finally:
        await s.close()


async def level(url: str, n: int, seconds: float, with_writer: bool) -> tuple[list[float], list[str], int, list]:
    latencies: list[float] = []
    opens: list[float] = []
    errors: list[str] = []
    stored: list[int] = []
    ready, stop = Ready(n + with_writer), asyncio.Event()
    readers = [asyncio.create_task(reader(url, i, n, seconds, latencies, errors, ready, opens)) for i in range(n)]
    write = asyncio.create_task(writer(url, ready, stop, stored, errors)) if with_writer else None
    await asyncio.gather(*readers)
    stop.set()
    if write is not None:
        await write  # the Generate under way finishes: its rows count
    return latencies, errors, sum(stored), opens


def p95(xs: list[float]) -> float:
    """The 95th percentile, interpolated between the clicks measured (never past the slowest one)."""
    return statistics.quantiles(xs, n=20, method="inclusive")[-1] if len(xs) >= 2 else (xs[0] if xs else float("nan"))


def median_p95(results: dict[tuple[int, int], tuple[list[float], list[str]]], n: int) -> float:
    """The median over the rounds of level ``n``'s p95."""
    return statistics.median(p95(lat) for (_, m), (lat, _) in results.items() if m == n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="how long each level browses")
    ap.add_argument("--levels", default="1,5,20", help="numbers of concurrent sessions")
    ap.add_argument("--rounds", type=int, default=3, help="times every level runs, in turn (figures: medians)")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds one session browses before each round")
    ap.add_argument("--no-writer", action="store_true", help="no Generate writing during the levels")
    args = smoke.parse_args(ap, seconds=3.0, levels="1,2", rounds=1, warmup=0.0)
    levels = [int(x) for x in args.levels.split(",")]
    if args.rounds < 1:
        ap.error("--rounds must be 1 or more")

    with tempfile.TemporaryDirectory() as tmp:
        seeded_db = Path(tmp) / "seeded.duckdb"
        seeded = stored_rollouts(seeded_db)
        results: dict[tuple[int, int], tuple[list[float], list[str]]] = {}  # (round, N) -> latencies, errors
        lost, warm_errors = 0, []
        for r in range(1, args.rounds + 1):
            db, log = Path(tmp) / f"round{r}.duckdb", Path(tmp) / f"server{r}.log"
            shutil.copyfile(seeded_db, db)  # every round starts from the same store
            proc, url = start_server(db, log)
            written = 0
            try:
                if args.warmup > 0:  # unmeasured: the new process's first clicks fill its caches
                    _, errs, added, _ = asyncio.run(level(url, 1, args.warmup, not args.no_writer))
                    written += added
                    warm_errors += errs
                    for e in errs[:5]:
                        print(f"round {r} warm-up:", e, flush=True)
                for n in levels:
                    since = len(log.read_text())
                    lat, errs, added, opens = asyncio.run(level(url, n, args.seconds, not args.no_writer))
                    written += added
                    errs += [f"server traceback:\n{tb}" for tb in server_tracebacks(log.read_text()[since:])]
                    results[(r, n)] = (lat, errs)
                    print(f"round {r} N={n:>3}: {len(lat):4d} updates  p50 "
                          f"{statistics.median(lat) if lat else float('nan'):7.1f} ms  p95 {p95(lat):7.1f} ms  max "
                          f"{max(lat) if lat else float('nan'):7.1f} ms  errors {len(errs)}  rollouts written {added}"
                          f"  page open median {statistics.median(opens) if opens else float('nan'):.1f} s", flush=True)
                    for e in errs[:5]:
                        print("   ", e)
            finally:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(30)
            lo, hi = p95(results[(r, levels[0])][0]), p95(results[(r, levels[-1])][0])
            # no lost rows: everything the writer was told is stored is in the store
            have = stored_rollouts(db)
            lost += abs(seeded + written - have)
            kept = "none lost" if have == seeded + written else f"{seeded + written - have:+,} missing"
            print(f"round {r}: p95 at N={levels[-1]} / N={levels[0]} = {hi / lo:.2f}x; rows: {seeded:,} seeded + "
                  f"{written:,} written = {seeded + written:,}, the store has {have:,} ({kept})", flush=True)
            db.unlink()

    print()
    for n in levels:  # each level over its rounds: the median of their p95s (the figures), and all clicks pooled
        pooled = [x for (_, m), (lat, _) in results.items() if m == n for x in lat]
        print(f"N={n:>3}: median of {args.rounds} rounds' p95 {median_p95(results, n):7.1f} ms   all "
              f"{len(pooled):,} clicks: p50 {statistics.median(pooled) if pooled else float('nan'):7.1f} ms  "
              f"p95 {p95(pooled):7.1f} ms")
    base, top = median_p95(results, levels[0]), median_p95(results, levels[-1])
    n_errors = sum(len(e) for _, e in results.values()) + len(warm_errors) + (lost != 0)
    print(f"target: p95 at N={levels[-1]} within 3x of N={levels[0]} (medians over rounds): {top / base:.2f}x "
          f"{'met' if top <= 3 * base else 'NOT met'}; errors {n_errors} {'met' if n_errors == 0 else 'NOT met'}\n")
    print(json.dumps({"figure": f"load_p95_ms_n{levels[-1]}", "value": round(top, 1), "unit": "ms",
                      "baseline": f"load_p95_ms_n{levels[0]}", "baseline_value": round(base, 1),
                      "ratio": round(top / base, 3)}))
    print(json.dumps({"figure": "load_errors", "value": n_errors, "unit": "count", "baseline": None,
                      "baseline_value": None, "ratio": None}))


if __name__ == "__main__":
    main()
