"""Training–inference mismatch read from the store: the sources of recomputed log-probs, one
rollout's tokens with Δ (the strip's ``mismatch`` channel and its hover) and per-rollout sequence
summaries over a scope, all computed in DuckDB with the SQL twins of :mod:`studio.signals.mismatch`.

A **source** names the recomputed log-prob: ``""`` is the stored ``tokens.train_logprob`` (the
scale path: one column scan), any other value a ``token_scores.policy_version`` joined on
``(rollout_id, pos)`` (for small scopes: a rollout, a group, a run). A **scope** is one rollout id
(str), a list of rollout ids, a :class:`~studio.queries.table.RolloutFilter` (its run, group,
training step, branch, prompt-text and row conditions; not its reward range) or None (the store).
Tool tokens (``trained = false``) are left out of every Δ here: the sampler did not generate them.
"""
from __future__ import annotations

import pandas as pd

from studio.queries.table import RolloutFilter, _row_conditions, _whole_group_conditions
from studio.signals.mismatch import Correction, delta_sql, rejected_sql, sequence_aggregates_sql
from studio.store import Store

Scope = RolloutFilter | list[str] | str | None


def scope_sql(scope: Scope) -> tuple[str | None, list]:
    """``SELECT rollout_id`` of the rollouts in ``scope`` and its values; None for the whole store."""
    if scope is None:
        return None, []
    if isinstance(scope, str):
        return "SELECT ?::VARCHAR AS rollout_id", [scope]
    if not isinstance(scope, RolloutFilter):
        return "SELECT unnest(?::VARCHAR[]) AS rollout_id", [list(scope)]
    groups, params = _whole_group_conditions(scope)
    rows, rparams = _row_conditions(scope)
    conds = groups + rows
    params = params + rparams
    if scope.prompt_contains:
        conds.append("ro.prompt_id IN (SELECT prompt_id FROM prompts WHERE contains(lower(text), lower(?)))")
        params.append(scope.prompt_contains.strip())
    if conds == ["TRUE"]:
        return None, []
    return f"SELECT ro.rollout_id FROM rollouts ro WHERE {' AND '.join(conds)}", params


def token_rows_sql(scope: Scope, source: str = "", trained_only: bool = True,
                   extra: str = "") -> tuple[str, list]:
    """SELECT of the scope's tokens with ``rollout_id, pos, logprob, train_logprob, d`` (Δ, NULL where
    either log-prob is missing), ``entropy``, ``trained`` and ``extra`` (more ``t.`` columns, with a
    leading comma), and its values. ``source`` picks the recomputed side (see the module doc)."""
    ids, params = scope_sql(scope)
    where = [f"t.rollout_id IN ({ids})"] if ids else []
    if trained_only:
        where.append("coalesce(t.trained, true)")
    if source:
        train, join = "s.logprob", ("JOIN token_scores s ON s.rollout_id = t.rollout_id AND s.pos = t.pos "
                                     "AND s.policy_version = ?")
        params = [source] + params
    else:
        train, join = "t.train_logprob", ""
    sql = (f"SELECT t.rollout_id, t.pos, t.logprob, {train} AS train_logprob, "
           f"{delta_sql(train, 't.logprob')} AS d, t.entropy, t.trained{extra} "
           f"FROM tokens t {join} WHERE {' AND '.join(where) or 'TRUE'}")
    return sql, params


def mismatch_sources(store: Store, run_id: str | None = None) -> pd.DataFrame:
    """The recomputed log-prob sources (of one run, or the store): ``source`` (``""``: the stored
    column), ``policy_version`` and ``engine`` that produced it, ``rollouts`` and ``tokens`` with
    both log-probs. The stored column has a row per (train_policy_version, train_engine) of its
    rollouts; each ``token_scores`` source with log-probs one row per engine."""
    run = "AND ro.run_id = ?" if run_id else ""
    params = [run_id] if run_id else []
    stored = store.df(f"""
        SELECT '' AS source, ro.train_policy_version AS policy_version, ro.train_engine AS engine,
               count(DISTINCT t.rollout_id) AS rollouts, count(*) AS tokens
        FROM tokens t JOIN rollouts ro ON ro.rollout_id = t.rollout_id
        WHERE t.train_logprob IS NOT NULL AND t.logprob IS NOT NULL {run}
        GROUP BY ALL ORDER BY rollouts DESC""", params)
    scored = store.df(f"""
        SELECT s.policy_version AS source, s.policy_version, s.engine,
               count(DISTINCT s.rollout_id) AS rollouts, count(*) AS tokens
        FROM token_scores s JOIN rollouts ro ON ro.rollout_id = s.rollout_id
        WHERE s.logprob IS NOT NULL {run}
        GROUP BY ALL ORDER BY s.policy_version, s.engine""", params)
    return pd.concat([stored, scored], ignore_index=True)


