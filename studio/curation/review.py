"""Reviewing pairs: the queue a person walks (:func:`queue`, :func:`progress`, :func:`builds`) and
the decisions stored on a pair (:func:`decide`, :func:`accept`, :func:`reject`, :func:`swap`,
:func:`set_note`, :func:`hand_pick`), each with the reviewer and the time.

A decision sets a pair's status (pending / accepted / rejected), its order (a swap reverses
chosen and rejected in exports) or its note; accepted pairs are what
:mod:`studio.curation.writer` writes. The queue shows each pair as it would be exported, with
its staleness (:mod:`studio.curation.stale`).
"""
from __future__ import annotations

import getpass
import hashlib
from collections.abc import Iterable

import pandas as pd

from studio.curation.build import NOT_SPECIAL
from studio.curation.errors import CurationError
from studio.curation.rules import STATUSES
from studio.curation.stale import _stale_sql, _where
from studio.store import Store
from studio.store.records import now


def _reviewer(reviewer: str | None) -> str:
    if reviewer:
        return reviewer
    try:
        return getpass.getuser()
    except Exception:  # no login name (a container without a user entry)
        return "unknown"


def _update(store: Store, set_sql: str, set_params: list, pair_ids: Iterable[str] | None, build_id: str | None,
            status: str | None = None) -> int:
    if pair_ids is None and build_id is None:
        raise CurationError("say which pairs: give pair ids or a build id")
    ids = None if pair_ids is None else list(dict.fromkeys(pair_ids))
    where, params = _where(status, build_id, None, ids)
    with store.transaction() as cur:
        if ids is not None:
            known = cur.execute("SELECT count(*) FROM pairs WHERE list_contains(?, pair_id)", [ids]).fetchall()[0][0]
            if known < len(ids):
                missing = cur.execute("SELECT unnest(?::VARCHAR[]) AS id EXCEPT SELECT pair_id FROM pairs",
                                      [ids]).fetchall()
                raise CurationError(f"{len(ids) - known} pair id(s) are not in this store: "
                                    f"{', '.join(sorted(m[0] for m in missing)[:5])}")
        n = cur.execute(f"UPDATE pairs SET {set_sql} WHERE {where}", set_params + params).fetchall()[0][0]
    return int(n)


def decide(store: Store, status: str, pair_ids: Iterable[str] | None = None, *, build_id: str | None = None,
           reviewer: str | None = None, only_pending: bool = False) -> int:
    """Set the status (pending / accepted / rejected) of the given pairs, or of every pair of
    ``build_id`` (only its pending ones with ``only_pending``). Returns how many changed."""
    if status not in STATUSES:
        raise CurationError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
    return _update(store, "status = ?, reviewer = ?, decided_at = ?", [status, _reviewer(reviewer), now()],
                   pair_ids, build_id, "pending" if only_pending else None)


def accept(store: Store, pair_ids: Iterable[str] | None = None, *, build_id: str | None = None,
           reviewer: str | None = None, only_pending: bool = False) -> int:
    """Accept pairs: they are what :func:`~studio.curation.writer.export` writes."""
    return decide(store, "accepted", pair_ids, build_id=build_id, reviewer=reviewer, only_pending=only_pending)


def reject(store: Store, pair_ids: Iterable[str] | None = None, *, build_id: str | None = None,
           reviewer: str | None = None, only_pending: bool = False) -> int:
    """Reject pairs: kept in the store with the decision, never exported."""
    return decide(store, "rejected", pair_ids, build_id=build_id, reviewer=reviewer, only_pending=only_pending)


def swap(store: Store, pair_ids: Iterable[str], reviewer: str | None = None) -> int:
    """Reverse the preference of pairs (chosen ↔ rejected in exports); a second swap undoes it."""
    return _update(store, "swapped = NOT swapped, reviewer = ?, decided_at = ?", [_reviewer(reviewer), now()],
                   pair_ids, None)


def set_note(store: Store, pair_ids: str | Iterable[str], note: str, reviewer: str | None = None) -> int:
    """Attach a note to pairs ('' clears it); the note travels into the export's provenance."""
    ids = [pair_ids] if isinstance(pair_ids, str) else pair_ids
    return _update(store, "note = ?, reviewer = ?", [note or None, _reviewer(reviewer)], ids, None)


