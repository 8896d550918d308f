"""Re-scoring stored rollouts with an edited rule: the sandbox against a plain in-process loop.

Run: ``python benchmarks/bench_rescore.py`` (about 2-4 minutes on a 2-core CPU).

One figure, ``rescore_100k_s``, on a temporary on-disk store seeded with the 512 sample
rollouts and grown to ``--n`` (default 100,000) rollouts inside DuckDB: the seeded rows are
copied with new rollout and group ids (``<old id>-c<copy>``) into a second run, so the same
64 prompts and their completions repeat (the tokens are not copied: re-scoring reads
rollouts and prompts only).

Sandboxed
    ``studio.rewards.rules.apply_rule_sync(store, DEFAULT_SOURCE, name=...)`` over every rollout:
    the sample task's default rule (final answer + format + per-step arithmetic) as the rule
    panel applies it. It reads the scope's rows (rollouts JOIN prompts, those not yet scored
    by the version), scores them in the sandbox's spawn-context worker pool (chunks of 500,
    per-rollout timer, memory limit) and writes the version and its rewards in one
    transaction. Each repetition uses a new name, so a new version id (``name@hash``) and
    the whole scope is re-scored. The pool is started and warmed once, untimed for the
    figure, by applying the rule to the 512 seeded rollouts (its cold time is printed).

Baseline, ``in_process_loop_s``
    The same work minus the isolation: the same read (``studio.rewards.rules._scope_rows``, the same
    query), ``DEFAULT_SOURCE`` compiled with ``exec`` in this process and its ``reward``
    called per row in a plain Python loop exactly as ``sandbox.score_chunk`` calls it
    (``task.parse_completion``, ctx ``parsed``/``task``/``n_chars``), then the version row and
    the long-format rewards (rollout_id, rule_version_id, component, value, error) written
    with ``store.write`` under their own version id.

The two alternate (which goes first alternates too) for ``--reps`` repetitions; the figure
is the median sandbox time, the baseline the median loop time. The sandbox and loop totals
are checked to agree on every rollout. For people, the script also splits one extra
sandboxed apply into its phases (read, score in the pool, write), and times the sandbox's
own scoring function (``score_chunk``) on all rows in this process, without workers.

Options: --n (rollouts), --reps, --chunk (sandbox chunk size), --smoke (1,024 rollouts, one repetition).
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

from benchmarks import smoke  # noqa: E402
from sample_data import ROLLOUTS_DIR  # noqa: E402

TARGET_RATIO = 1.5
TARGET_S = 10.0
COPY_RUN = "run_bench_rescore_copies"


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


# --------------------------------------------------------------------------------------
# the store
# --------------------------------------------------------------------------------------
def build_store(path: Path, n: int):
    """A store seeded with the sample rollouts, grown to ``n`` rollouts by copying them
    (new rollout and group ids, same prompts) into a second run. Returns (store, seed run)."""
    from studio.store import Store

    store = Store.open(path, seed_dir=ROLLOUTS_DIR)
    seeded = store.scalar("SELECT count(*) FROM rollouts")
    seed_run = store.scalar("SELECT run_id FROM rollouts GROUP BY run_id ORDER BY count(*) DESC LIMIT 1")
    if n < seeded:
        raise SystemExit(f"--n must be at least the {seeded} seeded rollouts")
    extra = n - seeded
    if extra:
        copies = -(-extra // seeded)  # ceil
        with store.transaction() as cur:
            cur.execute(f"""INSERT INTO runs (run_id, kind, name, policy, task, config, parent_run_id, created_at,
                                              status)
                            SELECT '{COPY_RUN}', 'import', 'bench_rescore copies', policy, task, config, run_id,
                                   created_at, 'done'
                            FROM runs WHERE run_id = ?""", [seed_run])
            cur.execute(f"""
                INSERT INTO rollouts (rollout_id, run_id, train_step, prompt_id, group_id, sample_idx, text,
                                      n_tokens, finish_reason, parent_rollout_id, fork_pos, forced_token_id,
                                      policy_version, created_at)
                SELECT ro.rollout_id || '-c' || k.range AS rollout_id, '{COPY_RUN}' AS run_id, ro.train_step,
                       ro.prompt_id, ro.group_id || '-c' || k.range AS group_id, ro.sample_idx, ro.text,
                       ro.n_tokens, ro.finish_reason, NULL AS parent_rollout_id, NULL AS fork_pos,
                       NULL AS forced_token_id, ro.policy_version, ro.created_at
                FROM rollouts ro CROSS JOIN range(1, ?) k
                WHERE ro.run_id = ? AND ro.parent_rollout_id IS NULL
                ORDER BY k.range, ro.rollout_id
                LIMIT ?""", [copies + 1, seed_run, extra])
        store.cursor().execute("CHECKPOINT")
    got = store.scalar("SELECT count(*) FROM rollouts")
    if got != n:
        raise SystemExit(f"store has {got} rollouts, wanted {n}")
    return store, seed_run


# --------------------------------------------------------------------------------------
# the two methods
# --------------------------------------------------------------------------------------
def sandboxed(store, name: str) -> tuple[float, str, int]:
    from studio.rewards.rules import DEFAULT_SOURCE, apply_rule_sync

    t = time.perf_counter()
    res = apply_rule_sync(store, DEFAULT_SOURCE, name=name, note="bench_rescore")
    dt = time.perf_counter() - t
    if res.status != "done":
        raise SystemExit(f"sandboxed apply {name}: {res.status}: {res.message}")
    return dt, res.rule_version_id, res.scored


def compile_rule(source: str) -> dict:
    namespace: dict = {"__name__": "rule"}
    exec(compile(source, "<rule>", "exec"), namespace)  # noqa: S102  (the baseline: no isolation)
    return namespace


def in_process(store, name: str, reward) -> tuple[float, str, int, dict]:
    """Read, score with ``reward`` in a plain loop, write: the sandbox's work without it."""
    import pandas as pd

    from studio.rewards.rules import DEFAULT_SOURCE, _scope_rows, version_id
    from studio.rewards.sandbox import source_sha
    from studio.store.records import now
    from studio.tasks import Prompt, get_task

    vid = version_id(name, DEFAULT_SOURCE)
    t0 = time.perf_counter()
    rows = _scope_rows(store, vid, None)
    t1 = time.perf_counter()
    out = []
    for task_name, part in rows.groupby("task", sort=False):
        task = get_task(task_name)
        recs = part[["rollout_id", "prompt", "gold", "completion"]].itertuples(index=False, name=None)
        for rollout_id, prompt_text, gold_json, completion in recs:
            gold = json.loads(gold_json) if isinstance(gold_json, str) else (gold_json or {})
            prompt = Prompt(prompt_text, gold)
            try:
                parsed = task.parse_completion(prompt, completion)
                ctx = {"parsed": parsed, "task": task, "n_chars": len(completion)}
                parts = reward(prompt_text, completion, gold, list(parsed.steps), **ctx)
            except Exception as exc:  # noqa: BLE001  (rule code raises anything, as in score_chunk)
                out.append((rollout_id, "total", None, f"{type(exc).__name__}: {exc}"))
            else:
                out.extend((rollout_id, k, float(v), None) for k, v in parts.items())
    t2 = time.perf_counter()
    rw = pd.DataFrame(out, columns=["rollout_id", "component", "value", "error"])
    rw.insert(1, "rule_version_id", vid)
    rw["value"] = rw["value"].astype("float64")
    version = pd.DataFrame([{"rule_version_id": vid, "name": name, "source": DEFAULT_SOURCE,
                             "sha256": source_sha(DEFAULT_SOURCE), "created_at": now(), "note": "bench_rescore loop"}])
    store.write({"rule_versions": version, "rewards": rw})
    t3 = time.perf_counter()
    return t3 - t0, vid, len(rows), {"read": t1 - t0, "score": t2 - t1, "write": t3 - t2}


