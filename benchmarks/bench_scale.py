"""A million rollouts stay interactive: what the UI runs per click, on a 1M-rollout / 100M-token store,
and how fast the importer ingests, against pyarrow writing the same tables to Parquet.

Run: ``python benchmarks/bench_scale.py`` (about 3-5 minutes on a 2-core CPU: ~2 of them
build the store in a temporary directory, deleted at the end). ``--db PATH`` keeps the store
there, or reuses the one ``benchmarks/make_large_store.py --db PATH`` built (then only the
measuring runs); ``--rollouts 100000`` for a quick check on a smaller store.

The store (``benchmarks/make_large_store.py``): ``--rollouts`` (default 1,000,000) rollouts
in groups of 8 over 10 runs, ~100 tokens each (20-300), 125,000 prompts, rewards in long
format under two rule versions, ids made in order, written through ``Store.write`` in
chunks. Every figure runs the studio's own query functions, the ones the widgets call:

``rollout_tokens_ms_median`` (target < 20 ms)
    Opening one rollout in the token strip (``widgets/token_strip.py``): everything the strip
    reads on a click, ``credit.rollout_view`` (the call the strip makes): the rollout's group
    scored from point reads (``queries.scored_group``: the header's reward, advantage over the
    group, components, and the per-token advantages), its tokens ``queries.tokens``, and its
    steps from those tokens; reads that do not wait on each other (the tokens; the prompt, run and
    versions' times) run on the studio's reader threads beside the group's, as in the strip: the
    figure is the click's wall time. Not included: the run's fork threshold, which the strip
    computes once per run and keeps. A different random rollout each repetition (``--reps``).
``filtered_page_ms_median`` (target < 200 ms)
    The rollout table with a filter (``widgets/rollout_table.py``): ``queries.rollout_table``
    with a run, *incorrect*, a reward range and a prompt text (a different run and text each
    repetition), 5,000 rows (``RolloutFilter``'s default limit; the widget's page is 18 rows, so
    this is the harder case), plus what the widget reads for its "N of M" line on a new filter:
    the filter's row count (``queries.rollout_table_counted`` counts it in the page's own scoring
    pass; ``queries.rollout_table_count`` only where the page did not) and ``queries.rollout_count``.
    That filter is the narrowest (a run's incorrect rollouts of one prompt text in a reward range);
    the broad ones come next.
``filtered_page_incorrect_ms_median`` and ``filtered_page_reward_range_ms_median`` (target < 200 ms)
    The same page and counts with one broad filter over every run: *incorrect* alone (the whole
    store scored, about half of it matching), and a reward range alone (0.1-1.1, the lower bound
    moved by 0.01 each repetition so no two repetitions ask the same).
``filtered_page_ms_correct_all_runs`` and ``filtered_page_ms_reward_all_runs`` (target < 200 ms)
    The table's first 18-row page and its counts (what the widget reads for a new filter) under
    *correct* alone and under a reward range alone (0.1-1.1, moved per repetition), over every run.
    Correctness is the column ``rollouts.correct`` (make_large_store writes it from the synthetic
    ``accuracy`` component; a store it built before that is filled first); the
    reward range reads the ``total`` rows of one version (``queries.table.reward_source``).
    Baseline ``previous_*``: the same calls of the previous implementation (``studio/queries/scoring.py``
    and ``table.py`` as of commit ``PREVIOUS``, read with ``git show``: correctness and the shown reward
    recomputed per row from every reward version), measured in the same run on the same store (null
    where git or that commit is not there).
``group_ms_median`` (no target; well under 200 ms)
    The group view (``widgets/group_view.py``): ``queries.group`` (every completion with reward,
    advantage and components) and ``queries.tokens_of`` its completions. A random group each time.
``ingest_rows_per_s`` (target: within 2x of the baseline, ratio >= 0.5)
    ``studio.ingest.importers.import_run`` of ``--ingest-rollouts`` (default 100,000, ~10M tokens)
    generic Parquet shards (columns prompt, completion, step, reward, accuracy, token_texts,
    logprobs, entropies; 4 shards) into a fresh store: (rollout + token rows) / seconds,
    median of ``--ingest-reps``. The import is a bulk one (over ``studio.store.shards.SHARD_MIN_ROWS``
    token rows), so its token rows go into one Parquet shard beside the store, written while the
    store inserts the rest; the line per repetition says where they went. Baseline
    ``pyarrow_parquet_write_rows_per_s``: ``pyarrow.parquet.write_table`` of the same Arrow
    tables (the shards the importer then reads), the same rows over the median seconds.

``--sharded`` builds the store as bulk imports leave it: the import runs' token rows (8 of the
10 runs) in one Parquet shard per run, read through the ``tokens`` view; the latencies then
include reading shards (a rollout's tokens from the one shard whose id range holds it:
``Store.tokens_between``). Without it every token row is in the table (as generated runs write them).

Before timing, a run's first table page (cut before scoring) and a page further down
(``offset``) are checked equal to the same rows of the run scored whole. Latency baselines
are null: nothing else in the run does the same work. For people the
script also prints p95s, the pieces (tokens alone, the header alone, and the SQL header the
point reads replaced: ``scored_rollouts_sql`` over the rollout's group), other table pages
(no filter, a run, a run and *incorrect*, a prompt text over every run, a page half-way down,
a sort by length and one by reward), the table's refresh queries (``queries.runs``,
``reward_bounds``) and the group picker's (``groups`` of a page's groups; the newest 50).

Options: --db, --rollouts, --tokens-per-rollout, --reps, --ingest-rollouts, --ingest-reps, --no-ingest,
--sharded, --seed, --smoke (2,000 rollouts, 3 repetitions, 1,000 ingested once: seconds).
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Collection
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: import the project's packages

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from benchmarks import make_large_store as mls  # noqa: E402
from benchmarks import smoke  # noqa: E402
from studio.signals.steps import Segmenter  # noqa: E402

TARGETS = {"rollout_tokens_ms_median": ("<", 20.0), "filtered_page_ms_median": ("<", 200.0),
           "filtered_page_ms_correct_all_runs": ("<", 200.0), "filtered_page_ms_reward_all_runs": ("<", 200.0),
           "filtered_page_incorrect_ms_median": ("<", 200.0), "filtered_page_reward_range_ms_median": ("<", 200.0),
           "group_ms_median": ("<", 200.0), "ingest_rows_per_s": (">=", 0.5)}  # ingest: ratio to the baseline
FIGURES = ("rollout_tokens", "filtered_page", "filtered_page_incorrect", "filtered_page_reward_range", "group")
PROMPT_TEXTS = [f"{d}+" for d in range(11, 99, 7)]  # "11+", "18+", ...: ~1 % of the synthetic prompts each
PREVIOUS = "afd5766"  # the table's read before correctness was a column (the baseline of the two figures above)
BROAD = {"filtered_page_ms_correct_all_runs": "correct_all_runs", "filtered_page_ms_reward_all_runs": "reward_all_runs"}


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def _timed(fn: Callable[[int], object], n: int) -> list[float]:
    """Milliseconds of ``fn(i)`` for i in 0..n-1."""
    out = []
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - t) * 1000)
    return out


def _p95(xs: list[float]) -> float:
    return float(np.percentile(xs, 95)) if xs else float("nan")


# --------------------------------------------------------------------------------------
# the store
# --------------------------------------------------------------------------------------
def open_store(db: Path | None, tmp: Path, shape: mls.Shape):
    """The store to measure: ``db`` reused if it exists, else built there (or in ``tmp``)."""
    from studio.store import Store

    path = db or tmp / "large.duckdb"
    if path.exists():
        store = Store.open(path)
        print(f"store: reusing {path} ({store.counts()['rollouts']:,} rollouts)", flush=True)
        return store, 0.0
    print(f"store: building {shape.rollouts:,} rollouts at {path}", flush=True)
    t = time.perf_counter()
    store = mls.build(path, shape)
    return store, time.perf_counter() - t


def fill_correct(store) -> None:
    """``rollouts.correct`` from the synthetic ``accuracy`` component in a store make_large_store built before
    it wrote the column (``--db``): one UPDATE, before anything is timed."""
    if store.scalar("SELECT count(*) FROM rollouts WHERE correct IS NOT NULL"):
        return
    t = time.perf_counter()
    with store.transaction() as cur:
        cur.execute("""UPDATE rollouts SET correct = a.value >= 1
                       FROM (SELECT rollout_id, value FROM rewards WHERE component = 'accuracy'
                             AND rule_version_id = (SELECT min(rule_version_id) FROM rule_versions)) a
                       WHERE rollouts.rollout_id = a.rollout_id""")
    print(f"store: rollouts.correct set from the synthetic accuracy in {time.perf_counter() - t:.1f} s", flush=True)


def previous_table():
    """The previous implementation's ``studio.queries.table`` (scoring and table modules as of commit
    ``PREVIOUS``), or None when git or the commit is not there."""
    import subprocess
    import types

    try:
        src = {m: subprocess.run(["git", "-C", str(REPO), "show", f"{PREVIOUS}:studio/queries/{m}.py"],
                                 capture_output=True, text=True, check=True).stdout for m in ("scoring", "table")}
    except (OSError, subprocess.CalledProcessError):
        return None
    scoring = types.ModuleType("previous_scoring")
    exec(compile(src["scoring"], f"{PREVIOUS}:scoring.py", "exec"), scoring.__dict__)  # noqa: S102 - our own code
    table = sys.modules["previous_table"] = types.ModuleType("previous_table")  # (dataclasses look it up)
    table.__dict__["scored_rollouts_sql"] = scoring.scored_rollouts_sql
    body = src["table"].replace("from studio.queries.scoring import scored_rollouts_sql\n", "")
    exec(compile(body, f"{PREVIOUS}:table.py", "exec"), table.__dict__)  # noqa: S102 - our own code
    return table


# --------------------------------------------------------------------------------------
# latencies: what the widgets run
# --------------------------------------------------------------------------------------
def latencies(store, reps: int, seed: int, only: Collection[str] | None = None
              ) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Milliseconds per repetition of every measured action (or of those named in ``only``); and a note per action."""
    from studio import queries
    from studio.queries import RolloutFilter, credit
    from studio.signals.advantages import Credit

    cur = store.cursor()
    # each action gets rollouts of its own, so every click is a first look at that rollout (no action
    # reads what an earlier one left in DuckDB's buffers)
    picks = [r[0] for r in cur.execute(
        f"SELECT rollout_id FROM rollouts USING SAMPLE {4 * int(reps)} ROWS (reservoir, {int(seed)})").fetchall()]
    rids, rids_t, rids_r, rids_s = (picks[k::4] for k in range(4))
    gids = [r[0] for r in cur.execute(
        f"SELECT DISTINCT group_id FROM rollouts USING SAMPLE {int(reps) * 2} ROWS (reservoir, {int(seed) + 1})"
    ).fetchall()][:reps]
    runs = [r[0] for r in cur.execute("SELECT run_id FROM runs ORDER BY created_at").fetchall()]
    cur.close()
    n = min(len(rids_s), len(gids))
    few = max(3, min(n, 5))
    cr = Credit()

    def strip(i):  # everything the token strip reads on a click (its fork threshold is kept per run)
        credit.rollout_view(store, rids[i], cr, None, Segmenter())

    def sql_header(i):  # the header as one SQL query over the rollout's group: what the point reads replaced
        base, params = queries.scored_rollouts_sql(None, queries.GROUP_OF, [rids_s[i]], cr, components=True)
        store.df(f"""SELECT s.*, p.text AS prompt, p.gold, p.task, r.name AS run, r.policy
                     FROM ({base}) s JOIN prompts p USING (prompt_id) JOIN runs r USING (run_id)
                     WHERE s.rollout_id = ?""", params + [rids_s[i]])

    def page(f: RolloutFilter, table=queries):  # what the table reads for a new filter: its first page and counts
        _, n_rows = table.rollout_table_counted(store, f, None, cr)
        if n_rows is None:  # the page did not count the filter's rows (no reward condition, or no rows)
            table.rollout_table_count(store, f, None, cr)
        queries.rollout_count(store)

    previous = previous_table()
    widget_page = 18  # the widget's page (PAGE_SIZE)

    def correct_all_runs(i, table=queries):
        page(RolloutFilter(correct=True, limit=widget_page), table)

    def reward_all_runs(i, table=queries):
        page(RolloutFilter(reward_min=0.1 + 0.01 * (i % 10), reward_max=1.1, limit=widget_page), table)

    def filtered(i):
        page(RolloutFilter(run_id=runs[i % len(runs)], correct=False, reward_min=0.1, reward_max=1.1,
                           prompt_contains=PROMPT_TEXTS[i % len(PROMPT_TEXTS)]))

    def filtered_incorrect(i):  # the broadest filters: every run scored, many rows match
        page(RolloutFilter(correct=False))

    def filtered_reward_range(i):
        page(RolloutFilter(reward_min=0.1 + 0.01 * (i % 10), reward_max=1.1))

    def filtered_recount(i):
        f = RolloutFilter(run_id=runs[i % len(runs)], correct=False, reward_min=0.1, reward_max=1.1,
                          prompt_contains=PROMPT_TEXTS[i % len(PROMPT_TEXTS)])
        queries.rollout_table(store, f, None, cr)
        queries.rollout_table_count(store, f, None, cr)
        queries.rollout_count(store)

    def group(i):
        df = queries.group(store, gids[i], None, cr)
        queries.tokens_of(store, df["rollout_id"].tolist())

    queries.rollout(store, picks[-1]), page(RolloutFilter())  # first touch: DuckDB loads its metadata
    half = queries.rollout_count(store) // 2
    page_groups = [queries.rollout_table(store, RolloutFilter(limit=18), None, cr, offset=half // (k + 1))
                   ["group_id"].unique().tolist() for k in range(few)]
    check_pages(store, runs[0])
    plan = [
        ("rollout_tokens", strip, n, "credit.rollout_view: a token-strip click (header, tokens, advantages, steps)"),
        ("tokens_only", lambda i: queries.tokens(store, rids_t[i]), n, "queries.tokens"),
        ("rollout_only", lambda i: queries.rollout(store, rids_r[i], None, cr), n,
         "queries.rollout (the header: scored_group's point reads)"),
        ("rollout_sql", sql_header, n, "the header as scored_rollouts_sql over the group (replaced)"),
        ("filtered_page", filtered, n,
         "rollout_table(run, incorrect, reward 0.1-1.1, prompt text) + its count + rollout_count"),
        ("filtered_page_incorrect", filtered_incorrect, n,
         "rollout_table(incorrect), every run + its count + rollout_count"),
        ("filtered_page_reward_range", filtered_reward_range, n,
         "rollout_table(reward 0.1-1.1, the lower bound moved per rep), every run + its count + rollout_count"),
        ("filtered_page_recount", filtered_recount, few,
         "the same with the count as a second scoring pass (rollout_table + rollout_table_count), as before"),
        ("correct_all_runs", correct_all_runs, n, "the widget's page (18 rows) under correct, every run + counts"),
        ("reward_all_runs", reward_all_runs, n,
         "the widget's page (18 rows) under reward 0.1-1.1 (moved per rep), every run + counts"),
        ("group", group, n, "queries.group + queries.tokens_of (group view)"),
        ("page_default", lambda i: page(RolloutFilter()), few, "rollout_table() no filter: the first view"),
        ("page_run", lambda i: page(RolloutFilter(run_id=runs[i % len(runs)])), few, "rollout_table(run)"),
        ("page_run_incorrect", lambda i: page(RolloutFilter(run_id=runs[i % len(runs)], correct=False)), few,
         "rollout_table(run, incorrect): scores the whole run"),
        ("page_prompt_all_runs", lambda i: page(RolloutFilter(prompt_contains=PROMPT_TEXTS[i % len(PROMPT_TEXTS)])),
         few, "rollout_table(prompt text), every run"),
        ("table_refresh", lambda i: (queries.runs(store), queries.reward_bounds(store)), few,
         "queries.runs + reward_bounds (table choices, on refresh)"),
        ("page_half_way", lambda i: queries.rollout_table(store, RolloutFilter(limit=18), None, cr,
                                                          offset=half + 18 * i), few,
         "rollout_table() page half-way down (offset: half the store)"),
        ("sort_length", lambda i: queries.rollout_table(store, RolloutFilter(limit=18), None, cr, offset=18 * i,
                                                        sort=("n_tokens", True)), few,
         "rollout_table(sort=length) pages 1-5: cut from the rollouts"),
        ("sort_reward", lambda i: queries.rollout_table(store, RolloutFilter(limit=18), None, cr, offset=18 * i,
                                                        sort=("reward", True)), 2,
         "rollout_table(sort=reward): scores every row"),
        ("group_picker", lambda i: queries.groups(store, group_ids=page_groups[i]), few,
         "queries.groups(group_ids=) of a page's groups (group picker, per page)"),
        ("group_picker_newest", lambda i: queries.groups(store, limit=50), few,
         "queries.groups(limit=50): the picker without a table (notebook)"),
    ]
    if previous is not None:
        plan += [(f"previous_{key}", lambda i, fn=fn: fn(i, previous), few,
                  f"baseline: the same under the previous implementation ({PREVIOUS})")
                 for key, fn in (("correct_all_runs", correct_all_runs), ("reward_all_runs", reward_all_runs))]
    out, notes = {}, {}
    for key, fn, k, note in (p for p in plan if only is None or p[0] in only):
        out[key] = _timed(fn, k)
        notes[key] = note
        print(f"  {key:26s} median {statistics.median(out[key]):8.1f} ms  ({k} reps)", flush=True)
    return out, notes


def check_pages(store, run_id: str) -> None:
    """A page cut before scoring (no reward filter) equals the same rows of the run scored whole
    (a limit above ``queries.PAGE_FIRST_MAX`` takes that path), and so does a page further
    down (``offset``)."""
    import pandas as pd

    from studio import queries
    from studio.queries import RolloutFilter

    whole = queries.rollout_table(store, RolloutFilter(run_id=run_id, limit=queries.PAGE_FIRST_MAX + 1))
    off = len(whole) // 3
    first = queries.rollout_table(store, RolloutFilter(run_id=run_id))
    later = queries.rollout_table(store, RolloutFilter(run_id=run_id, limit=100), offset=off)
    for got, want in ((first, whole.iloc[:len(first)]), (later, whole.iloc[off:off + 100])):
        pd.testing.assert_frame_equal(got.reset_index(drop=True), want.reset_index(drop=True), rtol=1e-9)
    print(f"  check: the run's first page ({len(first):,} rows) and 100 rows at offset {off:,} equal the run "
          f"scored whole ({len(whole):,} rows)", flush=True)


# --------------------------------------------------------------------------------------
# ingest: the importer against pyarrow writing the same tables
# --------------------------------------------------------------------------------------
def shard_tables(n_rollouts: int, tokens_per_rollout: int, seed: int, shards: int = 4) -> list[pa.Table]:
    """Generic Parquet shards' tables: one row per rollout with per-token lists (as a trainer logs)."""
    plan = mls.Plan(mls.Shape(n_rollouts, tokens_per_rollout, runs=1, chunk=max(mls.GROUP, -(-n_rollouts // shards)),
                              seed=seed + 7))
    out = []
    for _run, lo, hi, t in plan.chunks():
        toks, ros = t["tokens"], t["rollouts"]
        offsets = pa.array(np.concatenate([[0], np.cumsum(ros["n_tokens"].to_numpy())]).astype(np.int32))
        g = np.arange(lo, hi) // mls.GROUP
        out.append(pa.table({
            "prompt": plan.prompt_text.take(pa.array(plan.group_prompt[g])),
            "completion": ros["text"],
            "step": ros["train_step"],
            "reward": pa.array(plan.accuracy[lo:hi] + 0.2 * plan.format[lo:hi] + plan.len_pen[lo:hi]),
            "accuracy": pa.array(plan.accuracy[lo:hi]),
            "token_texts": pa.ListArray.from_arrays(offsets, toks["token_text"].combine_chunks().dictionary_decode()),
            "logprobs": pa.ListArray.from_arrays(offsets, toks["logprob"].combine_chunks()),
            "entropies": pa.ListArray.from_arrays(offsets, toks["entropy"].combine_chunks()),
        }))
    return out


def ingest(tmp: Path, n_rollouts: int, tokens_per_rollout: int, reps: int, seed: int) -> dict:
    """Seconds of pyarrow writing the shards and of the importer reading them into a new store."""
    from studio.ingest.formats import ColumnMapping
    from studio.ingest.importers import import_run
    from studio.store import Store

    tables = shard_tables(n_rollouts, tokens_per_rollout, seed)
    rows_ro = sum(t.num_rows for t in tables)
    rows_tok = sum(int(pc.sum(pc.list_value_length(t["token_texts"])).as_py()) for t in tables)
    folder = tmp / "shards"
    folder.mkdir(exist_ok=True)
    paths = [folder / f"shard-{i:05d}.parquet" for i in range(len(tables))]
    mapping = ColumnMapping(prompt="prompt", completion="completion", step="step", reward="reward",
                            rewards=("accuracy",), token_texts="token_texts", logprobs="logprobs",
                            entropies="entropies")
    write_s, import_s, reports = [], [], []
    for k in range(reps):
        t = time.perf_counter()
        for table, path in zip(tables, paths, strict=True):
            pq.write_table(table, path)
        write_s.append(time.perf_counter() - t)
        db = tmp / f"ingest-{k}.duckdb"
        store = Store.open(db)
        try:
            t = time.perf_counter()
            rep = import_run(store, paths, fmt="generic", mapping=mapping, on_error="abort")
            import_s.append(time.perf_counter() - t)
        finally:
            store.close()
        reports.append(rep)
        n_shards = len(list(Path(f"{db}.shards").glob("*.parquet")))
        for p in (db, Path(f"{db}.wal")):
            p.unlink(missing_ok=True)
        shutil.rmtree(f"{db}.shards", ignore_errors=True)
        print(f"  rep {k + 1}: pyarrow write {write_s[-1]:.2f} s, import_run {import_s[-1]:.2f} s "
              f"({rep.n_rollouts:,} rollouts, {rep.n_tokens:,} tokens; token rows in "
              f"{n_shards or 'no'} shard{'' if n_shards == 1 else 's'})", flush=True)
    rep = reports[-1]
    if (rep.n_rollouts, rep.n_tokens) != (rows_ro, rows_tok):
        raise SystemExit(f"the importer stored {rep.n_rollouts} rollouts / {rep.n_tokens} tokens of "
                         f"{rows_ro} / {rows_tok}: the ingest figure would not compare the same rows")
    return {"rows": rows_ro + rows_tok, "rollouts": rows_ro, "tokens": rows_tok,
            "bytes": sum(p.stat().st_size for p in paths),
            "write_s": statistics.median(write_s), "import_s": statistics.median(import_s)}


# --------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", type=Path, help="store to reuse (or build and keep there); default: a temporary one")
    ap.add_argument("--rollouts", type=int, default=mls.Shape.rollouts, help="rollouts when building the store")
    ap.add_argument("--tokens-per-rollout", type=int, default=mls.Shape.tokens_per_rollout)
    ap.add_argument("--reps", type=int, default=30, help="repetitions of each per-click action")
    ap.add_argument("--ingest-rollouts", type=int, default=100_000, help="rollouts in the ingest shards")
    ap.add_argument("--ingest-reps", type=int, default=5,
                    help="repetitions of the ingest pair (write, import): the machine is noisy")
    ap.add_argument("--no-ingest", action="store_true", help="measure the latencies only (no ingest figure)")
    ap.add_argument("--sharded", action="store_true",
                    help="build the store with import runs' token rows in Parquet shards (as bulk imports write them)")
    ap.add_argument("--seed", type=int, default=7)
    a = smoke.parse_args(ap, argv, rollouts=2_000, reps=3, ingest_rollouts=1_000, ingest_reps=1)

    tmp = Path(tempfile.mkdtemp(prefix="bench_scale-"))
    figures = []
    try:
        shape = mls.Shape(a.rollouts, a.tokens_per_rollout, sharded=a.sharded)
        store, build_s = open_store(a.db, tmp, shape)
        fill_correct(store)
        counts = store.counts()
        n_shards = len(store.shard_paths())
        print(f"store: {counts['rollouts']:,} rollouts, {counts['tokens']:,} tokens, {counts['prompts']:,} prompts, "
              f"{mls.size_of(Path(store.path)) / 2**30:.2f} GiB" + (f", built in {build_s:.0f} s" if build_s else "")
              + (f"; {store.scalar('SELECT sum(n_rows) FROM token_shards'):,} token rows in {n_shards} Parquet "
                 "shards" if n_shards else "; every token row in the table"), flush=True)
        print("latencies (ms per action; the studio's query functions, as the widgets call them):", flush=True)
        lat, notes = latencies(store, a.reps, a.seed)
        store.close()

        ing = None
        if not a.no_ingest:
            print(f"ingest: {a.ingest_rollouts:,} rollouts as generic Parquet shards", flush=True)
            try:
                ing = ingest(tmp, a.ingest_rollouts, a.tokens_per_rollout, a.ingest_reps, a.seed)
            except ImportError as exc:  # the importer is not there (older checkout): the latencies still stand
                print(f"  skipped: {exc}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print()
    w = max(map(len, lat))
    print(f"{'action':{w}s} {'median ms':>10s} {'p95 ms':>9s}  {'target':>8s}  what")
    for key, ms in lat.items():
        fig = next((k for k, v in BROAD.items() if v == key), f"{key}_ms_median")
        tgt = f"{TARGETS[fig][0]} {TARGETS[fig][1]:g}" if fig in TARGETS else ""
        print(f"{key:{w}s} {statistics.median(ms):10.1f} {_p95(ms):9.1f}  {tgt:>8s}  {notes[key]}")
    for key in FIGURES:
        figures.append({"figure": f"{key}_ms_median", "value": round(statistics.median(lat[key]), 2), "unit": "ms",
                        "baseline": None, "baseline_value": None, "ratio": None})
    for fig, key in BROAD.items():
        ours = round(statistics.median(lat[key]), 2)
        base = round(statistics.median(lat[f"previous_{key}"]), 2) if f"previous_{key}" in lat else None
        figures.append({"figure": fig, "value": ours, "unit": "ms", "baseline": f"previous_{key}_ms",
                        "baseline_value": base, "ratio": _ratio(ours, base)})
    if ing is not None:
        ours, base = ing["rows"] / ing["import_s"], ing["rows"] / ing["write_s"]
        print(f"\ningest of {ing['rollouts']:,} rollouts + {ing['tokens']:,} tokens ({ing['bytes'] / 2**20:.0f} MiB "
              f"of Parquet): import_run {ing['import_s']:.2f} s = {ours:,.0f} rows/s; pyarrow write_table "
              f"{ing['write_s']:.2f} s = {base:,.0f} rows/s; ratio {ours / base:.2f} (target >= 0.5: within 2x)")
        figures.append({"figure": "ingest_rows_per_s", "value": round(ours), "unit": "rows/s",
                        "baseline": "pyarrow_parquet_write_rows_per_s", "baseline_value": round(base),
                        "ratio": _ratio(ours, base)})
    elif not a.no_ingest:
        figures.append({"figure": "ingest_rows_per_s", "value": None, "unit": "rows/s",
                        "baseline": "pyarrow_parquet_write_rows_per_s", "baseline_value": None, "ratio": None})
    print()
    for fig in figures:
        print(json.dumps(fig))


if __name__ == "__main__":
    main()
