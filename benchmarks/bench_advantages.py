"""GRPO and RLOO advantages for every stored rollout: DuckDB window functions against pandas.

Run: ``python benchmarks/bench_advantages.py`` (about 1-2 minutes on a 2-core CPU, most of it
building the store; ``--rollouts 100000`` for a quick check).

One figure, ``advantages_1m_s``, on an on-disk store (a temporary directory by default, or
``--db PATH``, built there if missing and reused if it holds the same synthetic data) of
``--rollouts`` (default 1,000,000) synthetic rollouts in groups of 8 (125,000 groups), each
with one ``'total'`` reward under one rule version. Everything is inserted with
``Store.write`` from Arrow tables. Random 17-character ids like the studio's (``r…``/``g…``
+ 16 hex digits). The rewards mix three kinds of group, so that many groups are all-equal
(advantage collapse) as in real GRPO batches:

* 45 % binary accuracy, p drawn per group from Beta(0.5, 0.5) (many all-0 / all-1 groups);
* 45 % composed rule totals: accuracy + 0.2·format + 0.1·steps/4 (discrete values);
* 10 % reward-model scores (continuous, N(group mean, 1)).

DuckDB (the figure)
    One query, the studio's own (``studio.queries.scored_rollouts_sql`` for GRPO, Dr. GRPO
    and RLOO): ``rollouts JOIN rewards`` (``component = 'total'``, the rule version), the
    per-group statistics ``group_stats_sql()`` from one ``GROUP BY group_id`` joined back,
    and ``from_stats_sql('grpo')`` and ``from_stats_sql('rloo')`` per row, fetched as an
    Arrow table (``to_arrow_table()``: rollout_id, group_id, reward, grpo, rloo held in this
    process). The window twins (``grpo_sql``/``rloo_sql``, ``OVER (PARTITION BY
    group_id)``) are timed too, for people, and checked equal.

Baseline, ``pandas_groupby_s``
    The same join query fetched with ``Store.df`` (``.df()``) into a DataFrame, then one
    ``groupby('group_id', sort=False)`` and ``transform`` of mean, std (sample, ddof=1),
    sum, count, max and min: GRPO = (r - mean) / (std + 1e-4), RLOO = r - (sum - r) / (n - 1),
    all-equal groups (max - min <= 1e-9) and groups of one -> 0, as ``studio.signals.advantages``.
    The result (the same five columns) is held in the DataFrame.

Before timing, the two are checked to agree on every rollout (max abs diff < 1e-9) and
against the numpy references ``studio.signals.advantages.grpo`` / ``rloo`` on a few groups
(all-equal ones included). The two then alternate (which goes first alternates too) for
``--reps`` repetitions; the figure is the DuckDB median, the baseline the pandas median.
For people, the script also splits the time: the join alone (to Arrow, to pandas), the
pandas transform alone, and DuckDB's result kept as ``CREATE TEMP TABLE … AS`` or fetched
with ``.df()`` instead of Arrow.

DuckDB runs with its default thread count (all cores) unless ``--threads`` says otherwise;
the count used is printed.

Options: --rollouts, --reps, --db, --threads, --smoke (8,000 rollouts, one repetition: seconds).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: import the project's packages

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402

from benchmarks import smoke  # noqa: E402
from benchmarks.synthetic import open_or_build, write_store  # noqa: E402
from studio.signals.advantages import (  # noqa: E402
    EQUAL_TOL,
    GRPO_EPS,
    from_stats_sql,
    group_stats_sql,
    grpo,
    grpo_sql,
    rloo,
    rloo_sql,
)

GROUP = 8
TARGET_S = 1.0
RUN_ID = "run_bench_advantages"
RULE = "bench-total@advantages"
N_PROMPTS_DIV = 10  # each prompt is sampled in 10 groups (different train steps)
GROUPS_PER_STEP = 1000

JOINED = """
    SELECT ro.rollout_id, ro.group_id, rw.value AS reward
    FROM rollouts ro
    JOIN rewards rw ON rw.rollout_id = ro.rollout_id
    WHERE rw.rule_version_id = ? AND rw.component = 'total'
