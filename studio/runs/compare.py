"""Two policies on the same tokens: teacher-force stored rollouts through policy B into ``token_scores``.

:func:`studio.queries.forks.entropy_changes` reads back where B's entropy moved most.
"""
from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from pathlib import Path

import numpy as np
import pandas as pd

from studio import workers
from studio.store import Store
from studio.tasks import seen_prompt
from studio.workers.sync import run_sync
from studio.workers.vocab import check_policy


async def score_with(store: Store, policy_path: str | Path, rollout_ids: list[str],
                     executor: Executor | None = None, batch: int = 64) -> str:
    """Teacher-force the stored rollouts through another policy and keep its per-token
    logprob and entropy in ``token_scores`` (once per rollout and policy version).

    Returns the policy version. Rollouts already scored by that version are skipped.
    """
    folder, backend = await check_policy(policy_path)
    version = backend.version if backend is not None else workers.policy_version(str(folder))
    done = set(store.df("SELECT DISTINCT rollout_id FROM token_scores WHERE policy_version = ? "
                        "AND list_contains(?, rollout_id)", [version, rollout_ids])["rollout_id"])
    todo = [r for r in rollout_ids if r not in done]
    executor = executor or workers.pool()
    for lo in range(0, len(todo), batch):
        ids = todo[lo:lo + batch]
        rows = store.df("""SELECT ro.rollout_id, ro.prompt_text, p.text AS prompt, p.messages,
                                  list(t.token_id ORDER BY t.pos) AS token_ids
                           FROM rollouts ro JOIN prompts p USING (prompt_id) JOIN tokens t USING (rollout_id)
                           WHERE list_contains(?, ro.rollout_id) GROUP BY ALL""", [ids])
        rows["prompt"] = [seen_prompt(*x) for x in zip(rows["prompt_text"], rows["prompt"], rows["messages"],
                                                       strict=True)]
        fut = executor.submit(workers.score_job, str(folder), rows["prompt"].tolist(),
                              [[int(i) for i in x] for x in rows["token_ids"]])
        gens, _, _ = await asyncio.wrap_future(fut)
        frame = pd.DataFrame({
            "rollout_id": np.repeat(rows["rollout_id"].to_numpy(), [g.n_tokens for g in gens]),
            "pos": np.concatenate([np.arange(g.n_tokens) for g in gens]) if gens else [],
            "policy_version": version,
            "logprob": np.concatenate([g.logprobs for g in gens]) if gens else [],
            "entropy": np.concatenate([g.entropies for g in gens]) if gens else [],
        })
        store.write({"token_scores": frame})
    return version


def score_with_sync(*args, **kwargs) -> str:
    """:func:`score_with` from synchronous code."""
    return run_sync(score_with, *args, **kwargs)
