"""Rebuild the realistic world's sample rollouts: ``python -m sample_data.make_chat_rollouts``.

Adds the GSM8K-shaped word problems (``wordproblems/gsm8k/train.jsonl`` and ``test.jsonl``)
to an in-memory store as the prompt set ``wordproblems`` (the ``gsm8k`` preset, exactly as
``rollout-studio task add`` does), draws 48 prompts of its test split (seed 1) and samples
the chat policy on them, 8 completions each at temperature 1, through the studio's Generate
path (the policy's chat template applied in the worker, answers verified by math-verify,
scored with the free-text rule); then writes one Parquet file per seeded table into
``sample_data/chat_rollouts/``: the task, every prompt of the set (train and test), and the
run. About a minute on a 2-core CPU.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pyarrow as pa

from studio.ingest.prompt_sets import PromptSetConfig, add_prompt_set
from studio.queries.prompts import draw_prompts
from studio.runs.generation import GenerateConfig, generate_sync
from studio.store import Store

from . import CHAT_POLICY_DIR, CHAT_ROLLOUTS_DIR, HERE, WORDPROBLEMS_DIR, WORDPROBLEMS_TASK
from .make_rollouts import write_seed

DESCRIPTION = "GSM8K-shaped word problems of the realistic sample world (2 to 4 operations)"


def add_wordproblems(store: Store) -> None:
    """The word problems as the prompt set :data:`~sample_data.WORDPROBLEMS_TASK`."""
    files = [WORDPROBLEMS_DIR / "gsm8k" / "train.jsonl", WORDPROBLEMS_DIR / "gsm8k" / "test.jsonl"]
    add_prompt_set(store, files, PromptSetConfig(name=WORDPROBLEMS_TASK, preset="gsm8k", description=DESCRIPTION))


def _relative(table: pa.Table) -> pa.Table:
    """Source paths inside this repository written relative to it: the seed is the same on every machine."""
    root = str(HERE.parent) + "/"
    cols = {}
    for name in table.column_names:
        col = table.column(name)
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or name in ("spec", "source"):
            col = pa.array([None if v is None else str(v).replace(root, "") for v in col.to_pylist()], pa.string())
        cols[name] = col
    return pa.table(cols)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=CHAT_ROLLOUTS_DIR)
    ap.add_argument("--policy", type=Path, default=CHAT_POLICY_DIR)
    ap.add_argument("--prompts", type=int, default=48)
    ap.add_argument("--group-size", type=int, default=8)
    args = ap.parse_args()

    store = Store.open(":memory:")
    add_wordproblems(store)
    prompts = draw_prompts(store, WORDPROBLEMS_TASK, args.prompts, seed=1, split="test")
    res = generate_sync(store, args.policy, prompts, GenerateConfig(group_size=args.group_size, temperature=1.0,
                                                                    max_new_tokens=128, seed=1),
                        task=WORDPROBLEMS_TASK, name=f"sample rollouts · word problems · {len(prompts)} × "
                                                     f"{args.group_size}", chunk_prompts=8)
    write_seed(store, res, args.out, lambda table, rows: _relative(rows) if table in ("tasks", "runs") else rows)
    acc = store.scalar("SELECT avg(correct::INT) FROM rollouts")
    print(json.dumps({"out": str(args.out), **store.counts(), "accuracy": round(acc, 3)}))


if __name__ == "__main__":
    main()
