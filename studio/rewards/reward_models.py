"""Reward-model scores as a reward version: ``rm-<folder>@<weights hash>``, one ``total`` per rollout.

A sequence-classification folder (``AutoModelForSequenceClassification``) scores prompt +
completion in the model worker (:mod:`backends.reward_model`); the sigmoid of its single
logit is stored like a rule version's reward, so it can be shown, diffed, compared with a
rule (:mod:`studio.rewards.diagnostics`) and read by a rule as ``ctx[name]``
(:func:`studio.rewards.rules.apply_rule`'s ``sources``).
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

from studio import queries
from studio.rewards.rules import ApplyResult, _scope_rows, _write_version
from studio.store import Store
from studio.workers.sync import run_sync


async def score_with_reward_model(store: Store, rm_path: str | Path, scope: queries.RolloutFilter | None = None,
                                  note: str = "", batch: int = 256) -> ApplyResult:
    """Score rollouts with a sequence-classification reward model (in the model worker) and
    store the scores as a version ``rm-<folder>@<weights hash>`` with one component, ``total``.

    The version can be shown, diffed and compared like a rule's, and a rule can read it as
    ``ctx[name]`` (:func:`~studio.rewards.rules.apply_rule`'s ``sources``). Everything is written in one transaction.
    """
    from backends import check_policy_folder
    from studio import workers

    folder = Path(rm_path).expanduser().resolve()
    check_policy_folder(folder)
    t0 = time.perf_counter()
    ex = workers.pool()
    first = await asyncio.wrap_future(ex.submit(_rm_version, str(folder)))
    vid = f"rm-{first}"
    rows = _scope_rows(store, vid, scope)
    if rows.empty:
        return ApplyResult(vid, "unchanged", message="every rollout in scope is already scored by this reward model")
    from backends.reward_model import rm_score_job

    scores: list[float] = []
    for lo in range(0, len(rows), batch):
        part = rows.iloc[lo:lo + batch]
        s, _ = await asyncio.wrap_future(ex.submit(rm_score_job, str(folder), part["prompt"].tolist(),
                                                   part["completion"].tolist()))
        scores.extend(s)
    rewards = [(rid, "total", float(v), None) for rid, v in zip(rows["rollout_id"], scores, strict=False)]
    source = (f"# reward model {folder}\n# {first}: AutoModelForSequenceClassification on prompt + completion;\n"
              "# the reward is the sigmoid of its single logit "
              "(the model's probability that the completion is right)\n")
    _write_version(store, vid, vid.split("@")[0], source, note or "reward model", rewards, [])
    return ApplyResult(vid, "done", scored=len(rows), seconds=time.perf_counter() - t0)


def _rm_version(path: str) -> str:
    """Runs in a worker: ``<folder>@<weights hash>`` of a reward model."""
    from backends.reward_model import reward_model_version

    return reward_model_version(path)


def score_with_reward_model_sync(*args, **kwargs) -> ApplyResult:
    """:func:`score_with_reward_model` from synchronous code."""
    return run_sync(score_with_reward_model, *args, **kwargs)
