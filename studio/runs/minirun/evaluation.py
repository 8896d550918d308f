"""Held-out evaluation of a policy, from the owner: :func:`evaluate` submits
:func:`studio.runs.training.evaluate_job` to the worker pool and awaits it; :func:`evaluate_run`
evaluates a mini-run's last checkpoint and stores the figures as its ``heldout/*`` metrics (the
Mini-runs tab's comparison shows them side by side)."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pandas as pd

from studio import workers
from studio.queries.prompts import draw_prompts
from studio.runs.minirun.reads import last_checkpoint
from studio.runs.training import (
    MiniRunConfig,
    TrainConfigError,
    evaluate_job,
    heldout_prompts,
    heldout_split,
    with_task_defaults,
)
from studio.store import Store
from studio.tasks import get_task
from studio.workers.vocab import resolve_policy


async def evaluate(policy_path: str | Path, n_prompts: int = 200, k: int = 4, task: str = "arithmetic",
                   max_new_tokens: int | None = None, seed: int = 0, store: Store | None = None,
                   max_turns: int | None = None) -> dict:
    """Accuracy, pass@k, greedy accuracy, mean length and entropy of a policy on the
    held-out prompts (in the worker pool): the sample task's held-out draw, or a stored
    prompt set's test split (``store`` holds it), judged by the task's verifier. On an agent
    task the samples are trajectories (tool calls and failed calls per trajectory added).
    ``max_new_tokens`` / ``max_turns``: None, a mini-run's defaults for the task."""
    the_task = get_task(task)
    budgets = with_task_defaults(MiniRunConfig(), the_task)
    max_new_tokens = budgets.max_new_tokens if max_new_tokens is None else max_new_tokens
    max_turns = budgets.max_turns if max_turns is None else max_turns
    if the_task.generates:
        held = heldout_prompts(the_task, n_prompts)
    else:
        if store is None:
            raise TrainConfigError(f"task {the_task.name!r} keeps its prompts in a store: give the store to evaluate on")
        held = draw_prompts(store, the_task.name, n_prompts, seed=0, split=heldout_split(the_task))
    fut = workers.pool().submit(evaluate_job, str(resolve_policy(policy_path)), [p.to_json() for p in held],
                                the_task.spec, k, max_new_tokens, seed, max_turns)
    return await asyncio.wrap_future(fut)


HELDOUT = "heldout/"  # the metrics' prefix: heldout/accuracy, heldout/pass@4, … at the step of the evaluated checkpoint


def heldout_metrics(run_id: str, step: int, result: dict) -> pd.DataFrame:
    """An evaluation's figures (:func:`~studio.runs.training.evaluate_job`'s dict) as metric rows of ``run_id``
    at ``step``: ``heldout/<figure>``."""
    return pd.DataFrame([{"run_id": run_id, "train_step": int(step), "name": f"{HELDOUT}{k}", "value": float(v)}
                         for k, v in result.items()])


async def evaluate_run(store: Store, run_id: str, n_prompts: int = 200) -> dict:
    """Evaluate a mini-run's last checkpoint on the held-out prompts of its task (:func:`evaluate`) and
    store the figures as its ``heldout/*`` metrics at that step; returns them. Raises
    :class:`TrainConfigError` when the run has no checkpoint on disk."""
    last = last_checkpoint(store, run_id)
    if last is None:
        raise TrainConfigError(f"run {run_id!r} has no checkpoint on disk to evaluate")
    task = store.scalar("SELECT task FROM runs WHERE run_id = ?", [run_id]) or "arithmetic"
    result = await evaluate(last[1], n_prompts=n_prompts, task=task, store=store)
    with store.transaction() as cur:  # a later evaluation of the same step replaces the earlier one
        cur.execute("DELETE FROM metrics WHERE run_id = ? AND train_step = ? AND starts_with(name, ?)",
                    [run_id, last[0], HELDOUT])
        store.write({"metrics": heldout_metrics(run_id, last[0], result)}, cur=cur)
    return result
