"""Held-out evaluation of a policy, from the owner: :func:`evaluate` submits
:func:`studio.runs.training.evaluate_job` to the worker pool and awaits it."""
from __future__ import annotations

import asyncio
from pathlib import Path

from studio import workers
from studio.runs.training import evaluate_job, heldout_prompts
from studio.tasks import get_task
from studio.workers.vocab import resolve_policy


async def evaluate(policy_path: str | Path, n_prompts: int = 200, k: int = 4, task: str = "arithmetic",
                   max_new_tokens: int = 40, seed: int = 0) -> dict:
    """Accuracy, pass@k, greedy accuracy, mean length and entropy of a policy on the
    held-out prompts (in the worker pool)."""
    the_task = get_task(task)
    prompts = [{"text": p.text, "gold": p.gold} for p in heldout_prompts(the_task, n_prompts)]
    fut = workers.pool().submit(evaluate_job, str(resolve_policy(policy_path)), prompts, the_task.name, k,
                                max_new_tokens, seed)
    return await asyncio.wrap_future(fut)