def sandbox_phases(store, name: str, chunk: int) -> dict:
    """One sandboxed apply split into its pieces (the same calls ``apply_rule`` makes)."""
    from studio.rewards import sandbox
    from studio.rewards.rules import DEFAULT_SOURCE, _scope_rows, _write_version, version_id
    from studio.rewards.sandbox import Limits, source_sha

    limits = Limits()
    vid = version_id(name, DEFAULT_SOURCE)
    sha = source_sha(DEFAULT_SOURCE)
    t0 = time.perf_counter()
    rows = _scope_rows(store, vid, None)
    t1 = time.perf_counter()
    c1 = time.process_time()
    ex = sandbox.pool(limits)
    futures = []
    for task_name, part in rows.groupby("task", sort=False):
        recs = list(part[["rollout_id", "prompt", "gold", "completion"]].itertuples(index=False, name=None))
        for lo in range(0, len(recs), chunk):
            futures.append(ex.submit(sandbox.score_chunk, DEFAULT_SOURCE, sha, task_name, recs[lo:lo + chunk],
                                     limits.call_s))
    t_sub = time.perf_counter()
    rewards, steps = [], []
    for fut in futures:
        out, st, *_ = fut.result()
        rewards.extend(out)
        steps.extend(st)
    t2 = time.perf_counter()
    c2 = time.process_time()
    _write_version(store, vid, name, DEFAULT_SOURCE, "bench_rescore phases", rewards, steps)
    t3 = time.perf_counter()
    # the sandbox's scoring function in this process, no workers: its per-row cost
    recs = list(rows[["rollout_id", "prompt", "gold", "completion"]].itertuples(index=False, name=None))
    task_name = rows["task"].iloc[0]
    t4 = time.perf_counter()
    sandbox.score_chunk(DEFAULT_SOURCE, sha, task_name, recs, limits.call_s)
    t5 = time.perf_counter()
    return {"read": t1 - t0, "submit": t_sub - t1, "score": t2 - t1, "write": t3 - t2, "total": t3 - t0,
            "main_cpu": c2 - c1, "workers": limits.workers, "chunks": len(futures), "score_chunk_here": t5 - t4,
            "single_task": rows["task"].nunique() == 1}