"""
# the figure: what studio.queries.scored_rollouts_sql runs for GRPO, Dr. GRPO and RLOO
DUCK = f"""
    WITH scored AS ({JOINED}),
    gs AS (SELECT group_id, {group_stats_sql()} FROM scored GROUP BY group_id)
    SELECT s.rollout_id, s.group_id, s.reward,
           {from_stats_sql('grpo', 's.reward')} AS grpo,
           {from_stats_sql('rloo', 's.reward')} AS rloo
    FROM scored s JOIN gs USING (group_id)
"""

# not the figure: the window twins (the readable definition), one OVER (PARTITION BY group_id)
WINDOWS = f"""
    WITH scored AS ({JOINED})
    SELECT rollout_id, group_id, reward,
           {grpo_sql('reward', 'group_id')} AS grpo,
           {rloo_sql('reward', 'group_id')} AS rloo
    FROM scored
"""


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def _hex_ids(prefix: str, n: int, rng: np.random.Generator) -> pa.Array:
    raw = rng.integers(0, 2**63, size=n, dtype=np.int64)
    if len(np.unique(raw)) != n:  # 1e6 draws from 2**63: practically never
        raise SystemExit("id collision; run again")
    return pa.array([f"{prefix}{x:016x}" for x in raw.tolist()], pa.string())


# --------------------------------------------------------------------------------------
# the store
# --------------------------------------------------------------------------------------
def synthetic_rewards(n_groups: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(rewards of n_groups*8 rollouts in group order, kind of each group 0/1/2)."""
    kind = rng.choice(3, size=n_groups, p=[0.45, 0.45, 0.10])
    p = rng.beta(0.5, 0.5, size=n_groups)[:, None]
    acc = (rng.random((n_groups, GROUP)) < p).astype(np.float64)
    fmt = (rng.random((n_groups, GROUP)) < 0.9).astype(np.float64)
    steps = rng.integers(0, 5, size=(n_groups, GROUP)) / 4.0
    composed = acc + 0.2 * fmt + 0.1 * steps
    rm = rng.normal(rng.normal(0, 1, size=(n_groups, 1)), 1.0, size=(n_groups, GROUP))
    r = np.where(kind[:, None] == 0, acc, np.where(kind[:, None] == 1, composed, rm))
    return r.ravel(), kind


