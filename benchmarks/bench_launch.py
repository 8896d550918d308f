"""Launch to first page: seconds from ``python launch.py`` to the rollout table in a browser.

Run: ``python benchmarks/bench_launch.py`` (about 1 minute on a 2-core CPU).

Each repetition starts ``python launch.py --db <fresh temp path> --no-show --port <free port>``
from the repository root (so the store is created and seeded from the sample rollouts, as
on a first run), waits for its port to accept connections, loads the page in headless
Chromium driven by Playwright (launched beforehand: the user's browser is already open),
retrying ``page.goto(url)`` until it succeeds, and waits until a ``.tabulator-row`` is
visible, i.e. the rollout table has been rendered over the websocket. (``--poll goto``
skips the port wait and retries ``page.goto`` from the start; on a 2-core machine those
repeated navigations slow the server's start-up, so the default waits for the port.)
The figure is the median over ``--reps`` runs; the server's process group is killed after
each. The issue names no baseline, so the 10 s target stands in for one.

Options: --reps, --policy (default: the sample policy), --timeout, --poll, --selector (for
smoke tests only: the figure is defined with ``.tabulator-row``), --smoke (one launch).
"""
from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: import the project's packages

from benchmarks import smoke  # noqa: E402
from sample_data import POLICY_DIR  # noqa: E402
from tests.ui.harness import CHROMIUM, FLAGS, free_port, stop_server  # noqa: E402

TARGET_S = 10.0


def one_run(browser, policy: Path | None, selector: str, poll: str, timeout_s: float, workdir: Path,
            i: int) -> tuple[float, float]:
    """Seconds from spawning the server to (first page load, selector visible)."""
    db = workdir / f"run{i}" / "studio.duckdb"  # fresh: does not exist yet, so launch.py builds and seeds it
    log_path = workdir / f"server{i}.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    cmd = [sys.executable, "launch.py", "--db", str(db), "--no-show", "--port", str(port)]
    if policy is not None:
        cmd += ["--policy", str(policy)]
    context = browser.new_context()  # fresh profile state per run: no cache
    page = context.new_page()
    with open(log_path, "w") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = t0 + timeout_s

            def check_alive_and_time():
                if proc.poll() is not None:
                    raise RuntimeError(f"launch.py exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"no page within {timeout_s} s:\n{log_path.read_text()[-3000:]}")

            if poll == "socket":
                # Wait for the port with cheap TCP connects: retrying Chromium navigations at
                # 20 Hz competes with the server's start-up for the CPU and inflates the figure.
                while True:
                    check_alive_and_time()
                    try:
                        socket.create_connection(("127.0.0.1", port), timeout=1).close()
                        break
                    except OSError:
                        time.sleep(0.05)
            while True:  # connection refused until the server listens: retry
                check_alive_and_time()
                try:
                    page.goto(url, wait_until="load", timeout=max(1.0, deadline - time.perf_counter()) * 1000)
                    break
                except Exception:
                    time.sleep(0.05)
            t_page = time.perf_counter() - t0
            remaining = max(1.0, deadline - time.perf_counter())
            try:
                page.wait_for_selector(selector, state="visible", timeout=remaining * 1000)
            except Exception:
                raise RuntimeError(f"{selector!r} not visible within {timeout_s} s:\n"
                                   f"{log_path.read_text()[-3000:]}") from None
            t_table = time.perf_counter() - t0
        finally:
            context.close()
            stop_server(proc)
    return t_page, t_table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3, help="launches to time (median reported)")
    ap.add_argument("--policy", type=Path, default=None,
                    help=f"policy folder passed to launch.py (default: launch.py's own, {POLICY_DIR})")
    ap.add_argument("--timeout", type=float, default=120.0, help="give up on a launch after this many seconds")
    ap.add_argument("--poll", choices=["socket", "goto"], default="socket",
                    help="wait for the port with TCP connects, then load the page (default), or retry page.goto")
    ap.add_argument("--selector", default=".tabulator-row",
                    help="element whose visibility ends the clock (the figure uses .tabulator-row)")
    args = smoke.parse_args(ap, reps=1)

    from playwright.sync_api import sync_playwright

    policy = args.policy.expanduser().resolve() if args.policy else None
    pages, tables = [], []
    with tempfile.TemporaryDirectory(prefix="bench-launch-") as tmp, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            for i in range(args.reps):
                t_page, t_table = one_run(browser, policy, args.selector, args.poll, args.timeout, Path(tmp), i)
                pages.append(t_page)
                tables.append(t_table)
                print(f"run {i + 1}: page answered after {t_page:.2f} s, {args.selector} visible after {t_table:.2f} s",
                      flush=True)
        finally:
            browser.close()

    value = statistics.median(tables)
    print()
    print(f"median launch -> first page load:     {statistics.median(pages):.2f} s")
    print(f"median launch -> {args.selector} visible: {value:.2f} s  (target <= {TARGET_S:.0f} s: "
          f"{'met' if value <= TARGET_S else 'NOT met'})")
    if args.selector != ".tabulator-row":
        print(f"note: measured with --selector {args.selector!r}, not the figure's .tabulator-row")
    print()
    print(json.dumps({"figure": "launch_to_first_page_s", "value": round(value, 2), "unit": "s",
                      "baseline": "target_s", "baseline_value": TARGET_S, "ratio": round(value / TARGET_S, 3)}))


if __name__ == "__main__":
    main()
