"""A shared store stays interactive: the scale benchmark's clicks on a shared (DuckLake) store against the
single-file store's, and a served studio browsed while another process imports into the same store.

Run: ``python benchmarks/bench_shared.py`` (it builds a 1M-rollout / 100M-token store of each kind in a
temporary directory, deleted at the end: most of the run's time on a 2-core CPU). ``--db-file PATH
--db-shared PATH`` keep the stores there, or reuse the ones an earlier run (or ``make_large_store.py --db
PATH`` and ``make_large_store.py --shared --db PATH``) built; ``--rollouts 300000`` for smaller ones.

**Clicks.** The file store is ``benchmarks/make_large_store.py``'s; the shared one is
``studio.store.copy.copy_store`` of it where that module exists, else ``make_large_store``'s shared build
(the same seed and chunks through ``Store.write``: the same rows under ids of their own). Each store is
measured by ``bench_scale.latencies`` (the studio's own query functions, as the widgets call them) on the
actions below, ``--reps`` times each, in ``--rounds`` rounds that alternate which store goes first (the
machine's load drifts); a figure is the median of all its repetitions, against the file store's
figure of the same action in the same run (target: ratio <= 1.5):

``shared_rollout_tokens_ms_median`` (baseline ``rollout_tokens_ms_median``)
    A token-strip click (``credit.rollout_view``: the header's point reads, tokens, advantages, steps).
``shared_filtered_page_ms_median`` (baseline ``filtered_page_ms_median``)
    The rollout table under a run, *incorrect*, a reward range and a prompt text, with its counts.
``shared_group_ms_median`` (baseline ``group_ms_median``; no target)
    The group view: ``queries.group`` and ``queries.tokens_of`` its completions.

``shared_open_first_read_s`` (baseline ``open_first_read_s``; no target)
    ``Store.open`` and one read: on a shared store the first read makes the process's mirror of the
    tables but the per-token ones (``studio.store.mirror``), which every later read uses.

``shared_read_after_update_ms_median`` (baseline ``shared_read_after_update_table_copied_ms_median``)
    The first read after another connection updates one rollout (``--update-reps`` times each way,
    after one untimed): the mirror replaces that rollout's row, against copying the whole table again
    (``studio.store.mirror.REPLACE_SHARE`` set to 0: what the mirror did before, and still does where a
    commit changes more than a quarter of a table). Every update writes
    the value the row held: a reused store's rows stay as they were.

The pieces (tokens alone, the header alone) and the table's refresh queries are printed beside them.

**Concurrent ops.** ``benchmarks/bench_load.py``'s browsing sessions (``--sessions``, default 5; its
``reader``: a row click timed until the token strip shows that rollout) against ``launch.py`` serving a
seeded store, each server warmed by one session for ``--warmup`` seconds first:

1. a single-file store, nothing else running: the baseline ``load_p95_ms_file_store``;
2. a shared store, nothing else running (printed: what the shared store alone costs);
3. the same shared store while another OS process (``rollout-studio import``, started once every page is
   open) imports ``--import-rollouts`` (default 100,000, ~10M tokens) rollouts from generic Parquet files
   made as ``bench_scale``'s ingest makes them: ``shared_store_concurrent_ops`` is the p95 of the clicks
   answered while the import ran (target: within 2x of the baseline). The import's time and its rows
   (counted in the store afterwards) are printed.

Each condition browses ``--seconds``. ``shared_store_concurrent_ops_errors`` (target 0) counts every
condition's errors: bench_load's (a page that does not open, an update that does not arrive within 10 s, a
strip showing another rollout), server tracebacks, an import that fails, and rows that did not arrive.

Options: --rollouts, --tokens-per-rollout, --db-file, --db-shared, --reps, --rounds, --update-reps, --sessions, --seconds,
--warmup, --import-rollouts, --no-clicks, --no-load, --seed, --smoke (2,000-rollout stores, 3 repetitions,
2 sessions for 3 s with no warm-up, 1,000 rollouts imported: seconds).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: import the project's packages

import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from benchmarks import bench_load, bench_scale, smoke  # noqa: E402
from benchmarks import make_large_store as mls  # noqa: E402
from tests.ui.harness import server_tracebacks  # noqa: E402

CLICKS = {"rollout_tokens": "shared_rollout_tokens_ms_median", "filtered_page": "shared_filtered_page_ms_median",
          "group": "shared_group_ms_median"}
SHOWN = ("tokens_only", "rollout_only", "table_refresh")  # printed beside the figures, for people
CLICK_TARGET = 1.5  # shared / file, per click figure (not for the group view)
LOAD_TARGET = 2.0  # p95 during the import / p95 of the file store
IMPORT_RUN = "bench-shared-import"
MAPPING = ("prompt=prompt", "completion=completion", "step=step", "reward=reward", "rewards=accuracy",
           "token_texts=token_texts", "logprobs=logprobs", "entropies=entropies")


def figure(name: str, value: float, unit: str, baseline: str | None = None, base: float | None = None) -> dict:
    """One figure line of ``../shared/BENCHMARKS.md``."""
    return {"figure": name, "value": value, "unit": unit, "baseline": baseline, "baseline_value": base,
            "ratio": round(value / base, 3) if base else None}


# --------------------------------------------------------------------------------------
# clicks: bench_scale's measuring functions on a file store and on a shared one
# --------------------------------------------------------------------------------------
def file_store(path: Path, shape: mls.Shape) -> Path:
    """The single-file store at ``path``: reused, or built by make_large_store."""
    if path.exists():
        print(f"file store: reusing {path}", flush=True)
        return path
    print(f"file store: building {shape.rollouts:,} rollouts at {path}", flush=True)
    mls.build(path, shape).close()
    return path


def shared_store(path: Path, source: Path, shape: mls.Shape) -> Path:
    """The shared store at ``path``: reused, or copied from the file store ``source`` (``copy_store``),
    or where that is not there built by make_large_store with the same shape."""
    from studio.store import lake

    if lake.is_shared(path):
        print(f"shared store: reusing {path}", flush=True)
        return path
    t = time.perf_counter()
    try:
        from studio.store.copy import copy_store
    except ImportError:
        print(f"shared store: building {shape.rollouts:,} rollouts at {path} (no studio.store.copy: "
              "make_large_store's chunks through Store.write)", flush=True)
        mls.build(path, mls.Shape(shape.rollouts, shape.tokens_per_rollout, seed=shape.seed, shared=True)).close()
    else:
        print(f"shared store: copying {source} to {path} (studio.store.copy.copy_store)", flush=True)
        copy_store(source, path)
    print(f"shared store: made in {time.perf_counter() - t:.0f} s", flush=True)
    return path


def describe(path: Path) -> None:
    """Print what the store at ``path`` holds and how it is stored."""
    from studio.store import Store

    store = Store.open(path)
    try:
        bench_scale.fill_correct(store)
        c = store.counts()
        files = ""
        if store.shared:
            files = (f", {store.scalar('SELECT count(*) FROM ducklake_list_files(?, ?)', ['lake', 'token_rows']):,}"
                     " token data files")
        print(f"  {store.describe()}: {c['rollouts']:,} rollouts, {c['tokens']:,} tokens, "
              f"{mls.size_of(Path(path)) / 2**30:.2f} GiB{files}", flush=True)
    finally:
        store.close()


def clicks(paths: dict[str, Path], reps: int, rounds: int, seed: int) -> dict[str, dict[str, list[float]]]:
    """Milliseconds per repetition of each measured action on each store (``"file"``, ``"shared"``)."""
    from studio.store import Store

    out: dict[str, dict[str, list[float]]] = {kind: {} for kind in paths}
    for r in range(rounds):
        for kind in (("file", "shared") if r % 2 == 0 else ("shared", "file")):
            print(f"round {r + 1}, {kind} store:", flush=True)
            started = time.perf_counter()
            store = Store.open(paths[kind])
            try:
                store.scalar("SELECT count(*) FROM rollouts")  # a shared store's first read makes its mirror
                out[kind].setdefault("open_first_read", []).append((time.perf_counter() - started) * 1000)
                lat, _ = bench_scale.latencies(store, reps, seed + r, only=(*CLICKS, *SHOWN))
            finally:
                store.close()
            for key, ms in lat.items():
                out[kind].setdefault(key, []).extend(ms)
    return out


def click_figures(lat: dict[str, dict[str, list[float]]]) -> list[dict]:
    print(f"\n{'action':16s} {'file ms':>9s} {'shared ms':>10s} {'ratio':>6s}   (medians of every repetition)")
    for key in (*CLICKS, *SHOWN):
        f, s = statistics.median(lat["file"][key]), statistics.median(lat["shared"][key])
        print(f"{key:16s} {f:9.1f} {s:10.1f} {s / f:6.2f}")
    f, s = statistics.median(lat["file"]["open_first_read"]), statistics.median(lat["shared"]["open_first_read"])
    print(f"{'open_first_read':16s} {f:9.1f} {s:10.1f} {s / f:6.2f}   (open and one read: the shared store's mirror made)")
    out = [figure("shared_open_first_read_s", round(s / 1000, 2), "s", "open_first_read_s", round(f / 1000, 2))]
    for key, name in CLICKS.items():
        f, s = statistics.median(lat["file"][key]), statistics.median(lat["shared"][key])
        out.append(figure(name, round(s, 2), "ms", f"{key}_ms_median", round(f, 2)))
        if key != "group":
            print(f"target: {name} within {CLICK_TARGET:g}x of the file store's: {s / f:.2f}x "
                  f"{'met' if s <= CLICK_TARGET * f else 'NOT met'}")
    return out


def update_reads(path: Path, reps: int) -> list[dict]:
    """The first read after another connection updates one rollout (``rollout-studio enrich`` of one
    text-only rollout, a review's verdict): the mirror replacing that rollout's row, against the
    mirror copying the whole table again (what it did before: ``REPLACE_SHARE`` 0), ``reps`` times each
    after one untimed."""
    from studio.store import Store, mirror

    reader, writer = Store.open(path), Store.open(path, mirror=False)
    share = mirror.REPLACE_SHARE
    ms: dict[str, list[float]] = {"replaced": [], "copied": []}
    try:
        n = reader.scalar("SELECT count(*) FROM rollouts")
        ids = iter(reader.df(f"SELECT rollout_id FROM rollouts USING SAMPLE {2 * reps + 2} ROWS")["rollout_id"])
        for mode in ms:  # one way, then the other: a copy's aftermath (the mirror file's checkpoint) is its own
            mirror.REPLACE_SHARE = share if mode == "replaced" else 0.0
            for i in range(reps + 1):  # the first untimed
                rid = next(ids)
                with writer.transaction() as cur:  # the same value: a DuckLake update all the same (a delete, an insert)
                    cur.execute("UPDATE rollouts SET answer = answer WHERE rollout_id = ?", [rid])
                t = time.perf_counter()
                reader.scalar("SELECT count(*) FROM rollouts WHERE rollout_id = ?", [rid])
                if i:
                    ms[mode].append((time.perf_counter() - t) * 1000)
    finally:
        mirror.REPLACE_SHARE = share
        reader.close()
        writer.close()
    ours, base = statistics.median(ms["replaced"]), statistics.median(ms["copied"])
    print(f"\nread after one rollout of {n:,} was updated elsewhere: {ours:.1f} ms replacing its row, "
          f"{base:.1f} ms copying the table again (medians of {len(ms['replaced'])})", flush=True)
    return [figure("shared_read_after_update_ms_median", round(ours, 1), "ms",
                   "shared_read_after_update_table_copied_ms_median", round(base, 1))]


# --------------------------------------------------------------------------------------
# concurrent ops: browsing a served shared store while another process imports into it
# --------------------------------------------------------------------------------------
def import_files(folder: Path, n_rollouts: int, tokens_per_rollout: int, seed: int) -> tuple[list[Path], int, int]:
    """Generic Parquet files of ``n_rollouts`` rollouts (bench_scale's ingest shards); their paths and
    how many rollouts and token rows they hold."""
    folder.mkdir(parents=True, exist_ok=True)
    tables = bench_scale.shard_tables(n_rollouts, tokens_per_rollout, seed)
    paths = []
    for i, table in enumerate(tables):
        paths.append(folder / f"shard-{i:05d}.parquet")
        pq.write_table(table, paths[-1])
    n_tokens = sum(int(pc.sum(pc.list_value_length(t["token_texts"])).as_py()) for t in tables)
    return paths, sum(t.num_rows for t in tables), n_tokens


def start_import(db: Path, files: list[Path], log: Path) -> subprocess.Popen:
    """``rollout-studio import`` of ``files`` into ``db``, in a process of its own."""
    cmd = [sys.executable, "-m", "studio.face.cli", "import", *map(str, files), "--format", "generic",
           *(x for m in MAPPING for x in ("--map", m)), "--name", IMPORT_RUN, "--db", str(db)]
    return subprocess.Popen(cmd, cwd=REPO, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)


class Stamped(list):
    """A list that notes when each item came (bench_load's reader appends its clicks and errors to lists)."""

    def __init__(self):
        super().__init__()
        self.times: list[float] = []

    def append(self, item) -> None:
        self.times.append(time.perf_counter())
        super().append(item)

    def extend(self, items) -> None:
        for item in items:
            self.append(item)


class Browsing:
    """One condition's clicks and errors, each with its time; with an import, when it ran."""

    def __init__(self):
        self.latencies, self.errors = Stamped(), Stamped()
        self.opens: list[float] = []
        self.import_span: tuple[float, float] | None = None  # perf_counter at its start and its exit
        self.import_rc: int | None = None

    def during(self) -> list[float]:
        """The clicks answered while the import ran (every click where there was none)."""
        if self.import_span is None:
            return list(self.latencies)
        t0, t1 = self.import_span
        return [ms for t, ms in zip(self.latencies.times, self.latencies, strict=True) if t0 <= t <= t1]

    def when(self, i: int) -> str:
        """When error ``i`` came, against the import's run (a click that timed out began 10 s before)."""
        if self.import_span is None:
            return ""
        t, (t0, t1) = self.errors.times[i], self.import_span
        return (f" [{t - t1:+.1f} s after the import's exit]" if t > t1 else
                f" [{t - t0:.1f} s into the import]")


async def browse(url: str, n: int, seconds: float, importer=None) -> Browsing:
    """``n`` of bench_load's reading sessions for ``seconds``; ``importer()`` (a process) starts once every
    page is open."""
    b = Browsing()
    ready = bench_load.Ready(n)
    readers = [asyncio.create_task(bench_load.reader(url, i, n, seconds, b.latencies, b.errors, ready, b.opens))
               for i in range(n)]
    await ready.event.wait()
    if importer is not None:
        started = time.perf_counter()
        proc = importer()
        while proc.poll() is None:
            await asyncio.sleep(0.05)
        b.import_span, b.import_rc = (started, time.perf_counter()), proc.returncode
    await asyncio.gather(*readers)
    return b


def serve(db: Path, log: Path, conditions: list[tuple[str, object]], a) -> dict[str, Browsing]:
    """Serve ``db``, warm it with one session, then browse under each ``(name, importer or None)`` in turn."""
    proc, url = bench_load.start_server(db, log)
    out = {}
    try:
        if a.warmup > 0:  # unmeasured: the new process's first clicks fill its caches (its errors count)
            warm = asyncio.run(browse(url, 1, a.warmup))
            out["warm-up"] = warm
        for name, importer in conditions:
            since = len(log.read_text())
            b = asyncio.run(browse(url, a.sessions, a.seconds, importer))
            b.errors.extend(f"server traceback:\n{tb}" for tb in server_tracebacks(log.read_text()[since:]))
            out[name] = b
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    return out


def concurrent(tmp: Path, a) -> list[dict]:
    from studio.store import Store, lake

    print(f"concurrent ops: {a.sessions} sessions x {a.seconds:g} s per condition; making "
          f"{a.import_rollouts:,} rollouts to import", flush=True)
    files, n_ro, n_tok = import_files(tmp / "import", a.import_rollouts, a.tokens_per_rollout, a.seed)
    file_db, shared_db = tmp / "load.duckdb", tmp / "load-shared"
    lake.create_shared(shared_db)
    seeded = {str(p): bench_load.stored_rollouts(p) for p in (file_db, shared_db)}  # seeded as the server seeds
    results = serve(file_db, tmp / "server-file.log", [("file store", None)], a)
    results |= {f"shared {k}": v for k, v in serve(shared_db, tmp / "server-shared.log", [
        ("store", None), ("store + import", lambda: start_import(shared_db, files, tmp / "import.log"))], a).items()}

    store = Store.open(shared_db)
    try:
        got_ro, got_tok = store.cursor().execute(
            """SELECT count(*), coalesce(sum(n), 0) FROM rollouts r JOIN runs USING (run_id)
               LEFT JOIN (SELECT rollout_id, count(*) AS n FROM tokens GROUP BY rollout_id) t USING (rollout_id)
               WHERE runs.name = ?""", [IMPORT_RUN]).fetchall()[0]
        total = store.counts()["rollouts"]
    finally:
        store.close()
    imp = results["shared store + import"]
    errors = [f"{name}: {e}{b.when(i)}" for name, b in results.items() for i, e in enumerate(b.errors)]
    if imp.import_rc != 0:
        errors.append(f"the import exited {imp.import_rc}:\n{(tmp / 'import.log').read_text()[-2000:]}")
    if (got_ro, got_tok) != (n_ro, n_tok) or total != seeded[str(shared_db)] + n_ro:
        errors.append(f"rows: the import stored {got_ro:,} rollouts / {got_tok:,} tokens of {n_ro:,} / {n_tok:,}; "
                      f"the store has {total:,} rollouts ({seeded[str(shared_db)]:,} seeded)")
    print((tmp / "import.log").read_text().strip(), flush=True)
    print(f"import: {n_ro:,} rollouts + {n_tok:,} tokens in {imp.import_span[1] - imp.import_span[0]:.1f} s "
          f"(process start to exit); in the "
          f"store afterwards: {got_ro:,} rollouts + {got_tok:,} tokens of its run, {total:,} rollouts in all "
          f"({seeded[str(shared_db)]:,} seeded)", flush=True)
    print(f"\n{'condition':24s} {'clicks':>7s} {'p50 ms':>8s} {'p95 ms':>8s} {'max ms':>8s} {'errors':>6s}")
    rows = [(name, b.during(), len(b.errors)) for name, b in results.items()]
    t1 = imp.import_span[1]
    rows.append(("  after the import", [ms for t, ms in zip(imp.latencies.times, imp.latencies, strict=True)
                                        if t > t1], None))  # its rows shown: the pages refreshed
    for name, lat, n_err in rows:
        if lat:
            print(f"{name:24s} {len(lat):7d} {statistics.median(lat):8.1f} {bench_load.p95(lat):8.1f} "
                  f"{max(lat):8.1f} {'' if n_err is None else n_err:>6}"
                  + ("   (answered while the import ran)" if name == "shared store + import" else ""))
    for e in errors[:10]:
        print("  error:", e[-4000:] if "traceback" in e else e[:1000])  # a traceback's last lines say where
    base = bench_load.p95(results["file store"].latencies)
    during = imp.during()
    if len(during) < 20:
        print(f"  note: only {len(during)} clicks were answered while the import ran: the p95 is a thin one "
              "(raise --import-rollouts)")
    ours = bench_load.p95(during) if during else bench_load.p95(imp.latencies)
    print(f"target: p95 during the import within {LOAD_TARGET:g}x of the file store's: {ours / base:.2f}x "
          f"{'met' if ours <= LOAD_TARGET * base else 'NOT met'}; errors {len(errors)} "
          f"{'met' if not errors else 'NOT met'}", flush=True)
    return [figure("shared_store_concurrent_ops", round(ours, 1), "ms", "load_p95_ms_file_store", round(base, 1)),
            figure("shared_store_concurrent_ops_errors", len(errors), "count")]


# --------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rollouts", type=int, default=mls.Shape.rollouts, help="rollouts when building the stores")
    ap.add_argument("--tokens-per-rollout", type=int, default=mls.Shape.tokens_per_rollout)
    ap.add_argument("--db-file", type=Path, help="the single-file store to reuse (or build and keep there)")
    ap.add_argument("--db-shared", type=Path, help="the shared store (a folder) to reuse (or make and keep there)")
    ap.add_argument("--reps", type=int, default=30, help="repetitions of each click per round")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of clicks on each store, alternating the order")
    ap.add_argument("--update-reps", type=int, default=5, help="reads after an update, each way")
    ap.add_argument("--sessions", type=int, default=5, help="browsing sessions per served condition")
    ap.add_argument("--seconds", type=float, default=60.0, help="how long each served condition browses")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds one session browses each new server first")
    ap.add_argument("--import-rollouts", type=int, default=100_000, help="rollouts the other process imports")
    ap.add_argument("--no-clicks", action="store_true", help="only the concurrent ops (no large stores)")
    ap.add_argument("--no-load", action="store_true", help="only the clicks (no served studio)")
    ap.add_argument("--seed", type=int, default=7)
    a = smoke.parse_args(ap, argv, rollouts=2_000, reps=3, rounds=1, update_reps=2, sessions=2, seconds=3.0, warmup=0.0,
                         import_rollouts=1_000)
    if a.rounds < 1 or a.sessions < 1:
        ap.error("--rounds and --sessions must be 1 or more")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs", flush=True)

    tmp = Path(tempfile.mkdtemp(prefix="bench_shared-"))
    figures = []
    try:
        if not a.no_clicks:
            shape = mls.Shape(a.rollouts, a.tokens_per_rollout)
            paths = {"file": file_store(a.db_file or tmp / "large.duckdb", shape)}
            paths["shared"] = shared_store(a.db_shared or tmp / "large-shared", paths["file"], shape)
            for p in paths.values():
                describe(p)
            figures += click_figures(clicks(paths, a.reps, a.rounds, a.seed))
            figures += update_reads(paths["shared"], a.update_reps)
        if not a.no_load:
            print(flush=True)
            figures += concurrent(tmp, a)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nload average {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end\n")
    for f in figures:
        print(json.dumps(f))


if __name__ == "__main__":
    main()
