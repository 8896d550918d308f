"""Building and exporting preference pairs from a million stored rollouts, against plain pyarrow.

Run: ``python benchmarks/bench_export.py`` (about 1-2 minutes on a 2-core CPU, a third of it
building the store; ``--rollouts 100000`` for a quick check).

One figure, ``export_1m_s``, on an on-disk store (a temporary directory, or ``--db PATH``,
built there if missing and reused if it holds the same synthetic data) of ``--rollouts``
(default 1,000,000) synthetic rollouts of the sample task in groups of 8 (125,000 groups;
each of 12,500 distinct prompts ``Q: a+b=`` sampled in 10 groups). A completion is right
(``a+b=s;A:s``, or ``b+a=s;A:s`` three times in ten), a wrong sum (off by 1-30 either way),
a carry slip (off by 10), or the right sum without the answer line, with p(right) drawn per
group from Beta(0.5, 0.5): groups repeat completions (dedupe has work) and many are all
right or all wrong (no pair). Each rollout has the built-in rule's four reward rows
(``accuracy``, ``format``, ``steps``, ``total`` = accuracy + 0.1 format + 0.25 steps) under
one version. Everything is inserted with ``Store.write`` from Arrow tables.

The figure (``studio.curation``, the studio's own code)
    ``build_pairs`` with ``correct_vs_incorrect`` and its defaults (every right × wrong pair
    of a group, identical completions once, the same two texts once per prompt: about
    250,000 pairs), ``accept(build_id=…)`` (the review queue's bulk accept), and ``export``
    to Parquet: the staleness check of every accepted pair, the rows (prompt / chosen /
    rejected), the file, its sha256, the provenance sidecar (summary plus every pair's
    decision) and the ``exports`` / ``export_pairs`` rows. For people, the same is timed
    to JSONL, with a per-prompt cap of 4, with best_vs_worst, and without dedupe (about
    870,000 pairs).

Baseline, ``pyarrow_write_s``
    ``pyarrow.parquet.write_table`` of the same rows (the exported file read back into an
    Arrow table beforehand, untimed): only the writing, none of the pairing, the checks or
    the provenance. Both Parquet writers use their default codec (snappy).

Before each repetition the pairs, builds and exports tables are emptied (untimed) so every
build starts from nothing. The two alternate for ``--reps`` repetitions; the figure is the
median of the studio's build + accept + export, the baseline the median pyarrow write. The
exported rows are checked against the stored rewards (every chosen completion right, every
rejected one wrong, no row twice).

Options: --rollouts, --reps, --db, --threads, --smoke (800 rollouts, one repetition: seconds).
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
import pyarrow.parquet as pq  # noqa: E402

from benchmarks import smoke  # noqa: E402
from benchmarks.synthetic import open_or_build, write_store  # noqa: E402

GROUP = 8
GROUPS_PER_PROMPT = 10
TARGET_S = 10.0
CAP = 4
RUN_ID = "run_bench_export"
VERSION = "bench-arithmetic@export"


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
def build_store(path: Path, n: int):
    """Create ``path`` with n synthetic rollouts of the sample task and their four reward rows."""
    from studio.store.records import now

    rng = np.random.default_rng(20240607)
    n_groups = n // GROUP
    n_prompts = max(1, n_groups // GROUPS_PER_PROMPT)
    t = time.perf_counter()
    pick = rng.choice(990 * 90, size=n_prompts, replace=False)  # distinct prompts, as prompt ids are
    a, b = 10 + pick // 90, 10 + pick % 90
    s = a + b
    gi = np.repeat(np.arange(n_groups), GROUP)
    pi = gi % n_prompts
    p_right = np.repeat(rng.beta(0.5, 0.5, size=n_groups), GROUP)
    right = rng.random(n) < p_right
    wrong_kind = rng.integers(1, 4, size=n)  # 1: a wrong sum, 2: a carry slip, 3: no answer line
    kind = np.where(right, 0, wrong_kind)
    off = rng.integers(1, 31, size=n) * rng.choice([-1, 1], size=n)  # a wrong sum: 60 ways
    ans = s[pi] + np.where(kind == 1, off, 0) + np.where(kind == 2, 10 * np.sign(off), 0)
    swap = rng.random(n) < 0.3  # "b+a=" as well as "a+b=": two right texts per prompt
    aa, bb = np.where(swap, b[pi], a[pi]).tolist(), np.where(swap, a[pi], b[pi]).tolist()
    texts = [f"{x}+{y}={z};A:{z}" if k != 3 else f"{x}+{y}={z}"
             for x, y, z, k in zip(aa, bb, ans.tolist(), kind.tolist(), strict=True)]
    acc = (kind == 0).astype(np.float64)
    fmt = (kind != 3).astype(np.float64)
    steps = ((kind == 0) | (kind == 3)).astype(np.float64)  # the one step a+b=s
    total = acc + 0.1 * fmt + 0.25 * steps
    rollout_ids = _hex_ids("r", n, rng)
    group_ids = _hex_ids("g", n_groups, rng)
    prompt_ids = _hex_ids("p", n_prompts, rng)
    created = now()
    prompts = pa.table({
        "prompt_id": prompt_ids,
        "task": pa.array(["arithmetic"] * n_prompts),
        "text": pa.array([f"Q: {x}+{y}=" for x, y in zip(a.tolist(), b.tolist(), strict=True)]),
        "gold": pa.array([json.dumps({"answer": str(v)}) for v in s.tolist()]),
    })
    rollouts = pa.table({
        "rollout_id": rollout_ids,
        "run_id": pa.array([RUN_ID] * n),
        "prompt_id": prompt_ids.take(pa.array(pi)),
        "group_id": group_ids.take(pa.array(gi)),
        "sample_idx": pa.array(np.tile(np.arange(GROUP), n_groups), pa.int32()),
        "text": pa.array(texts, pa.string()),
        "n_tokens": pa.array([len(x) + 1 for x in texts], pa.int32()),  # one token a character, + <eos>
        "finish_reason": pa.array(["stop"] * n),
        "policy_version": pa.array(["policy@bench"] * n),
        "created_at": pa.array([created] * n, pa.timestamp("us")),
        "correct": pa.array(acc >= 1),  # the rollout's own correctness, as the studio writes it
    })
    comps = ["accuracy", "format", "steps", "total"]
    rewards = pa.table({
        "rollout_id": pa.concat_arrays([rollout_ids] * 4),
        "rule_version_id": pa.array([VERSION] * (4 * n)),
        "component": pa.array(np.repeat(comps, n).tolist()),
        "value": pa.array(np.concatenate([acc, fmt, steps, total]), pa.float64()),
    })
    runs = pd.DataFrame([{"run_id": RUN_ID, "kind": "import", "name": "bench_export synthetic",
                          "policy": "policy@bench", "task": "arithmetic", "created_at": created, "status": "done"}])
    versions = pd.DataFrame([{"rule_version_id": VERSION, "name": "bench-arithmetic", "source": "# synthetic rewards",
                              "sha256": "0" * 64, "created_at": created, "note": "bench_export"}])
    return write_store(path, {"runs": runs, "prompts": prompts, "rule_versions": versions},
                       {"rollouts": rollouts, "rewards": rewards}, time.perf_counter() - t)


def open_store(path: Path, n: int):
    return open_or_build(path, n, ("SELECT count(*) FROM rewards WHERE rule_version_id = ?", [VERSION], 4 * n),
                         build_store)


def reset(store) -> None:
    with store.transaction() as cur:
        for table in ("export_pairs", "exports", "pairs", "pair_builds"):
            cur.execute(f"DELETE FROM {table}")
    store.cursor().execute("CHECKPOINT")


# --------------------------------------------------------------------------------------
# the two methods
# --------------------------------------------------------------------------------------
def studio_export(store, out: Path, rule, filetype: str = "parquet") -> dict:
    """build + bulk accept + export, each timed; returns the times and the result."""
    from studio import curation

    reset(store)
    t0 = time.perf_counter()
    built = curation.build_pairs(store, rule, rule_version_id=VERSION)
    t1 = time.perf_counter()
    curation.accept(store, build_id=built.build_id, reviewer="bench")
    t2 = time.perf_counter()
    res = curation.export(store, out / f"prefs.{filetype}", overwrite=True)
    t3 = time.perf_counter()
    return {"build": t1 - t0, "accept": t2 - t1, "export": t3 - t2, "total": t3 - t0, "pairs": built.added,
            "rows": res.rows, "path": res.path, "sidecar": res.provenance_path}


def pyarrow_write(table: pa.Table, out: Path) -> float:
    t = time.perf_counter()
    pq.write_table(table, out / "plain.parquet")
    return time.perf_counter() - t


def check(store, path: Path) -> dict:
    """Every exported chosen completion is right and every rejected one wrong under the stored
    rewards, and no row is there twice."""
    cur = store.cursor()
    rows = pq.read_table(path)
    cur.register("_rows", rows)
    bad = cur.execute("""
        WITH right_texts AS (
            SELECT DISTINCT p.text AS prompt, ro.text FROM rollouts ro JOIN prompts p USING (prompt_id)
            JOIN rewards rw ON rw.rollout_id = ro.rollout_id AND rw.rule_version_id = ? AND rw.component = 'accuracy'
            WHERE rw.value >= 1)
        SELECT count(*) FILTER (WHERE c.text IS NULL) AS chosen_not_right,
               count(*) FILTER (WHERE r.text IS NOT NULL) AS rejected_right
        FROM _rows x LEFT JOIN right_texts c ON c.prompt = x.prompt AND c.text = x.chosen
        LEFT JOIN right_texts r ON r.prompt = x.prompt AND r.text = x.rejected""", [VERSION]).fetchall()[0]
    per_prompt = cur.execute("SELECT max(n) FROM (SELECT prompt, count(*) AS n FROM _rows GROUP BY 1)").fetchall()[0][0]
    dup = rows.num_rows - cur.execute("SELECT count(*) FROM (SELECT DISTINCT * FROM _rows)").fetchall()[0][0]
    cur.unregister("_rows")
    if bad != (0, 0) or dup:
        raise SystemExit(f"export check failed: {bad} (chosen not right, rejected right), max per prompt "
                         f"{per_prompt}, {dup} duplicate rows")
    return {"rows": rows.num_rows, "max_per_prompt": per_prompt}


# --------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=1_000_000, help="stored rollouts (a multiple of 80)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of each method (median reported)")
    ap.add_argument("--db", type=Path, default=None,
                    help="store path: built if missing, reused if present (default: a temporary directory)")
    ap.add_argument("--threads", type=int, default=None, help="DuckDB threads (default: DuckDB's, all cores)")
    args = smoke.parse_args(ap, rollouts=800, reps=1)
    if args.rollouts < GROUP * GROUPS_PER_PROMPT or args.rollouts % (GROUP * GROUPS_PER_PROMPT):
        raise SystemExit(f"--rollouts must be a positive multiple of {GROUP * GROUPS_PER_PROMPT}")
    from studio.curation import PairRule

    n = args.rollouts
    rule = PairRule("correct_vs_incorrect")
    started = time.perf_counter()
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-export-") as tmp:
        tmp = Path(tmp)
        path = args.db.expanduser() if args.db else tmp / "studio.duckdb"
        t = time.perf_counter()
        store = open_store(path, n)
        print(f"  ready in {time.perf_counter() - t:.1f} s", flush=True)
        out = tmp / "out"
        out.mkdir()
        try:
            if args.threads:
                store.cursor().execute(f"SET threads = {int(args.threads)}")
            threads = store.scalar("SELECT current_setting('threads')")
            print(f"DuckDB {store.scalar('SELECT version()')}, threads = {threads} (os.cpu_count() = "
                  f"{os.cpu_count()}); pyarrow {pa.__version__}", flush=True)

            first = studio_export(store, out, rule)  # also warms file pages and allocators
            ck = check(store, first["path"])
            table = pq.read_table(first["path"])
            print(f"check: {first['pairs']:,} pairs from {n:,} rollouts, {ck['rows']:,} rows exported (up to "
                  f"{ck['max_per_prompt']} a prompt); every chosen completion right, every rejected one wrong",
                  flush=True)
            print(f"  sidecar {first['sidecar'].stat().st_size / 1e6:.1f} MB, file "
                  f"{first['path'].stat().st_size / 1e6:.1f} MB", flush=True)

            studio_t, base_t, parts = [], [], []
            print(f"timing build + accept + export (Parquet) against pq.write_table, {args.reps} reps, "
                  "alternating ...", flush=True)
            for rep in range(args.reps):
                for method in (("studio", "pyarrow") if rep % 2 == 0 else ("pyarrow", "studio")):
                    if method == "studio":
                        r = studio_export(store, out, rule)
                        studio_t.append(r["total"])
                        parts.append(r)
                    else:
                        base_t.append(pyarrow_write(table, out))
            ts, tb = statistics.median(studio_t), statistics.median(base_t)
            med = {k: statistics.median(p[k] for p in parts) for k in ("build", "accept", "export")}

            # for people: JSONL, other rules (one or two runs each)
            k = min(args.reps, 2)
            jl = [studio_export(store, out, rule, "jsonl") for _ in range(k)]
            capped = [studio_export(store, out, PairRule("correct_vs_incorrect", per_prompt_cap=CAP)) for _ in range(k)]
            if check(store, capped[0]["path"])["max_per_prompt"] > CAP:
                raise SystemExit(f"the per-prompt cap of {CAP} was not kept")
            bvw = [studio_export(store, out, PairRule("best_vs_worst")) for _ in range(k)]
            loose = [studio_export(store, out, PairRule("correct_vs_incorrect", dedupe=False))]
        finally:
            store.close()

    ratio = ts / tb
    print()
    print(f"preference pairs from {n:,} stored rollouts ({n // GROUP:,} groups of {GROUP}), median of {args.reps}:")
    print(f"  {'':<52} {'studio s':>9} {'pyarrow s':>9} {'ratio':>7}")
    print(f"  {'build + accept + export Parquet  vs  pq.write_table':<52} {ts:>9.3f} {tb:>9.3f} {ratio:>7.2f}")
    print(f"  {'  min / max':<52} {min(studio_t):>4.2f}/{max(studio_t):<4.2f} {min(base_t):>4.2f}/{max(base_t):<4.2f}")
    print(f"  of which: build {med['build']:.3f} s ({parts[0]['pairs']:,} pairs, correct_vs_incorrect), "
          f"bulk accept {med['accept']:.3f} s, export {med['export']:.3f} s ({parts[0]['rows']:,} rows)")
    for label, runs in (("the same to JSONL", jl), (f"with a per-prompt cap of {CAP}", capped),
                        ("best_vs_worst", bvw), ("correct_vs_incorrect without dedupe", loose)):
        med = {key: statistics.median(r[key] for r in runs) for key in ("total", "build", "export")}
        print(f"  {label}: {med['total']:.3f} s ({runs[0]['pairs']:,} pairs; build {med['build']:.3f} s, "
              f"export {med['export']:.3f} s; {len(runs)} run{'s' if len(runs) > 1 else ''})")
    print(f"  target < {TARGET_S:.0f} s for 1M rollouts: "
          f"{'met' if ts < TARGET_S * n / 1_000_000 else 'NOT met'}; threads = {threads}")
    print(f"  load average at start {load0[0]:.2f}, at end {os.getloadavg()[0]:.2f} (1 min; the machine is shared)")
    print(f"\n(total {time.perf_counter() - started:.0f} s)\n")
    print(json.dumps({"figure": "export_1m_s", "value": round(ts, 3), "unit": "s",
                      "baseline": "pyarrow_write_s", "baseline_value": round(tb, 3), "ratio": _ratio(ts, tb)}))


if __name__ == "__main__":
    main()
