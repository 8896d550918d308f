"""Rescore: teacher-force stored rollouts through a chosen policy and precision.

The recomputed (train) side of the training–inference mismatch: each stored rollout's tokens are
forced through ``policy`` (a folder, loaded at ``precision``, or a backend URL) in the worker pool
(``workers.score_job``), and per token its log-prob, entropy and rank (1 = the policy's argmax)
are kept:

- every rescoring goes to ``token_scores`` (its ``policy_version`` and ``engine``), once per
  rollout and version: a policy in bfloat16 has the version ``folder@hash~bfloat16``, so two
  precisions are two sources;
- the first recomputation of a rollout also fills ``tokens.train_logprob`` / ``train_rank`` and
  ``rollouts.train_policy_version`` / ``train_engine`` (nothing is overwritten: a later rescore
  only adds ``token_scores`` rows). Tool tokens (``trained = false``) get no train log-prob.

A rollout without behaviour statistics (an import without log-probs) is enriched instead
(:mod:`studio.runs.enrich`), so Rescore covers Enrich. A policy whose tokenizer reads the stored
token ids as another text is refused with a :class:`RescoreError` naming the rollout and the
policy, and nothing of that batch is stored. Each batch is written in one transaction.
"""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from backends.device import PRECISIONS
from studio import workers
from studio.errors import StudioError
from studio.runs.enrich import enrich, needs_enrich
from studio.store import Store
from studio.tasks import seen_prompt
from studio.workers.vocab import check_policy


class RescoreError(StudioError, ValueError):
    """The rescoring policy cannot read a stored rollout's tokens (another tokenizer)."""


@dataclass
class RescoreReport:
    """What a rescore did: the source it wrote (``policy_version`` + ``engine``) and its counts."""
    policy_version: str
    engine: str = ""
    rescored: int = 0  # rollouts written to token_scores
    enriched: int = 0  # rollouts without statistics, enriched instead
    filled: int = 0  # rollouts whose tokens.train_logprob this rescore set (their first recomputation)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (rollout_id, why): already scored, unscorable
    seconds: float = 0.0

    def summary(self) -> str:
        """One line for a person: what was written, under which source."""
        return (f"rescored {self.rescored} rollouts with {self.policy_version} ({self.engine}): train log-probs "
                f"filled for {self.filled}, {self.enriched} enriched, {len(self.skipped)} skipped")


def _rows(store: Store, ids: list[str]) -> pd.DataFrame:
    rows = store.df("""
        SELECT ro.rollout_id, ro.prompt_text, p.text AS prompt, p.messages, ro.train_policy_version,
               list(t.token_id ORDER BY t.pos) AS token_ids, list(t.token_text ORDER BY t.pos) AS token_texts,
               list(coalesce(t.trained, true) ORDER BY t.pos) AS trained
        FROM rollouts ro JOIN prompts p USING (prompt_id) JOIN tokens t USING (rollout_id)
        WHERE list_contains(?, ro.rollout_id) GROUP BY ALL ORDER BY ro.rollout_id""", [ids])
    rows["prompt"] = [seen_prompt(*x) for x in zip(rows["prompt_text"], rows["prompt"], rows["messages"], strict=True)]
    return rows


def _frame(rows: pd.DataFrame, gens: list, version: str) -> pd.DataFrame:
    """token_scores rows of a batch, with ``trained`` kept for the train_logprob fill."""
    n = [g.n_tokens for g in gens]
    return pd.DataFrame({
        "rollout_id": np.repeat(rows["rollout_id"].to_numpy(), n),
        "pos": np.concatenate([np.arange(k, dtype=np.int32) for k in n]),
        "policy_version": version,
        "logprob": np.concatenate([g.logprobs for g in gens]).astype(np.float32),
        "entropy": np.concatenate([g.entropies for g in gens]).astype(np.float32),
        "engine": np.repeat([g.engine or None for g in gens], n),
        "rank": np.concatenate([g.ranks if g.ranks is not None else np.full(g.n_tokens, -1) for g in gens]),
    }).astype({"rank": "Int32"}).replace({"rank": {-1: pd.NA}})