def sources(store: Store, run_id: str | None = None) -> list[str]:
    """The ``token_scores`` sources with log-probs (``""``, the stored column, not included)."""
    return sorted({s for s in mismatch_sources(store, run_id)["source"] if s})


def has_recomputed(store: Store) -> bool:
    """Whether any token has a recomputed log-prob (the stored column or a ``token_scores`` source)."""
    return bool(store.scalar("""SELECT EXISTS (SELECT 1 FROM tokens WHERE train_logprob IS NOT NULL)
                                OR EXISTS (SELECT 1 FROM token_scores WHERE logprob IS NOT NULL)"""))


def rollout_mismatch(store: Store, rollout_id: str, source: str = "") -> pd.DataFrame:
    """One rollout's tokens in ``pos`` order: ``pos, token_text, logprob, train_logprob, delta,
    ratio, k3`` (NaN without Δ), ``rank`` (the token's place in the sampler's top-k, 1 = its argmax;
    NA: beyond the top-k or no top-k stored), ``train_rank`` (under the recomputation; NA: unknown),
    ``entropy``, ``trained``. Tool tokens are kept (their Δ is NaN)."""
    src = store.tokens_between(rollout_id, rollout_id)
    if source:
        train, rank = "s.logprob", "s.rank"
        join = "LEFT JOIN token_scores s ON s.rollout_id = t.rollout_id AND s.pos = t.pos AND s.policy_version = ?"
        params = [source, rollout_id]
    else:
        train, rank, join, params = "t.train_logprob", "t.train_rank", "", [rollout_id]
    d = delta_sql(train, "t.logprob")
    df = store.df(f"""
        SELECT t.pos, t.token_text, t.logprob, {train} AS train_logprob, {d} AS delta,
               exp({d}) AS ratio, exp({d}) - 1 - {d} AS k3,
               CASE WHEN t.topk_ids IS NOT NULL THEN nullif(list_position(t.topk_ids, t.token_id), 0) END AS rank,
               {rank} AS train_rank, t.entropy, t.trained
        FROM {src} t {join} WHERE t.rollout_id = ? ORDER BY t.pos""", params)
    for col in ("rank", "train_rank"):
        df[col] = df[col].astype("Int64")
    for col in ("logprob", "train_logprob", "delta", "ratio", "k3"):
        df[col] = df[col].astype("float64")
    return df


def sequence_summaries_sql(scope: Scope, source: str = "",
                           correction: Correction | None = None) -> tuple[str, list]:
    """SQL of :func:`sequence_summaries` and its values."""
    rows, params = token_rows_sql(scope, source)
    rejected = rejected_sql(correction) if correction is not None else "false"
    sql = f"""SELECT rollout_id, *, {rejected} AS rejected FROM (
                 SELECT rollout_id, {sequence_aggregates_sql('d')} FROM ({rows}) x
                 WHERE d IS NOT NULL GROUP BY rollout_id)"""
    return sql.replace("SELECT rollout_id, *,", "SELECT *,", 1), params


def sequence_summaries(store: Store, scope: Scope, source: str = "",
                       correction: Correction | None = None) -> pd.DataFrame:
    """Per rollout of ``scope`` with Δ: ``rollout_id, n, delta_sum, delta_mean, geo_ratio,
    max_abs_delta, k1, k2, k3`` (the means per token of :func:`studio.signals.mismatch.sequence_stats`)
    and ``rejected`` under the sequence-level ``correction`` (False for token-level ones or None).
    Rollouts without Δ have no row; rows in ``rollout_id`` order."""
    sql, params = sequence_summaries_sql(scope, source, correction)
    return store.df(f"{sql} ORDER BY rollout_id", params)
