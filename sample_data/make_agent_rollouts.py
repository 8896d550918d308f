"""Rebuild the agent world's sample trajectories: ``python -m sample_data.make_agent_rollouts``.

Samples the sample agent policy on 40 held-out ``calculator_agent`` problems (20 of 2-3
operations, 20 of 3-4) with 8 trajectories each at temperature 1, through the studio's
Generate path (the agent loop in the worker, the calculator in its sandbox, the turns and
loss masks stored, scored with the built-in ``math`` rule), into an in-memory store; then
writes one Parquet file per seeded table (``turns`` included) into ``sample_data/agent_rollouts/``.
About a minute on a 2-core CPU.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from studio.runs.generation import GenerateConfig, generate_sync
from studio.store import Store

from . import AGENT_POLICY_DIR, AGENT_ROLLOUTS_DIR
from .agent_world import TASK, distinct_heldout
from .build_agent_policy import MAX_NEW_TOKENS, MAX_TURNS
from .make_chat_rollouts import _relative
from .make_rollouts import write_seed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=AGENT_ROLLOUTS_DIR)
    ap.add_argument("--policy", type=Path, default=AGENT_POLICY_DIR)
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("--group-size", type=int, default=8)
    args = ap.parse_args()

    store = Store.open(":memory:")
    prompts = distinct_heldout(args.prompts)
    config = GenerateConfig(group_size=args.group_size, temperature=1.0, max_new_tokens=MAX_NEW_TOKENS,
                            max_turns=MAX_TURNS, seed=1)
    res = generate_sync(store, args.policy, prompts, config, task=TASK.name, chunk_prompts=8,
                        name=f"sample trajectories · calculator agent · {len(prompts)} × {args.group_size}")
    write_seed(store, res, args.out, lambda table, rows: _relative(rows) if table in ("tasks", "runs") else rows)
    stats = store.df("SELECT avg(correct::INT) AS success, avg(n_tool_calls) AS tool_calls, "
                     "avg(n_tool_errors) AS tool_errors, avg((n_tool_calls > 0)::INT) AS calling FROM rollouts")
    print(json.dumps({"out": str(args.out), **store.counts(),
                      **{k: round(float(v), 3) for k, v in stats.iloc[0].items()}}))


if __name__ == "__main__":
    main()
