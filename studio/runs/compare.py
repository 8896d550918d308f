"""Two policies on the same tokens: teacher-force stored rollouts through policy B into ``token_scores``.

The teacher forcing is :func:`studio.runs.rescore.rescore`'s (one way into ``token_scores``);
:func:`studio.queries.forks.entropy_changes` reads back where B's entropy moved most.
"""
from __future__ import annotations

from concurrent.futures import Executor
from pathlib import Path

from studio.runs.rescore import rescore
from studio.store import Store
from studio.workers.sync import run_sync


async def score_with(store: Store, policy_path: str | Path, rollout_ids: list[str],
                     executor: Executor | None = None, batch: int = 64) -> str:
    """Teacher-force the stored rollouts through another policy (in its default precision) and
    keep its per-token logprob, entropy and rank in ``token_scores`` (once per rollout and policy
    version), as a Rescore does.

    Returns the policy version. Rollouts already scored by that version are skipped.
    """
    report = await rescore(store, policy_path, rollout_ids, precision="auto", executor=executor, batch=batch)
    return report.policy_version


def score_with_sync(*args, **kwargs) -> str:
    """:func:`score_with` from synchronous code."""
    return run_sync(score_with, *args, **kwargs)