def hand_pick(store: Store, chosen_id: str, rejected_id: str, note: str = "", reviewer: str | None = None,
              rule_version_id: str | None = None, status: str = "accepted") -> str:
    """Store a pair a person picked from the table or the group view; returns its id.

    Both rollouts must answer the same prompt. Fork siblings (a branch and its parent at
    the fork, or two branches of one fork) become a step pair with their shared prefix.
    The rewards kept with it are those of ``rule_version_id`` (default: the newest version
    that scored both). The pair is ``accepted`` unless ``status`` says otherwise; picking a
    stored pair again updates its status and note.
    """
    if status not in STATUSES:
        raise CurationError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
    if chosen_id == rejected_id:
        raise CurationError("a pair needs two different rollouts; the chosen and the rejected one are the same")
    rows = store.df("""SELECT rollout_id, prompt_id, parent_rollout_id, fork_pos, text, n_tokens FROM rollouts
                       WHERE list_contains(?, rollout_id)""", [[chosen_id, rejected_id]]).set_index("rollout_id")
    for rid, side in ((chosen_id, "chosen"), (rejected_id, "rejected")):
        if rid not in rows.index:
            raise CurationError(f"the {side} rollout {rid} is not in this store")
    c, r = rows.loc[chosen_id], rows.loc[rejected_id]
    if c["prompt_id"] != r["prompt_id"]:
        raise CurationError("the two rollouts answer different prompts; a preference pair compares two answers "
                            "to one prompt")
    vid = rule_version_id or store.scalar("""
        SELECT rw.rule_version_id FROM rewards rw JOIN rule_versions v USING (rule_version_id)
        WHERE rw.component = 'total' AND list_contains(?, rw.rollout_id)
        GROUP BY rw.rule_version_id, v.created_at HAVING count(DISTINCT rw.rollout_id) = 2
        ORDER BY v.created_at DESC, 1 LIMIT 1""", [[chosen_id, rejected_id]])
    rw = {} if vid is None else dict(store.df(
        "SELECT rollout_id, value FROM rewards WHERE rule_version_id = ? AND component = 'total' "
        "AND list_contains(?, rollout_id)", [vid, [chosen_id, rejected_id]]).itertuples(index=False))
    same_fork = (pd.notna(c["parent_rollout_id"]) and c["parent_rollout_id"] == r["parent_rollout_id"]
                 and c["fork_pos"] == r["fork_pos"])
    siblings = same_fork or c["parent_rollout_id"] == rejected_id or r["parent_rollout_id"] == chosen_id
    kind, prefix, k = "completion", None, None
    if siblings:
        k, prefix = _common_prefix(store, chosen_id, rejected_id)
        if not (str(c["text"]).startswith(prefix) and str(r["text"]).startswith(prefix)):
            kind, prefix, k = "completion", None, None
        else:
            kind = "step"
    pair_id = "pr" + hashlib.md5(f"{kind}:{chosen_id}:{rejected_id}".encode()).hexdigest()[:16]
    who, at = _reviewer(reviewer), now()
    cr, rr = (None if pd.isna(v) else float(v) for v in (rw.get(chosen_id), rw.get(rejected_id)))
    with store.transaction() as cur:
        if cur.execute("SELECT count(*) FROM pairs WHERE pair_id = ?", [pair_id]).fetchall()[0][0]:
            cur.execute("UPDATE pairs SET status = ?, note = coalesce(?, note), reviewer = ?, decided_at = ? "
                        "WHERE pair_id = ?", [status, note or None, who, at, pair_id])
        else:
            cur.execute("""
                INSERT INTO pairs (pair_id, prompt_id, chosen_rollout_id, rejected_rollout_id, kind, prefix,
                                   prefix_tokens, rule, params, build_id, rule_version_id, chosen_reward,
                                   rejected_reward, margin, status, swapped, note, reviewer, decided_at, created_at,
                                   source)
                VALUES (?, ?, ?, ?, ?, ?, ?, 'hand', '{}', NULL, ?, ?, ?, ?, ?, false, ?, ?, ?, ?, 'hand')""",
                        [pair_id, c["prompt_id"], chosen_id, rejected_id, kind, prefix, k, vid, cr, rr,
                         None if cr is None or rr is None else cr - rr, status, note or None,
                         who if status != "pending" else None, at if status != "pending" else None, at])
    return pair_id


def _common_prefix(store: Store, a: str, b: str) -> tuple[int, str]:
    """(tokens, text) the two rollouts share from the start."""
    row = store.df(f"""
        WITH lcp AS (
            SELECT coalesce(min(ta.pos) FILTER (WHERE ta.token_id IS DISTINCT FROM tb.token_id),
                            least((SELECT count(*) FROM tokens WHERE rollout_id = ?),
                                  (SELECT count(*) FROM tokens WHERE rollout_id = ?))) AS k
            FROM tokens ta JOIN tokens tb ON tb.rollout_id = ? AND tb.pos = ta.pos WHERE ta.rollout_id = ?)
        SELECT lcp.k, coalesce(string_agg(t.token_text, '' ORDER BY t.pos) FILTER (WHERE {NOT_SPECIAL}), '') AS prefix
        FROM lcp LEFT JOIN tokens t ON t.rollout_id = ? AND t.pos < lcp.k GROUP BY lcp.k""", [a, b, b, a, a])
    return (int(row["k"].iloc[0]), str(row["prefix"].iloc[0])) if len(row) else (0, "")


QUEUE_ORDER = "CASE status WHEN 'pending' THEN 0 WHEN 'accepted' THEN 1 ELSE 2 END, created_at, margin DESC, pair_id"