def _write(store: Store, frame: pd.DataFrame, first: list[str], version: str, engine: str) -> None:
    """One batch in one transaction: its token_scores rows, and for the rollouts in ``first``
    (never recomputed before) tokens.train_logprob / train_rank and the rollouts' train source."""
    with store.transaction() as cur:
        store.write({"token_scores": frame}, cur)
        if not first:
            return
        store.unshard(first, cur)  # rows in a bulk import's Parquet shard: into token_rows, to be updated
        fill = frame[frame["rollout_id"].isin(first)][["rollout_id", "pos", "logprob", "rank"]]
        cur.register("_rescore_fill", fill)
        try:  # first recomputation wins; a tool response's tokens (not trained) get none
            cur.execute("""UPDATE token_rows t SET
                               train_logprob = CASE WHEN coalesce(t.trained, true) THEN f.logprob END,
                               train_rank = CASE WHEN coalesce(t.trained, true) THEN f.rank END
                           FROM _rescore_fill f
                           WHERE t.rollout_id = f.rollout_id AND t.pos = f.pos AND t.train_logprob IS NULL""")
            cur.execute("""UPDATE rollouts SET train_policy_version = ?, train_engine = ?
                           WHERE list_contains(?, rollout_id) AND train_policy_version IS NULL""",
                        [version, engine or None, first])
        finally:
            cur.unregister("_rescore_fill")


async def rescore(store: Store, policy: str | Path, rollout_ids: list[str], precision: str = "float32",
                  executor: Executor | None = None, batch: int = 64) -> RescoreReport:
    """Teacher-force ``rollout_ids`` through ``policy`` at ``precision`` (see the module docstring).

    ``precision`` is one of ``backends.device.PRECISIONS``; a backend URL scores in the server's own.
    Rollouts already rescored by the same version are skipped, so rescoring twice writes nothing new.

    Raises:
        PolicyLoadError: ``policy`` is not a model folder, or a backend URL that does not answer.
        RescoreError: the policy's tokenizer does not read a rollout's token ids as its texts
            (that batch is not stored; earlier batches are).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    t0 = time.perf_counter()
    folder, backend = await check_policy(policy)
    executor = executor or workers.pool()
    report = RescoreReport(policy_version="")
    ids = list(dict.fromkeys(rollout_ids))
    bare = needs_enrich(store, rollout_ids=ids)
    if len(bare):  # no behaviour statistics: enrich fills them (its version is the policy's at full precision)
        enriched = await enrich(store, policy, rollout_ids=bare["rollout_id"].tolist(), executor=executor,
                                batch=batch)
        report.enriched, report.skipped = enriched.n_rollouts, list(enriched.skipped)
        ids = [r for r in ids if r not in set(bare["rollout_id"])]
    for lo in range(0, len(ids), batch):
        rows = _rows(store, ids[lo:lo + batch])
        fut = executor.submit(workers.score_job, str(folder), rows["prompt"].tolist(),
                              [[int(i) for i in x] for x in rows["token_ids"]], precision,
                              [[str(x) for x in t] for t in rows["token_texts"]])
        gens, version, _ = await asyncio.wrap_future(fut)
        report.policy_version = version
        report.engine = next((g.engine for g in gens if not isinstance(g, str)), report.engine)
        for r, g in zip(rows.itertuples(index=False), gens, strict=True):
            if isinstance(g, str):
                raise RescoreError(f"rollout {r.rollout_id} cannot be rescored by the policy {policy}: {g}; its "
                                   "tokenizer is not the one that made the rollout")
        done = set(store.df("SELECT DISTINCT rollout_id FROM token_scores WHERE policy_version = ? "
                            "AND list_contains(?, rollout_id)", [version, rows["rollout_id"].tolist()])["rollout_id"])
        keep = [i for i, r in enumerate(rows["rollout_id"]) if r not in done]
        report.skipped += [(r, f"already rescored by {version}") for r in rows["rollout_id"] if r in done]
        if not keep:
            continue
        rows, gens = rows.iloc[keep].reset_index(drop=True), [gens[i] for i in keep]
        first = [r.rollout_id for r in rows.itertuples(index=False) if r.train_policy_version is None
                 or pd.isna(r.train_policy_version)]
        _write(store, _frame(rows, gens, version), first, version, report.engine)
        report.rescored += len(rows)
        report.filled += len(first)
    if not report.policy_version:
        report.policy_version = backend.version if backend is not None else workers.policy_version(str(folder))
    report.seconds = time.perf_counter() - t0
    return report


def rescore_sync(*args, **kwargs) -> RescoreReport:
    """:func:`rescore` from synchronous code (scripts, notebooks, the CLI)."""
    from studio.workers.sync import run_sync

    return run_sync(rescore, *args, **kwargs)
