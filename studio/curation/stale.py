"""Staleness of stored pairs: a pair is *stale* when one of its rollouts is gone ('deleted') or its
total reward under the pair's version is no longer the one it was built with ('rescored').

:func:`_stale_sql` wraps a selection of pairs with that verdict (and the rollouts' texts, runs
and policies, read on the way); :func:`stale_pairs` lists the stale ones. The review
(:mod:`studio.curation.review`) flags them and :mod:`studio.curation.writer` refuses them.
:func:`_where`, the condition that picks stored pairs by status, build, kind or id, is shared
with the review.
"""
from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from studio.curation.errors import CurationError
from studio.curation.rules import LEVELS, STATUSES
from studio.store import Store


def _stale_sql(pairs_sql: str) -> str:
    """Rows of ``pairs_sql`` (pairs columns) with ``stale``: NULL, 'deleted' or 'rescored', and
    ``stale_detail`` saying which rollout and what changed; and, read on the way, both
    rollouts' ``c_text`` / ``r_text``, ``c_run`` / ``r_run`` and ``c_policy`` / ``r_policy``
    (as built: before a swap)."""
    return f"""
        WITH ps AS ({pairs_sql}),
        ids AS (SELECT chosen_rollout_id AS rid, rule_version_id AS vid FROM ps WHERE rule_version_id IS NOT NULL
                UNION SELECT rejected_rollout_id, rule_version_id FROM ps WHERE rule_version_id IS NOT NULL),
        cur AS (SELECT rw.rollout_id, rw.rule_version_id, min(rw.value) AS lo, max(rw.value) AS hi,
                       count(rw.value) AS n
                FROM rewards rw JOIN ids ON ids.rid = rw.rollout_id AND ids.vid = rw.rule_version_id
                WHERE rw.component = 'total' GROUP BY ALL),
        j AS (
            SELECT ps.*, c.rollout_id IS NULL AS c_gone, r.rollout_id IS NULL AS r_gone,
                   ps.rule_version_id IS NOT NULL AND NOT (
                       (ps.chosen_reward IS NULL AND coalesce(cc.n, 0) = 0)
                       OR (cc.lo IS NOT NULL AND abs(cc.lo - ps.chosen_reward) <= 1e-12
                           AND abs(cc.hi - ps.chosen_reward) <= 1e-12)) AS c_changed,
                   ps.rule_version_id IS NOT NULL AND NOT (
                       (ps.rejected_reward IS NULL AND coalesce(rc.n, 0) = 0)
                       OR (rc.lo IS NOT NULL AND abs(rc.lo - ps.rejected_reward) <= 1e-12
                           AND abs(rc.hi - ps.rejected_reward) <= 1e-12)) AS r_changed,
                   cc.lo AS c_now, rc.lo AS r_now, c.text AS c_text, r.text AS r_text, c.run_id AS c_run,
                   r.run_id AS r_run, c.policy_version AS c_policy, r.policy_version AS r_policy
            FROM ps LEFT JOIN rollouts c ON c.rollout_id = ps.chosen_rollout_id
            LEFT JOIN rollouts r ON r.rollout_id = ps.rejected_rollout_id
            LEFT JOIN cur cc ON cc.rollout_id = ps.chosen_rollout_id AND cc.rule_version_id = ps.rule_version_id
            LEFT JOIN cur rc ON rc.rollout_id = ps.rejected_rollout_id AND rc.rule_version_id = ps.rule_version_id)
        SELECT * EXCLUDE (c_gone, r_gone, c_changed, r_changed, c_now, r_now),
               CASE WHEN c_gone OR r_gone THEN 'deleted' WHEN c_changed OR r_changed THEN 'rescored' END AS stale,
               CASE WHEN c_gone OR r_gone THEN concat_ws(' and ',
                        CASE WHEN c_gone THEN 'chosen rollout ' || chosen_rollout_id END,
                        CASE WHEN r_gone THEN 'rejected rollout ' || rejected_rollout_id END) || ' deleted'
                    WHEN c_changed OR r_changed THEN concat_ws('; ',
                        CASE WHEN c_changed THEN 'chosen reward ' || coalesce(chosen_reward::VARCHAR, 'none')
                             || ' is now ' || coalesce(c_now::VARCHAR, 'none') END,
                        CASE WHEN r_changed THEN 'rejected reward ' || coalesce(rejected_reward::VARCHAR, 'none')
                             || ' is now ' || coalesce(r_now::VARCHAR, 'none') END) || ' under ' || rule_version_id
               END AS stale_detail
        FROM j"""


def _where(status: str | None = None, build_id: str | None = None, kind: str | None = None,
           pair_ids: Iterable[str] | None = None) -> tuple[str, list]:
    conds, params = [], []
    if status is not None:
        if status not in STATUSES:
            raise CurationError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
        conds.append("status = ?")
        params.append(status)
    if build_id is not None:
        conds.append("build_id = ?")
        params.append(build_id)
    if kind is not None:
        if kind not in LEVELS:
            raise CurationError(f"kind must be one of {', '.join(LEVELS)}, got {kind!r}")
        conds.append("kind = ?")
        params.append(kind)
    if pair_ids is not None:
        conds.append("list_contains(?, pair_id)")
        params.append(list(pair_ids))
    return (" AND ".join(conds) or "TRUE"), params


def stale_pairs(store: Store, status: str | None = "accepted", build_id: str | None = None,
                pair_ids: Iterable[str] | None = None) -> pd.DataFrame:
    """Pairs (accepted ones by default) that can no longer be exported as built:
    ``pair_id, status, stale`` ('deleted' / 'rescored') and ``stale_detail``."""
    where, params = _where(status, build_id, None, pair_ids)
    sql = _stale_sql(f"SELECT * FROM pairs WHERE {where}")
    return store.df(f"SELECT pair_id, status, stale, stale_detail FROM ({sql}) WHERE stale IS NOT NULL "
                    "ORDER BY pair_id", params, timeout_s=0)
