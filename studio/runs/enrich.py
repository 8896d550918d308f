"""Enrich imported rollouts: fill in what the source lacked by teacher-forcing a policy.

Training frameworks log text and scores; most do not log token ids, log-probs or entropy.
Enriching runs a chosen policy over each stored prompt + completion in the worker pool
(``workers.enrich_job``, teacher forcing) and fills in, per rollout:

- no token rows at all: the completion is tokenized by the policy (with its end-of-sequence
  token when the rollout's finish reason is ``stop``) and every token row is written (id,
  text, log-prob, entropy, top-k), with ``rollouts.n_tokens`` and ``rollouts.enriched_by``
  (the policy version) set;
- token rows with ids: the ids are forced as they are, and only the NULL columns
  (log-prob, entropy, top-k) are filled, so a source's own log-probs are never replaced;
- token rows with texts but no ids: filled only when the policy's tokenizer splits the
  completion into exactly those token texts; otherwise the rollout is skipped, with the
  reason.

Log-probs from teacher forcing are the enriching policy's, not the behaviour policy's:
``enriched_by`` says so wherever the views show them. Each batch is written in its own
transaction, so a cancel or a dead worker keeps the batches already done and never a
half-written rollout.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from studio import workers
from studio.store import Store
from studio.tasks import seen_prompt
from studio.workers.vocab import check_policy


@dataclass
class EnrichReport:
    policy_version: str
    n_rollouts: int = 0  # rollouts enriched
    n_tokens: int = 0  # token rows written or filled
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (rollout_id, why)
    cancelled: bool = False
    seconds: float = 0.0


def _scope_sql(run_id: str | None, rollout_ids: list[str] | None) -> tuple[str, list]:
    if rollout_ids is not None:
        return "list_contains(?, ro.rollout_id)", [list(rollout_ids)]
    if run_id is not None:
        return "ro.run_id = ?", [run_id]
    return "TRUE", []


def needs_enrich(store: Store, run_id: str | None = None, rollout_ids: list[str] | None = None,
                 limit: int | None = None) -> pd.DataFrame:
    """Rollouts of the scope lacking token rows, ids, log-probs or entropy, with what they lack
    (``missing``: ``tokens`` | ``ids`` | ``stats``). A tool response's tokens (not trained) have no
    statistics by design: they lack nothing."""
    cond, params = _scope_sql(run_id, rollout_ids)
    lim = f"LIMIT {int(limit)}" if limit else ""
    return store.df(f"""
        WITH t AS (SELECT t.rollout_id, count(*) AS n, count(t.token_id) AS n_ids,
                          count(*) FILTER (WHERE coalesce(t.trained, true)) AS n_own,
                          count(t.logprob) AS n_lp, count(t.entropy) AS n_ent
                   FROM tokens t WHERE t.rollout_id IN (SELECT ro.rollout_id FROM rollouts ro WHERE {cond})
                   GROUP BY t.rollout_id)
        SELECT ro.rollout_id, CASE WHEN t.n IS NULL THEN 'tokens' WHEN t.n_ids < t.n THEN 'ids' ELSE 'stats' END
                   AS missing
        FROM rollouts ro LEFT JOIN t USING (rollout_id)
        WHERE {cond} AND (t.n IS NULL OR t.n_ids < t.n OR t.n_lp < t.n_own OR t.n_ent < t.n_own)
        ORDER BY ro.rollout_id {lim}""", params + params)


def runs_to_enrich(store: Store, limit: int = 200) -> pd.DataFrame:
    """Runs with their rollout count and how many have no token rows (``bare``), those with
    bare rollouts first (newest first within each)."""
    return store.df("""
        SELECT r.run_id, any_value(r.name) AS name, any_value(r.kind) AS kind, count(ro.rollout_id) AS n,
               count(ro.rollout_id) FILTER (WHERE ro.n_tokens IS NULL) AS bare, any_value(r.created_at) AS created_at
        FROM runs r JOIN rollouts ro USING (run_id) GROUP BY r.run_id
        ORDER BY bare > 0 DESC, created_at DESC LIMIT ?""", [int(limit)])


def _batch_rows(store: Store, ids: list[str]) -> pd.DataFrame:
    rows = store.df("""
        SELECT ro.rollout_id, ro.prompt_text, p.text AS prompt, p.messages, ro.text AS completion, ro.finish_reason,
               list(t.token_id ORDER BY t.pos) FILTER (WHERE t.pos IS NOT NULL) AS token_ids,
               list(t.token_text ORDER BY t.pos) FILTER (WHERE t.pos IS NOT NULL) AS token_texts,
               count(t.pos) AS n
        FROM rollouts ro JOIN prompts p USING (prompt_id) LEFT JOIN tokens t USING (rollout_id)
        WHERE list_contains(?, ro.rollout_id)
        GROUP BY ro.rollout_id, ro.prompt_text, p.text, p.messages, ro.text, ro.finish_reason
        ORDER BY ro.rollout_id""", [ids])
    rows["prompt"] = [seen_prompt(*x) for x in zip(rows["prompt_text"], rows["prompt"], rows["messages"], strict=True)]
    return rows


def _token_frame(rid: str, g) -> dict:
    n = g.n_tokens
    return {
        "rollout_id": [rid] * n, "pos": np.arange(n, dtype=np.int32),
        "token_id": np.asarray(g.token_ids, np.int32), "token_text": list(g.token_texts),
        "logprob": g.logprobs.astype(np.float32), "entropy": g.entropies.astype(np.float32),
        "topk_ids": [list(map(int, r)) for r in g.topk_ids],
        "topk_logprobs": [list(map(float, r)) for r in g.topk_logprobs],
    }


def _table(cols: dict[str, list]) -> pa.Table:
    return pa.table({
        "rollout_id": pa.array(cols["rollout_id"], pa.string()), "pos": pa.array(cols["pos"], pa.int32()),
        "token_id": pa.array(cols["token_id"], pa.int32()), "token_text": pa.array(cols["token_text"], pa.string()),
        "logprob": pa.array(cols["logprob"], pa.float32()), "entropy": pa.array(cols["entropy"], pa.float32()),
        "topk_ids": pa.array(cols["topk_ids"], pa.list_(pa.int32())),
        "topk_logprobs": pa.array(cols["topk_logprobs"], pa.list_(pa.float32())),
    })


def _concat(frames: list[dict]) -> dict[str, list]:
    out: dict[str, list] = {k: [] for k in ("rollout_id", "pos", "token_id", "token_text", "logprob", "entropy",
                                            "topk_ids", "topk_logprobs")}
    for f in frames:
        for k in out:
            out[k].extend(list(f[k]))
    return out


async def enrich(store: Store, policy_path: str | Path, run_id: str | None = None,
                 rollout_ids: list[str] | None = None, executor: Executor | None = None, batch: int = 64,
                 progress: Callable[[int, int], None] | None = None,
                 cancel: threading.Event | None = None) -> EnrichReport:
    """Fill in token ids, log-probs, entropy and top-k of the scope's rollouts under ``policy_path``.

    The scope is ``rollout_ids``, else ``run_id``, else every rollout. Returns what was done;
    rollouts that need nothing are left alone, so enriching twice writes nothing new.

    Raises:
        PolicyLoadError: ``policy_path`` is not a model folder, or a backend URL that does not
            answer (nothing written).
    """
    t0 = time.perf_counter()
    folder, backend = await check_policy(policy_path)
    version = backend.version if backend is not None else workers.policy_version(str(folder))
    report = EnrichReport(policy_version=version)
    todo = needs_enrich(store, run_id, rollout_ids)
    kinds = dict(zip(todo["rollout_id"], todo["missing"], strict=False))
    ids = todo["rollout_id"].tolist()
    executor = executor or workers.pool()
    for lo in range(0, len(ids), batch):
        if cancel is not None and cancel.is_set():
            report.cancelled = True
            break
        rows = _batch_rows(store, ids[lo:lo + batch])
        completions = []
        for r in rows.itertuples(index=False):
            kind = kinds[r.rollout_id]
            if kind == "stats":
                completions.append([int(i) for i in r.token_ids])
            else:
                completions.append(r.completion or "")
        expect = [int(r.n) if kinds[r.rollout_id] == "ids" else None for r in rows.itertuples(index=False)]
        stopped = [r.finish_reason == "stop" and kinds[r.rollout_id] == "tokens" for r in rows.itertuples(index=False)]
        fut = executor.submit(workers.enrich_job, str(folder), rows["prompt"].tolist(), completions, expect, stopped)
        gens, _, _ = await asyncio.wrap_future(fut)
        new, fill, enriched = [], [], []
        for r, g in zip(rows.itertuples(index=False), gens, strict=False):
            kind = kinds[r.rollout_id]
            if isinstance(g, str):  # the worker could not score it (too long for the policy): say why
                report.skipped.append((r.rollout_id, g))
                continue
            if kind == "tokens":
                new.append(_token_frame(r.rollout_id, g))
            elif kind == "ids" and all(x is None for x in r.token_texts):
                report.skipped.append((r.rollout_id, "the imported tokens have neither ids nor texts: the policy's "
                                                     "tokens cannot be lined up with them"))
                continue
            elif kind == "ids" and [str(x) for x in r.token_texts] != list(g.token_texts):
                report.skipped.append((r.rollout_id, f"the policy splits this completion into {g.n_tokens} tokens, "
                                                     f"the imported rollout has {r.n} different ones"))
                continue
            else:
                fill.append(_token_frame(r.rollout_id, g))
            enriched.append((r.rollout_id, g.n_tokens))
        with store.transaction() as cur:
            if new:  # another enrich of the same rollouts may have written them since they were read
                have = {x[0] for x in cur.execute("SELECT DISTINCT rollout_id FROM tokens WHERE list_contains(?, "
                                                  "rollout_id)", [[f["rollout_id"][0] for f in new if f["rollout_id"]]]
                                                  ).fetchall()}
                new = [f for f in new if not (f["rollout_id"] and f["rollout_id"][0] in have)]
                if new:
                    store.write({"tokens": _table(_concat(new))}, cur)
            if fill:
                filled = [f["rollout_id"][0] for f in fill if f["rollout_id"]]
                store.unshard(filled, cur)  # rows in a bulk import's Parquet shard: into token_rows, to be updated
                cur.register("_enrich_fill", _table(_concat(fill)))
                try:  # a source's own values win: only NULLs are filled; a tool response's tokens get no statistics
                    cur.execute("""UPDATE token_rows t SET token_id = coalesce(t.token_id, f.token_id),
                                       logprob = CASE WHEN coalesce(t.trained, true) THEN coalesce(t.logprob, f.logprob) END,
                                       entropy = CASE WHEN coalesce(t.trained, true) THEN coalesce(t.entropy, f.entropy) END,
                                       topk_ids = CASE WHEN coalesce(t.trained, true) THEN coalesce(t.topk_ids, f.topk_ids) END,
                                       topk_logprobs = CASE WHEN coalesce(t.trained, true)
                                                       THEN coalesce(t.topk_logprobs, f.topk_logprobs) END
                                   FROM _enrich_fill f WHERE t.rollout_id = f.rollout_id AND t.pos = f.pos""")
                finally:
                    cur.unregister("_enrich_fill")
            if enriched:
                done = pd.DataFrame(enriched, columns=["rollout_id", "n_tokens"])
                cur.register("_enrich_done", done)
                try:
                    cur.execute("""UPDATE rollouts SET n_tokens = coalesce(rollouts.n_tokens, d.n_tokens),
                                       enriched_by = ? FROM _enrich_done d WHERE rollouts.rollout_id = d.rollout_id""",
                                [version])
                finally:
                    cur.unregister("_enrich_done")
        report.n_rollouts += len(enriched)
        report.n_tokens += sum(n for _, n in enriched)
        if progress is not None:
            progress(min(lo + batch, len(ids)), len(ids))
    report.seconds = time.perf_counter() - t0
    return report


def enrich_sync(*args, **kwargs) -> EnrichReport:
    """:func:`enrich` from synchronous code (scripts, notebooks)."""
    from studio.workers.sync import run_sync

    return run_sync(enrich, *args, **kwargs)