def compare_totals(store, vid_a: str, vid_b: str) -> tuple[int, int, int]:
    """(rollouts with both totals, of them differing, missing on either side)."""
    both, diff = store.cursor().execute("""
        SELECT count(*), count(*) FILTER (WHERE a.value IS DISTINCT FROM b.value
                                          AND NOT (abs(a.value - b.value) <= 1e-12))
        FROM rewards a JOIN rewards b USING (rollout_id)
        WHERE a.rule_version_id = ? AND b.rule_version_id = ? AND a.component = 'total' AND b.component = 'total'
        """, [vid_a, vid_b]).fetchone()
    n = store.scalar("SELECT count(*) FROM rollouts")
    return both, diff, n - both


# --------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000, help="rollouts in the store (the seeded 512, copied)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of each method (median reported)")
    ap.add_argument("--chunk", type=int, default=500, help="rows per sandbox task in the phase split "
                                                            "(apply_rule's own default is 500)")
    args = smoke.parse_args(ap, n=1_024, reps=1)
    started = time.perf_counter()
    load0 = os.getloadavg()

    from studio import queries
    from studio.rewards.rules import DEFAULT_SOURCE, apply_rule_sync
    from studio.rewards.sandbox import Limits

    with tempfile.TemporaryDirectory(prefix="bench-rescore-") as tmp:
        t = time.perf_counter()
        store, seed_run = build_store(Path(tmp) / "studio.duckdb", args.n)
        print(f"store: {args.n:,} rollouts ({store.scalar('SELECT count(DISTINCT prompt_id) FROM rollouts')} prompts), "
              f"built in {time.perf_counter() - t:.1f} s", flush=True)
        try:
            # pool start + first apply on the 512 seeded rollouts: not part of the figure
            t = time.perf_counter()
            warm = apply_rule_sync(store, DEFAULT_SOURCE, name="bench-warm",
                                   scope=queries.RolloutFilter(run_id=seed_run))
            cold_s = time.perf_counter() - t
            if warm.status != "done":
                raise SystemExit(f"warm-up apply: {warm.status}: {warm.message}")
            print(f"sandbox warm-up (pool spawn of {Limits().workers} workers + {warm.scored} rollouts): "
                  f"{cold_s:.2f} s", flush=True)
            # the seeded rewards are the built-in rule's (studio.rewards.ARITHMETIC_V1), same weights
            builtin = store.scalar("""
                SELECT count(*) FILTER (WHERE abs(a.value - b.value) > 1e-9) || '/' || count(*)
                FROM rewards a JOIN rewards b USING (rollout_id)
                JOIN rule_versions v ON v.rule_version_id = a.rule_version_id
                WHERE v.name = 'bench-warm' AND b.rule_version_id <> a.rule_version_id
                  AND a.component = 'total' AND b.component = 'total'""")
            print(f"  warm-up totals vs the seeded built-in rule's rewards: {builtin} differ", flush=True)

            reward = compile_rule(DEFAULT_SOURCE)["reward"]
            times = {"sandbox": [], "loop": []}
            loop_phases = []
            vids = {}
            print(f"re-scoring all {args.n:,} rollouts, {args.reps} reps, alternating:", flush=True)
            for rep in range(args.reps):
                order = ["sandbox", "loop"] if rep % 2 == 0 else ["loop", "sandbox"]
                for method in order:
                    if method == "sandbox":
                        dt, vid, scored = sandboxed(store, f"bench-sandbox-{rep}")
                        extra = ""
                    else:
                        dt, vid, scored, ph = in_process(store, f"bench-loop-{rep}", reward)
                        loop_phases.append(ph)
                        extra = f"  (read {ph['read']:.2f}, score {ph['score']:.2f}, write {ph['write']:.2f} s)"
                    if scored != args.n:
                        raise SystemExit(f"{method} scored {scored} rollouts, expected {args.n}")
                    times[method].append(dt)
                    vids[method] = vid
                    print(f"  rep {rep + 1} {method:<7} {dt:7.2f} s  {scored / dt:9,.0f} rollouts/s{extra}", flush=True)

            both, diff, missing = compare_totals(store, vids["sandbox"], vids["loop"])
            assert missing == 0 and diff == 0, f"totals: {both} compared, {diff} differ, {missing} missing"
            print(f"totals agree: sandbox {vids['sandbox']} and loop {vids['loop']} on all {both:,} rollouts",
                  flush=True)

            print("phase split of one more sandboxed apply ...", flush=True)
            ph = sandbox_phases(store, "bench-phases", args.chunk)
        finally:
            store.close()

    ts, tl = statistics.median(times["sandbox"]), statistics.median(times["loop"])
    lp = {k: statistics.median(p[k] for p in loop_phases) for k in ("read", "score", "write")}
    ratio = ts / tl
    print()
    print(f"re-scoring {args.n:,} rollouts with DEFAULT_SOURCE (read + score + write), median of {args.reps}:")
    print(f"  sandbox (apply_rule_sync, {ph['workers']} workers): {ts:.2f} s  ({args.n / ts:,.0f} rollouts/s)  "
          f"reps {', '.join(f'{x:.2f}' for x in times['sandbox'])}")
    print(f"  in-process loop:                  {tl:.2f} s  ({args.n / tl:,.0f} rollouts/s)  "
          f"reps {', '.join(f'{x:.2f}' for x in times['loop'])}")
    print(f"  ratio sandbox / loop: {ratio:.2f}  "
          f"(target <= {TARGET_RATIO}: {'met' if ratio <= TARGET_RATIO else 'NOT met'})")
    print(f"  sandbox time for {args.n:,}: {ts:.2f} s  (target < {TARGET_S:.0f} s for 100k: "
          f"{'met' if ts < TARGET_S * args.n / 100_000 else 'NOT met'})")
    print(f"  pool cold start + 512-rollout warm-up: {cold_s:.2f} s (not in the figure)")
    print("where the time goes:")
    print(f"  in-process loop (median): read {lp['read']:.2f} s, score {lp['score']:.2f} s, write {lp['write']:.2f} s")
    print(f"  sandbox, one apply split: read {ph['read']:.2f} s, score in the pool {ph['score']:.2f} s "
          f"({ph['chunks']} chunks; building + submitting them {ph['submit']:.2f} s), write {ph['write']:.2f} s; "
          f"total {ph['total']:.2f} s")
    print(f"  this process was busy {ph['main_cpu']:.2f} s of CPU during the pool's score phase (building and "
          f"pickling the chunks, unpickling {args.n * 4:,} reward rows): it competes with the "
          f"{ph['workers']} workers for the {os.cpu_count()} cores")
    print(f"  sandbox.score_chunk on all {args.n:,} rows in this process (no pool): {ph['score_chunk_here']:.2f} s "
          f"vs the loop's scoring {lp['score']:.2f} s; with {ph['workers']} workers the ideal pool score time "
          f"is about {ph['score_chunk_here'] / ph['workers']:.2f} s")
    print(f"  load average at start {load0[0]:.2f}, at end {os.getloadavg()[0]:.2f} (1 min; other work on the "
          "machine slows the pool most, since it needs every core)")
    print(f"\n(total {time.perf_counter() - started:.0f} s)\n")

    print(json.dumps({"figure": "rescore_100k_s", "value": round(ts, 3), "unit": "s",
                      "baseline": "in_process_loop_s", "baseline_value": round(tl, 3), "ratio": _ratio(ts, tl)}))


if __name__ == "__main__":
    main()