def queue(store: Store, status: str | None = None, build_id: str | None = None, kind: str | None = None,
          limit: int = 50, offset: int = 0) -> pd.DataFrame:
    """A page of the review queue: pending pairs first, then accepted, then rejected.

    One row per pair, as it would be exported (a swap already applied): ``pair_id, status,
    kind, source, rule, build_id, rule_version_id, prompt, prefix, prefix_tokens`` (step pairs: the
    shared start, which a token strip can grey out), ``chosen_rollout_id, rejected_rollout_id,
    chosen_text, rejected_text`` (continuations after the prefix),
    ``chosen_reward, rejected_reward, margin`` (at build time), ``swapped, note, reviewer,
    decided_at, created_at, stale, stale_detail`` and ``chosen_components`` /
    ``rejected_components`` (``{component: value}`` now, under the pair's version).
    """
    where, params = _where(status, build_id, kind)
    sql = _stale_sql(f"SELECT * FROM pairs WHERE {where} ORDER BY {QUEUE_ORDER} LIMIT ? OFFSET ?")
    df = store.df(f"""
        SELECT s.pair_id, s.status, s.kind, s.source, s.rule, s.build_id, s.rule_version_id, pr.text AS prompt,
               s.prefix, s.prefix_tokens,
               CASE WHEN s.swapped THEN s.rejected_rollout_id ELSE s.chosen_rollout_id END AS chosen_rollout_id,
               CASE WHEN s.swapped THEN s.chosen_rollout_id ELSE s.rejected_rollout_id END AS rejected_rollout_id,
               CASE WHEN s.swapped THEN s.r_text ELSE s.c_text END AS chosen_full,
               CASE WHEN s.swapped THEN s.c_text ELSE s.r_text END AS rejected_full,
               CASE WHEN s.swapped THEN s.rejected_reward ELSE s.chosen_reward END AS chosen_reward,
               CASE WHEN s.swapped THEN s.chosen_reward ELSE s.rejected_reward END AS rejected_reward,
               CASE WHEN s.swapped THEN -s.margin ELSE s.margin END AS shown_margin,
               s.swapped, s.note, s.reviewer, s.decided_at, s.created_at, s.stale, s.stale_detail
        FROM ({sql}) s LEFT JOIN prompts pr USING (prompt_id)
        ORDER BY CASE s.status WHEN 'pending' THEN 0 WHEN 'accepted' THEN 1 ELSE 2 END, s.created_at,
                 s.margin DESC, s.pair_id""",
                  params + [int(limit), int(offset)])
    df = df.rename(columns={"shown_margin": "margin"})
    n = df["prefix"].fillna("").str.len()
    for side in ("chosen", "rejected"):
        full = df.pop(f"{side}_full")
        df[f"{side}_text"] = [t[k:] if isinstance(t, str) else None for t, k in zip(full, n, strict=True)]
    comps = store.df("""
        SELECT rw.rollout_id, rw.rule_version_id, rw.component, rw.value FROM rewards rw
        WHERE list_contains(?, rw.rollout_id) AND list_contains(?, rw.rule_version_id) ORDER BY rw.component""",
                     [df["chosen_rollout_id"].tolist() + df["rejected_rollout_id"].tolist(),
                      df["rule_version_id"].dropna().unique().tolist()])
    by: dict[tuple, dict] = {}
    for rid, vid, comp, val in comps.itertuples(index=False):
        by.setdefault((rid, vid), {})[comp] = val
    for side in ("chosen", "rejected"):
        df[f"{side}_components"] = [by.get((r, v), {}) for r, v in
                                    zip(df[f"{side}_rollout_id"], df["rule_version_id"], strict=True)]
    return df


def progress(store: Store, build_id: str | None = None, stale: bool = True) -> dict[str, int]:
    """Counts for the review's progress bar: ``total, pending, accepted, rejected, reviewed``
    and, with ``stale``, ``stale`` (pairs of any status whose rollouts were deleted or
    re-scored: that reads every pair's rewards, about a second for a million pairs)."""
    where, params = _where(None, build_id)
    source = _stale_sql(f"SELECT * FROM pairs WHERE {where}") if stale else f"SELECT * FROM pairs WHERE {where}"
    row = store.df(f"""
        SELECT count(*) AS total, count(*) FILTER (WHERE status = 'pending') AS pending,
               count(*) FILTER (WHERE status = 'accepted') AS accepted,
               count(*) FILTER (WHERE status = 'rejected') AS rejected
               {", count(*) FILTER (WHERE stale IS NOT NULL) AS stale" if stale else ""}
        FROM ({source})""", params, timeout_s=0).iloc[0]
    out = {k: int(v) for k, v in row.items()}
    out["reviewed"] = out["accepted"] + out["rejected"]
    return out


def builds(store: Store) -> pd.DataFrame:
    """Every pair build, newest first, with how many of its pairs are in each status."""
    return store.df("""
        SELECT b.build_id, b.rule, b.level, b.params, b.scope, b.rule_version_id, b.created_at, b.n_pairs,
               count(p.pair_id) FILTER (WHERE p.status = 'pending') AS pending,
               count(p.pair_id) FILTER (WHERE p.status = 'accepted') AS accepted,
               count(p.pair_id) FILTER (WHERE p.status = 'rejected') AS rejected
        FROM pair_builds b LEFT JOIN pairs p USING (build_id)
        GROUP BY ALL ORDER BY b.created_at DESC, b.build_id""")
