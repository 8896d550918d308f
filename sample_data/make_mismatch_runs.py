"""Rebuild the seeded mismatch world: ``python -m sample_data.make_mismatch_runs``.

Two real mini-runs of the sample arithmetic policy with a bfloat16 sampler (the overlapped
sampler process, so from step 2 on its weights are also one update stale) and the float32
trainer, the same seed and settings except the correction: one without (``correction = none``),
one with verl's token TIS (C = 2). Every token keeps the sampler's log-prob (``tokens.logprob``)
and the trainer's (``tokens.train_logprob``), each run its per-step ``mismatch/*`` and ``is/*``
metrics, and each run's last checkpoint is evaluated on held-out prompts (``heldout/*`` metrics,
:func:`studio.runs.minirun.evaluate_run`'s names). Written as one Parquet file per seeded table
(their metrics included) into ``sample_data/mismatch_runs/``; a new store is seeded with it
(``SEED_DIRS``), so the Mismatch tab shows per-step drift and the Mini-runs tab compares the two
runs on first open. A few minutes on a 2-core CPU.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import pyarrow.parquet as pq

from studio.runs import minirun
from studio.runs.minirun.evaluation import heldout_metrics
from studio.runs.training import MiniRunConfig, evaluate_job, heldout_prompts
from studio.store import Store, schema
from studio.tasks import get_task

from . import MISMATCH_RUNS_DIR
from .make_chat_rollouts import _relative

BASE = dict(steps=8, prompts_per_step=4, group_size=8, n_prompts=32, seed=3, checkpoint_every=8,
            sampler_precision="bfloat16", overlap=True)
RUNS = {"no correction": dict(correction="none"), "TIS, C = 2": dict(correction="tis")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=MISMATCH_RUNS_DIR)
    ap.add_argument("--heldout", type=int, default=100, help="held-out prompts each run's last checkpoint is evaluated on")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(Path(tmp) / "mismatch.duckdb")
        held = [p.to_json() for p in heldout_prompts(get_task("arithmetic"), args.heldout)]
        for name, extra in RUNS.items():
            rid = minirun.start(store, MiniRunConfig(**BASE, **extra), name=f"bf16 sampler · {name}")
            st = minirun.wait(rid, 3600)
            if st.status != "done":
                raise SystemExit(f"{name}: {st.status}: {st.error}")
            step, path = minirun.last_checkpoint(store, rid)
            store.write({"metrics": heldout_metrics(rid, step, evaluate_job(path, held, "arithmetic", k=4, seed=0))})
        with store.transaction() as cur:  # the checkpoints stay behind: a seeded store has none
            cur.execute("DELETE FROM metrics WHERE name = 'checkpoint'")
        args.out.mkdir(parents=True, exist_ok=True)
        for table in schema.SEEDED:
            rows = store.cursor().sql(f"SELECT * FROM {table}").to_arrow_table()
            if rows.num_rows:
                pq.write_table(_relative(rows) if table in ("tasks", "runs") else rows, args.out / f"{table}.parquet",
                               compression="zstd")
        stats = store.df("""SELECT r.name, count(DISTINCT ro.rollout_id) AS rollouts,
                                   avg(abs(t.train_logprob - t.logprob)) AS abs_delta_mean
                            FROM rollouts ro JOIN runs r USING (run_id) JOIN tokens t USING (rollout_id)
                            GROUP BY 1 ORDER BY 1""")
        store.close()
    print(json.dumps({"out": str(args.out), "runs": stats.to_dict("records")}, default=float))


if __name__ == "__main__":
    main()