def build_store(path: Path, n: int):
    """Create ``path`` (must not exist) with n synthetic rollouts and their 'total' rewards."""
    from studio.store.records import now

    rng = np.random.default_rng(20240601)
    n_groups = n // GROUP
    n_prompts = max(1, n_groups // N_PROMPTS_DIV)
    t = time.perf_counter()
    gi = np.repeat(np.arange(n_groups), GROUP)
    group_ids = _hex_ids("g", n_groups, rng)
    prompt_ids = _hex_ids("p", n_prompts, rng)
    rollout_ids = _hex_ids("r", n, rng)
    rewards, _ = synthetic_rewards(n_groups, rng)
    created = now()
    a = rng.integers(10, 100, size=n_prompts)
    b = rng.integers(10, 100, size=n_prompts)
    prompts = pa.table({
        "prompt_id": prompt_ids,
        "task": pa.array(["arithmetic"] * n_prompts),
        "text": pa.array([f"{x}+{y}=" for x, y in zip(a.tolist(), b.tolist(), strict=True)]),
        "gold": pa.array([f'{{"answer": {x + y}}}' for x, y in zip(a.tolist(), b.tolist(), strict=True)]),
    })
    rollouts = pa.table({
        "rollout_id": rollout_ids,
        "run_id": pa.array([RUN_ID] * n),
        "train_step": pa.array(gi // GROUPS_PER_STEP, pa.int32()),
        "prompt_id": prompt_ids.take(pa.array(gi % n_prompts)),
        "group_id": group_ids.take(pa.array(gi)),
        "sample_idx": pa.array(np.tile(np.arange(GROUP), n_groups), pa.int32()),
        "n_tokens": pa.array(rng.integers(8, 64, size=n), pa.int32()),
        "finish_reason": pa.array(["stop"] * n),
        "policy_version": pa.array(["policy@bench"] * n),
        "created_at": pa.array([created] * n, pa.timestamp("us")),
    })  # text is left NULL: the advantage query never reads it
    reward_tbl = pa.table({
        "rollout_id": rollout_ids,
        "rule_version_id": pa.array([RULE] * n),
        "component": pa.array(["total"] * n),
        "value": pa.array(rewards, pa.float64()),
    })
    runs = pd.DataFrame([{"run_id": RUN_ID, "kind": "import", "name": "bench_advantages synthetic",
                          "policy": "policy@bench", "task": "arithmetic", "created_at": created, "status": "done"}])
    versions = pd.DataFrame([{"rule_version_id": RULE, "name": "bench-total", "source": "# synthetic totals",
                              "sha256": "0" * 64, "created_at": created, "note": "bench_advantages"}])
    return write_store(path, {"runs": runs, "prompts": prompts, "rule_versions": versions},
                       {"rollouts": rollouts, "rewards": reward_tbl}, time.perf_counter() - t)


def open_store(path: Path, n: int):
    return open_or_build(path, n, ("SELECT count(*) FROM rewards WHERE rule_version_id = ? AND component = 'total'",
                                   [RULE], n), build_store)


# --------------------------------------------------------------------------------------
# the two methods
# --------------------------------------------------------------------------------------
def duck_arrow(store, sql: str = DUCK) -> pa.Table:
    # cursor.sql(...).to_arrow_table(): the result streams into Arrow (execute() would copy it once more)
    return store.cursor().sql(sql, params=[RULE]).to_arrow_table()


def duck_df(store) -> pd.DataFrame:
    return store.df(DUCK, [RULE], timeout_s=0)


def duck_temp(store) -> int:
    cur = store.cursor()
    cur.execute(f"CREATE OR REPLACE TEMP TABLE bench_adv AS {DUCK}", [RULE])
    return cur.execute("SELECT count(*) FROM bench_adv").fetchone()[0]


def pandas_transform(df: pd.DataFrame) -> pd.DataFrame:
    """GRPO and RLOO by groupby transform, with studio.signals.advantages' conventions."""
    r = df["reward"]
    g = r.groupby(df["group_id"], sort=False)
    mean, std = g.transform("mean"), g.transform("std")  # std: ddof=1, NaN for a group of one
    total, count = g.transform("sum"), g.transform("count")
    equal = (g.transform("max") - g.transform("min")) <= EQUAL_TOL
    df["grpo"] = ((r - mean) / (std + GRPO_EPS)).fillna(0.0).mask(equal, 0.0)
    df["rloo"] = (r - (total - r) / (count - 1).replace(0, np.nan)).fillna(0.0).mask(equal, 0.0)
    return df


def pandas_all(store) -> pd.DataFrame:
    return pandas_transform(store.df(JOINED, [RULE], timeout_s=0))


# --------------------------------------------------------------------------------------
# checks
# --------------------------------------------------------------------------------------
def check(store, n: int) -> dict:
    duck = duck_arrow(store).to_pandas().sort_values("rollout_id", ignore_index=True)
    pdf = pandas_all(store).sort_values("rollout_id", ignore_index=True)
    if len(duck) != n or len(pdf) != n:
        raise SystemExit(f"expected {n} rows: DuckDB {len(duck)}, pandas {len(pdf)}")
    if not (duck["rollout_id"].to_numpy() == pdf["rollout_id"].to_numpy()).all():
        raise SystemExit("DuckDB and pandas return different rollouts")
    diff = {k: float(np.max(np.abs(duck[k].to_numpy(float) - pdf[k].to_numpy(float)))) for k in ("grpo", "rloo")}
    if max(diff.values()) >= 1e-9:
        raise SystemExit(f"DuckDB and pandas disagree: max abs diff {diff}")
    # the numpy references, on a few groups of each sort (all-equal and not)
    spread = duck.groupby("group_id")["reward"].agg(lambda s: s.max() - s.min())
    eq = spread.index[spread <= EQUAL_TOL]
    ne = spread.index[spread > EQUAL_TOL]
    rng = np.random.default_rng(7)
    pick = list(rng.choice(eq, min(10, len(eq)), replace=False)) + list(rng.choice(ne, min(20, len(ne)), replace=False))
    ref_diff = 0.0
    for frame in (duck, pdf):
        sub = frame[frame["group_id"].isin(pick)].sort_values(["group_id", "rollout_id"])
        r, grp = sub["reward"].to_numpy(float), sub["group_id"].to_numpy()
        for got, ref in ((sub["grpo"].to_numpy(float), grpo(r, grp)), (sub["rloo"].to_numpy(float), rloo(r, grp))):
            ref_diff = max(ref_diff, float(np.max(np.abs(got - ref))))
        if not (sub.loc[sub["group_id"].isin(eq), ["grpo", "rloo"]] == 0.0).all().all():
            raise SystemExit("an all-equal group got a non-zero advantage")
    if ref_diff >= 1e-9:
        raise SystemExit(f"advantages differ from the numpy reference by {ref_diff}")
    return {"diff": diff, "ref_diff": ref_diff, "ref_groups": len(pick), "equal_groups": len(eq),
            "groups": len(spread), "nonzero_grpo": int((duck["grpo"].abs() > 1e-12).sum())}


def timed(fn, *args) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def median_of(fn, reps: int, *args) -> tuple[float, list[float]]:
    xs = [timed(fn, *args) for _ in range(reps)]
    return statistics.median(xs), xs


def _fmt(xs: list[float]) -> str:
    return f"min {min(xs):.3f}, max {max(xs):.3f}"


# --------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=1_000_000, help="stored rollouts (a multiple of 8)")
    ap.add_argument("--reps", type=int, default=5, help="repetitions of each method (median reported)")
    ap.add_argument("--db", type=Path, default=None,
                    help="store path: built if missing, reused if present (default: a temporary directory)")
    ap.add_argument("--threads", type=int, default=None, help="DuckDB threads (default: DuckDB's, all cores)")
    args = smoke.parse_args(ap, rollouts=8_000, reps=1)
    if args.rollouts < GROUP or args.rollouts % GROUP:
        raise SystemExit(f"--rollouts must be a positive multiple of {GROUP}")
    n = args.rollouts
    started = time.perf_counter()
    load0 = os.getloadavg()

    with tempfile.TemporaryDirectory(prefix="bench-advantages-") as tmp:
        path = args.db.expanduser() if args.db else Path(tmp) / "studio.duckdb"
        t = time.perf_counter()
        store = open_store(path, n)
        print(f"  ready in {time.perf_counter() - t:.1f} s", flush=True)
        try:
            if args.threads:
                store.cursor().execute(f"SET threads = {int(args.threads)}")
            threads = store.scalar("SELECT current_setting('threads')")
            print(f"DuckDB {store.scalar('SELECT version()')}, threads = {threads} (os.cpu_count() = "
                  f"{os.cpu_count()}); pandas {pd.__version__}, numpy {np.__version__}", flush=True)

            t = time.perf_counter()
            ck = check(store, n)  # also warms both paths (file pages, allocators)
            print(f"check ({time.perf_counter() - t:.1f} s): {n:,} rollouts, {ck['groups']:,} groups, "
                  f"{ck['equal_groups']:,} all-equal ({ck['equal_groups'] / ck['groups']:.0%}), "
                  f"{ck['nonzero_grpo']:,} non-zero GRPO advantages", flush=True)
            print(f"  DuckDB vs pandas on every rollout: max abs diff GRPO {ck['diff']['grpo']:.1e}, "
                  f"RLOO {ck['diff']['rloo']:.1e}; both vs numpy grpo/rloo on {ck['ref_groups']} groups: "
                  f"{ck['ref_diff']:.1e}", flush=True)

            times = {"duckdb": [], "pandas": []}
            fns = {"duckdb": duck_arrow, "pandas": pandas_all}
            print(f"timing GRPO + RLOO over all {n:,} rollouts, {args.reps} reps, alternating ...", flush=True)
            for rep in range(args.reps):
                for method in (("duckdb", "pandas") if rep % 2 == 0 else ("pandas", "duckdb")):
                    times[method].append(timed(fns[method], store))
            td, tp = statistics.median(times["duckdb"]), statistics.median(times["pandas"])

            # where the time goes (medians of 3, for people; not in the figure)
            parts = 3
            j_arrow, j_arrow_xs = median_of(duck_arrow, parts, store, JOINED)
            j_df, j_df_xs = median_of(lambda s: s.df(JOINED, [RULE], timeout_s=0), parts, store)
            frame = store.df(JOINED, [RULE], timeout_s=0)
            p_only, p_only_xs = median_of(lambda f: pandas_transform(f.copy()), parts, frame)
            d_temp, d_temp_xs = median_of(duck_temp, parts, store)
            d_df, d_df_xs = median_of(duck_df, parts, store)
            g_by, g_by_xs = median_of(duck_arrow, parts, store, WINDOWS)
            gb = duck_arrow(store, WINDOWS).to_pandas().sort_values("rollout_id", ignore_index=True)
            ref = duck_arrow(store).to_pandas().sort_values("rollout_id", ignore_index=True)
            g_by_diff = max(float(np.max(np.abs(gb[k].to_numpy(float) - ref[k].to_numpy(float))))
                            for k in ("grpo", "rloo"))
            del gb, ref
            store.cursor().execute("DROP TABLE IF EXISTS bench_adv")
            one = None
            if str(threads) != "1":
                store.cursor().execute("SET threads = 1")
                one, one_xs = median_of(duck_arrow, parts, store)
                store.cursor().execute(f"SET threads = {threads}")
        finally:
            store.close()

    ratio = td / tp
    w = 58
    print()
    print(f"GRPO + RLOO advantages, {n:,} stored rollouts ({n // GROUP:,} groups of {GROUP}), "
          f"median of {args.reps}:")
    print(f"  {'':<{w}} {'DuckDB s':>9} {'pandas s':>9} {'ratio':>7}")
    print(f"  {'join rollouts->rewards + GRPO + RLOO, result in memory':<{w}} {td:>9.3f} {tp:>9.3f} {ratio:>7.2f}")
    print(f"  {'  (DuckDB: Arrow table; pandas: .df() + groupby transform)':<{w}}")
    print(f"  {'  min / max':<{w}} {min(times['duckdb']):>4.2f}/{max(times['duckdb']):<4.2f} "
          f"{min(times['pandas']):>4.2f}/{max(times['pandas']):<4.2f}")
    print(f"  {n / td:,.0f} rollouts/s in DuckDB, {n / tp:,.0f} in pandas (pandas time / DuckDB time = {tp / td:.2f})")
    print(f"  DuckDB time for {n:,}: {td:.3f} s (target < {TARGET_S:.0f} s for 1M: "
          f"{'met' if td < TARGET_S * n / 1_000_000 else 'NOT met'}); threads = {threads}")
    print("where the time goes (median of 3 each):")
    print(f"  the join alone, fetched as Arrow:                  {j_arrow:.3f} s  ({_fmt(j_arrow_xs)})")
    print(f"  the join alone, fetched with .df():                {j_df:.3f} s  ({_fmt(j_df_xs)})  <- pandas' read")
    print(f"  pandas groupby transform on the in-memory frame:   {p_only:.3f} s  ({_fmt(p_only_xs)})")
    print(f"  DuckDB join + group stats, kept as CREATE TEMP TABLE:  {d_temp:.3f} s  ({_fmt(d_temp_xs)})")
    print(f"  DuckDB join + group stats, fetched with .df():     {d_df:.3f} s  ({_fmt(d_df_xs)})")
    if one is not None:
        print(f"  DuckDB join + group stats to Arrow, threads = 1:     {one:.3f} s  ({_fmt(one_xs)})")
    print(f"  not the figure: the window twins (OVER PARTITION BY), to Arrow: {g_by:.3f} s  ({_fmt(g_by_xs)}; "
          f"max abs diff to the figure's {g_by_diff:.1e})")
    print(f"  so the group statistics add about {td - j_arrow:.3f} s to the DuckDB join; "
          f"pandas spends {j_df:.3f} s reading and {p_only:.3f} s computing")
    print(f"  load average at start {load0[0]:.2f}, at end {os.getloadavg()[0]:.2f} (1 min; the machine is shared)")
    print(f"\n(total {time.perf_counter() - started:.0f} s)\n")

    print(json.dumps({"figure": "advantages_1m_s", "value": round(td, 3), "unit": "s",
                      "baseline": "pandas_groupby_s", "baseline_value": round(tp, 3), "ratio": _ratio(td, tp)}))


if __name__ == "__main__":
    main()
