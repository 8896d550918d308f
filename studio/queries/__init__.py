"""Read queries: small builders that return SQL plus bound values, and thin runners.

User values are always bound parameters, never formatted into SQL. Advantages are
computed in the query with window functions over the *unfiltered* groups, so filtering
the table never changes a rollout's advantage.
"""
from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np
import pandas as pd

from studio.signals.advantages import (
    EQUAL_TOL,
    GROUP_STATS,
    SEQUENCE_FNS,
    Credit,
    estimator_sql,
    from_stats_sql,
    group_stats_sql,
    whiten,
)
from studio.store import Store
from studio.tasks import Prompt

MAX_TABLE_ROWS = 5000
T = TypeVar("T")


@dataclass(frozen=True)
class RolloutFilter:
    """What the rollout table shows. ``None`` means no constraint."""

    run_id: str | None = None
    prompt_contains: str | None = None
    correct: bool | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    group_id: str | None = None
    branches_of: str | None = None  # only branches of this rollout, at any depth
    train_step: int | None = None  # only rollouts sampled at this training step (mini-runs)
    limit: int = MAX_TABLE_ROWS


def versions_sql(rule_version_id: str | None, scope: str = "TRUE") -> tuple[str, list]:
    """``(rollout_id, rule_version_id)``: which rule version's rewards to show per rollout.

    ``None`` means each rollout's most recent scoring, so a newer rule that scored only new
    rollouts never blanks out older ones; a given id shows every rollout under that version.
    ``scope`` is a condition on ``rollouts ro`` limiting which rollouts are looked at; it
    appears once in the SQL (callers bind its values after the returned ones).
    """
    if rule_version_id is not None:
        return f"SELECT ro.rollout_id, ?::VARCHAR AS rule_version_id FROM rollouts ro WHERE {scope}", [rule_version_id]
    return (f"""SELECT rw.rollout_id, arg_max(rw.rule_version_id, v.created_at) AS rule_version_id
               FROM {_scoped_rewards(scope)} JOIN rule_versions v USING (rule_version_id)
               WHERE rw.component = 'total'
               GROUP BY rw.rollout_id""", [])


def _scoped_rewards(scope: str, narrow: bool = True) -> str:
    """``rewards rw`` limited to the rollouts of ``scope`` (a FROM item; ``scope`` appears once).

    ``narrow`` (the scope's rollouts were made close together: a group, a run, the newest
    page): the scope's ids are read once and their range (min, max) becomes a filter that
    DuckDB applies inside the rewards scan, row by row. Ids sort in the order they were
    made, so the scan skips the row groups of other rollouts and decodes only the rows in
    range (one group's ~30 reward rows, not the ~250,000 of the row groups holding them).
    Otherwise (rollouts scattered over the store, e.g. every run's prompts containing some
    text) a plain join: DuckDB then reads every reward row but builds its hash table on the
    scope's ids, where the range form would build it on the (many) reward rows in range.
    """
    if scope.strip() == "TRUE":
        return "rewards rw"
    if not narrow:
        return f"(SELECT ro.rollout_id FROM rollouts ro WHERE {scope}) sro JOIN rewards rw ON rw.rollout_id = sro.rollout_id"
    return f"""(WITH sro AS MATERIALIZED (SELECT ro.rollout_id FROM rollouts ro WHERE {scope})
                SELECT rw.* FROM rewards rw
                WHERE rw.rollout_id BETWEEN (SELECT min(rollout_id) FROM sro) AND (SELECT max(rollout_id) FROM sro)
                  AND rw.rollout_id IN (SELECT rollout_id FROM sro)) rw"""


def picked_sql(rule_version_id: str | None, scope: str = "TRUE", scope_params: list | None = None,
               components: bool = False, narrow: bool = True) -> tuple[str, list]:
    """``(rollout_id, rule_version_id, reward, accuracy)`` of the scope's rollouts that have
    rewards under the version :func:`versions_sql` picks, in one pass over ``rewards``.

    The same as :func:`versions_sql` joined to the ``total`` and ``accuracy`` rows, but the
    rewards are read once instead of three times: one GROUP BY gathers each (rollout,
    version) pair's ``total`` and ``accuracy``, then the newest version with a ``total`` wins.
    With ``components``, also ``comps``: every component of the picked version as a list of
    ``{'c': name, 'v': value}`` in name order (see :func:`components`). ``narrow``: see
    :func:`_scoped_rewards`.
    """
    pair = """max(rw.value) FILTER (WHERE rw.component = 'total') AS reward,
              max(rw.value) FILTER (WHERE rw.component = 'accuracy') AS accuracy"""
    if components:
        pair += ",\n              list({'c': rw.component, 'v': rw.value} ORDER BY rw.component) AS comps"
    which = "TRUE" if components else "rw.component IN ('total', 'accuracy')"
    params = list(scope_params or [])
    if rule_version_id is not None:
        return (f"""SELECT rw.rollout_id, any_value(rw.rule_version_id) AS rule_version_id, {pair}
                    FROM {_scoped_rewards(scope, narrow)}
                    WHERE {which} AND rw.rule_version_id = ?
                    GROUP BY rw.rollout_id""", params + [rule_version_id])
    k = ", 'k': pv.comps" if components else ""
    return (f"""SELECT rollout_id, _p.v AS rule_version_id, _p.r AS reward, _p.a AS accuracy{", _p.k AS comps" if components else ""}
                FROM (SELECT pv.rollout_id,
                             arg_max({{'v': pv.rule_version_id, 'r': pv.reward, 'a': pv.accuracy{k}}}, v.created_at) AS _p
                      FROM (SELECT rw.rollout_id, rw.rule_version_id, {pair},
                                   bool_or(rw.component = 'total') AS _has_total
                            FROM {_scoped_rewards(scope, narrow)}
                            WHERE {which}
                            GROUP BY rw.rollout_id, rw.rule_version_id) pv
                      JOIN rule_versions v USING (rule_version_id)
                      WHERE pv._has_total
                      GROUP BY pv.rollout_id)""", params)


SCORED_COLUMNS = ("ro.rollout_id, ro.run_id, ro.group_id, ro.prompt_id, ro.sample_idx, ro.text, ro.n_tokens, "
                  "ro.finish_reason, ro.created_at, ro.train_step, ro.parent_rollout_id, ro.fork_pos, "
                  "ro.forced_token_id")


def scored_rollouts_sql(rule_version_id: str | None = None, scope: str = "TRUE",
                        scope_params: list | None = None, credit: Credit | None = None,
                        components: bool = False, narrow: bool = True) -> tuple[str, list]:
    """Rollouts with total reward, accuracy and advantage (see :func:`versions_sql`).

    ``scope`` (a condition on ``rollouts ro`` with ``scope_params``) must keep or drop
    whole groups, like ``ro.group_id = ?`` or ``ro.run_id = ?``: advantages are computed
    over what it keeps (REINFORCE++ whitens over whole batches, so its scope is widened to
    the runs the scope touches and the rows cut back to the scope afterwards).

    ``credit`` picks the estimator (GRPO when None). Token-level estimators give the
    advantage of the first token here: KL in the reward, A_0 = G_0 - mean_g G_0 with
    G_0 = R - β·Σ_t (log π - log π_ref); GAE, A_0 = Σ_t (γλ)^t δ_t. Either is NULL for a
    rollout whose reference log-probs or values are not all stored.

    ``components`` adds ``_components``, the shown version's components of each rollout as
    ``[{'c': name, 'v': value}, …]`` (read in the same pass over the rewards). ``narrow``:
    how the scope's rewards are read (see :func:`_scoped_rewards`); the result is the same.
    """
    credit = credit or Credit()
    scope_params = list(scope_params or [])
    key = credit.estimator
    inner, inner_params = scope, scope_params
    if key == "reinforce_pp":
        inner = f"ro.run_id IN (SELECT ro.run_id FROM rollouts ro WHERE {scope})"
    picked, params = picked_sql(rule_version_id, inner, inner_params, components, narrow)
    ctes = [f"picked AS ({picked})"]
    rv = "pk.rule_version_id"
    if rule_version_id is not None:  # every rollout shows the version asked for, scored by it or not
        rv = "?::VARCHAR"
        params.append(rule_version_id)
    ctes.append(f"""scored AS (
            SELECT {SCORED_COLUMNS}, {rv} AS rule_version_id,
                   pk.reward, pk.accuracy{", pk.comps AS _components" if components else ""}{
                   ", (" + scope + ") AS _in_scope" if key == "reinforce_pp" else ""}
            FROM rollouts ro
            LEFT JOIN picked pk ON pk.rollout_id = ro.rollout_id
            WHERE {inner})""")
    if key == "reinforce_pp":
        params += scope_params
    params += inner_params
    if key == "kl":
        ctes.append("""kl AS (
            SELECT t.rollout_id, sum(t.logprob - sc.logprob) AS kl_sum, count(sc.logprob) = count(*) AS complete
            FROM tokens t LEFT JOIN token_scores sc ON sc.rollout_id = t.rollout_id AND sc.pos = t.pos
                 AND sc.policy_version = ?
            WHERE t.rollout_id IN (SELECT rollout_id FROM scored) GROUP BY t.rollout_id)""")
        params.append(credit.reference or "")
        ctes.append(f"""g0 AS (
            SELECT s.*, CASE WHEN kl.complete THEN s.reward - {float(credit.beta)!r} * kl.kl_sum END AS _g0
            FROM scored s LEFT JOIN kl USING (rollout_id))""")
        final = "SELECT * EXCLUDE (_g0), _g0 - avg(_g0) OVER (PARTITION BY group_id) AS advantage FROM g0"
    elif key == "gae":
        gl = float(credit.gamma) * float(credit.lam)
        ctes.append("""v AS (
            SELECT rollout_id, pos, value,
                   lead(value, 1, 0.0) OVER (PARTITION BY rollout_id ORDER BY pos) AS v_next
            FROM token_scores WHERE policy_version = ? AND rollout_id IN (SELECT rollout_id FROM scored))""")
        params.append(credit.values or "")
        ctes.append(f"""a0 AS (
            SELECT rollout_id, sum(pow({gl!r}, pos) * ({float(credit.gamma)!r} * v_next - value)) AS part,
                   max(pos) AS last, count(value) AS n
            FROM v GROUP BY rollout_id)""")
        final = (f"SELECT s.*, CASE WHEN a0.n = s.n_tokens THEN a0.part + pow({gl!r}, a0.last) * s.reward END "
                 "AS advantage FROM scored s LEFT JOIN a0 USING (rollout_id)")
    elif key == "reinforce_pp":
        pre, expr = estimator_sql(key)
        ctes.append(f"pre AS (SELECT *{pre} FROM scored)")
        final = f"SELECT * EXCLUDE (_a, _in_scope) FROM (SELECT *, {expr} AS advantage FROM pre) WHERE _in_scope"
    else:  # GRPO, Dr. GRPO, RLOO (and token estimators' fallback, GRPO): one GROUP BY joined back
        ctes.append(f"gs AS (SELECT group_id, {group_stats_sql()} FROM scored GROUP BY group_id)")
        final = (f"SELECT s.*, {from_stats_sql(key if key in GROUP_STATS else 'grpo', 's.reward')} AS advantage "
                 "FROM scored s JOIN gs USING (group_id)")
    return "WITH " + ",\n".join(ctes) + "\n" + final, params


GROUP_OF = "ro.group_id = (SELECT group_id FROM rollouts WHERE rollout_id = ?)"

# rollout ids of every branch below one rollout (one bound parameter: the rollout id)
DESCENDANTS = """
    WITH RECURSIVE down(rid, depth) AS (
        SELECT rollout_id, 1 FROM rollouts WHERE parent_rollout_id = ?
        UNION ALL
        SELECT c.rollout_id, down.depth + 1 FROM down JOIN rollouts c ON c.parent_rollout_id = down.rid
        WHERE down.depth < 100)
    SELECT rid FROM down"""


# a page without a reward filter or sort is cut from the rollouts first and only its groups are scored,
# however far down it is; a limit above this asks for (nearly) every row, so the scope is scored directly
PAGE_FIRST_MAX = 100_000


def _table_order(ro: str, p: str) -> str:
    """The table's order: newest first, then prompt text, group, sample, id (``ro``: rollout alias,
    ``p``: prompt). The id last: rows that tie on the rest (branches) keep their place across pages."""
    return f"{ro}.created_at DESC, {p}.text, {ro}.group_id, {ro}.sample_idx, {ro}.rollout_id"


def _whole_group_conditions(f: RolloutFilter) -> tuple[list[str], list]:
    """The conditions of ``f`` on ``rollouts ro`` that keep or drop whole groups, and their values."""
    conds, params = ["TRUE"], []
    if f.run_id:  # run and group filters keep whole groups: safe to apply before the window
        conds.append("ro.run_id = ?"); params.append(f.run_id)
    if f.group_id:
        conds.append("ro.group_id = ?"); params.append(f.group_id)
    if f.train_step is not None:  # a group is sampled within one step: whole groups again
        conds.append("ro.train_step = ?"); params.append(int(f.train_step))
    if f.branches_of:  # a branch request is one whole group, so this keeps whole groups too
        conds.append(f"ro.rollout_id IN ({DESCENDANTS})"); params.append(f.branches_of)
    return conds, params


# the table's columns it can be sorted by -> their SQL over the scored rows ``s`` and prompts ``p``
TABLE_SORTS = {"prompt": "p.text", "completion": "s.text", "reward": "s.reward", "advantage": "s.advantage",
               "correct": "(s.accuracy >= 1)", "n_tokens": "s.n_tokens", "fork_pos": "s.fork_pos",
               "created_at": "s.created_at"}
# the sorts that do not depend on rewards, over the rollouts ``ro``: their pages are cut from the rollouts
# alone, as the newest-first page is, and only the page's groups are scored
ROLLOUT_SORTS = {k: TABLE_SORTS[k].replace("s.", "ro.") for k in ("prompt", "completion", "n_tokens", "fork_pos",
                                                                   "created_at")}


def rollout_table_sql(rule_version_id: str | None, f: RolloutFilter, credit: Credit | None = None,
                      offset: int = 0, sort: tuple[str, bool] | None = None, count: bool = False) -> tuple[str, list]:
    """The rollout table's rows for filter ``f``: newest first (or by ``sort``: a column of
    :data:`TABLE_SORTS` and whether descending, then newest first), at most ``f.limit`` of them
    after skipping ``offset`` (a page further down, cut in DuckDB).

    Filters that keep or drop whole groups (run, group, training step, branches; the prompt
    text, as "groups with a row whose prompt contains it") narrow the rollouts before any
    reward is read: advantages are computed over whole groups, so they are the same as over
    the unfiltered store. Without a correctness or reward filter the rows shown do not
    depend on rewards, so the page is ordered and cut in DuckDB from ``rollouts`` alone and
    only its groups are scored (a 1M-rollout store scores ~5,000 rollouts, not a million).

    With ``count``, where the whole scope is scored (:func:`scores_scope`), each row also carries
    ``_total``: how many rows the filter keeps over all pages, counted in the same pass
    (``count(*) OVER ()``, before the page is cut).
    """
    ctes, cparams = [], []
    groups, sparams = _whole_group_conditions(f)
    scope, rows = list(groups), list(groups)  # what is scored; which of those rows are shown
    if f.prompt_contains:
        # contains(), not LIKE: a typed % or _ is a character, not a wildcard; matched once for every scan
        ctes.append("matched AS MATERIALIZED (SELECT prompt_id FROM prompts WHERE contains(lower(text), lower(?)))")
        cparams.append(f.prompt_contains.strip())
        rows.append("ro.prompt_id IN (SELECT prompt_id FROM matched)")
        # a group's completions share one prompt; asked per group all the same, so a group whose rows
        # disagree is still scored whole, as without the filter
        scope.append(f"ro.group_id IN (SELECT ro.group_id FROM rollouts ro WHERE {' AND '.join(groups)} "
                     "AND ro.prompt_id IN (SELECT prompt_id FROM matched))")
    on_rewards, wparams = [], []
    if f.correct is True:
        on_rewards.append("s.accuracy >= 1")
    elif f.correct is False:
        on_rewards.append("coalesce(s.accuracy, 0) < 1")
    if f.reward_min is not None:
        on_rewards.append("s.reward >= ?"); wparams.append(float(f.reward_min))
    if f.reward_max is not None:
        on_rewards.append("s.reward <= ?"); wparams.append(float(f.reward_max))
    # a prompt text alone picks rollouts from all over the store: their ids span it (see _scoped_rewards)
    narrow = not (f.prompt_contains and groups == ["TRUE"])
    shown = " AND ".join(rows)
    order = _table_order("s", "p")
    if sort is not None:
        column, descending = sort
        if column not in TABLE_SORTS:
            raise ValueError(f"cannot sort the rollout table by {column!r}; by one of {', '.join(TABLE_SORTS)}")
        order = f"{TABLE_SORTS[column]} {'DESC' if descending else 'ASC'} NULLS LAST, {order}"
    # a page cut from the rollouts first (only its groups are scored) unless the rows shown or their
    # order depend on rewards, or every row is asked for
    paged = not scores_scope(f, sort)
    if not paged:
        cond, skip = " AND ".join(scope), int(offset)
        sparams = sparams + sparams if f.prompt_contains else sparams  # the groups' conditions twice
        where = ["s.prompt_id IN (SELECT prompt_id FROM matched)"] if f.prompt_contains else []
        where += on_rewards
    elif sort is not None:  # by a column of the rollouts: the page is cut from them alone
        column, descending = sort
        ctes.append(f"""page AS MATERIALIZED (
            SELECT ro.rollout_id, ro.group_id FROM rollouts ro JOIN prompts p USING (prompt_id) JOIN runs r USING (run_id)
            WHERE {shown}
            ORDER BY {ROLLOUT_SORTS[column]} {'DESC' if descending else 'ASC'} NULLS LAST, {_table_order("ro", "p")}
            LIMIT ? OFFSET ?)""")
        cparams += sparams + [int(f.limit), int(offset)]
        narrow = False  # the page's rows come from all over the filter: their ids span it
    else:  # newest first
        # `cut`: the creation time of the page's last row. Rows made before it cannot be on the page, so
        # prompt texts are joined only to the newest rows, and the scans skip older row groups (creation
        # times rise with them). It is found from the rollouts alone (`cut0`, a top-N on one column), then
        # checked: if fewer than a page of them have their prompt and run rows, no cut is made. Rows
        # without a creation time sort last and are always looked at.
        n = int(f.limit) + int(offset)  # rows up to the page's last
        keep = f"{shown} AND ro.prompt_id IN (SELECT prompt_id FROM prompts) AND ro.run_id IN (SELECT run_id FROM runs)"
        ctes += [f"cut0 AS (SELECT ro.created_at FROM rollouts ro WHERE {shown} ORDER BY ro.created_at DESC LIMIT 1 OFFSET ?)",
                 f"""cut AS (SELECT CASE WHEN (SELECT count(*) FROM rollouts ro
                                          WHERE {keep} AND ro.created_at >= (SELECT created_at FROM cut0)) >= ?
                                    THEN (SELECT created_at FROM cut0) END AS created_at)""",
                 f"""page AS MATERIALIZED (
            SELECT ro.rollout_id, ro.group_id FROM (
                SELECT * FROM rollouts ro
                WHERE {shown} AND ro.created_at >= coalesce((SELECT created_at FROM cut), '-infinity'::TIMESTAMP)
                UNION ALL
                SELECT * FROM rollouts ro WHERE {shown} AND ro.created_at IS NULL) ro
            JOIN prompts p USING (prompt_id) JOIN runs r USING (run_id)
            ORDER BY {_table_order("ro", "p")} LIMIT ? OFFSET ?)"""]
        cparams += sparams + [max(n - 1, 0)] + sparams + [n] + sparams + sparams + [int(f.limit), int(offset)]
    if paged:
        # the page's groups, whole: group ids sort in the order they were made, so (when the page's rows were
        # made close together) their range is a filter DuckDB applies inside the scan; the IN keeps exactly them
        cond = " AND ".join(groups)
        if narrow:
            cond += " AND ro.group_id BETWEEN (SELECT min(group_id) FROM page) AND (SELECT max(group_id) FROM page)"
        cond += " AND ro.group_id IN (SELECT group_id FROM page)"
        where, skip = ["s.rollout_id IN (SELECT rollout_id FROM page)"], 0  # the page holds just its rows
    base, params = scored_rollouts_sql(rule_version_id, cond, sparams, credit, narrow=narrow)
    total = ", count(*) OVER () AS _total" if count and not paged else ""
    sql = f"""{"WITH " + ", ".join(ctes) if ctes else ""}
        SELECT s.rollout_id, p.text AS prompt, s.text AS completion, s.reward, s.advantage,
               s.accuracy >= 1 AS correct, s.n_tokens, s.finish_reason, r.name AS run,
               s.group_id, s.sample_idx, s.created_at, s.fork_pos, s.parent_rollout_id{total}
        FROM ({base}) s
        JOIN prompts p USING (prompt_id)
        JOIN runs r USING (run_id)
        {"WHERE " + " AND ".join(where) if where else ""}
        ORDER BY {order}
        LIMIT ? OFFSET ?
    """
    return sql, cparams + params + wparams + [int(f.limit), skip]


def rollout_table(store: Store, f: RolloutFilter = RolloutFilter(), rule_version_id: str | None = None,
                  credit: Credit | None = None, offset: int = 0, sort: tuple[str, bool] | None = None) -> pd.DataFrame:
    return store.df(*rollout_table_sql(rule_version_id, f, credit, offset, sort))


def scores_scope(f: RolloutFilter, sort: tuple[str, bool] | None = None) -> bool:
    """Whether :func:`rollout_table` scores every row under ``f`` before it cuts the page: the rows
    shown or their order depend on rewards, or (nearly) every row is asked for. Otherwise the page
    is cut from the rollouts first and only its groups are scored."""
    return _keeps_by_reward(f) or (sort is not None and sort[0] not in ROLLOUT_SORTS) or f.limit > PAGE_FIRST_MAX


def _keeps_by_reward(f: RolloutFilter) -> bool:
    """Whether which rows ``f`` keeps depends on rewards (a correctness or reward condition)."""
    return f.correct is not None or f.reward_min is not None or f.reward_max is not None


def rollout_table_counted(store: Store, f: RolloutFilter = RolloutFilter(), rule_version_id: str | None = None,
                          credit: Credit | None = None, offset: int = 0,
                          sort: tuple[str, bool] | None = None) -> tuple[pd.DataFrame, int | None]:
    """:func:`rollout_table`'s page, and how many rows ``f`` keeps over all its pages where the page
    came from scoring the whole scope (:func:`scores_scope`) and is not empty: counted in the same
    pass, where :func:`rollout_table_count` would score the scope again (a 1M-rollout store: the
    count cost as much as the page). None: ask :func:`rollout_table_count` (from ``rollouts`` alone
    when nothing depends on rewards)."""
    df = store.df(*rollout_table_sql(rule_version_id, f, credit, offset, sort, count=True))
    if "_total" not in df.columns:
        return df, None
    total = df.pop("_total")
    return df, (int(total.iloc[0]) if len(df) else None)


def rollout_table_count(store: Store, f: RolloutFilter = RolloutFilter(), rule_version_id: str | None = None,
                        credit: Credit | None = None) -> int:
    """How many rows :func:`rollout_table` has under ``f`` over all its pages (``f.limit`` aside).

    Without a correctness or reward condition the rows do not depend on rewards, so they are
    counted from ``rollouts`` alone (a 1M-rollout store counts in milliseconds); with one, the
    filter's scope is scored, as a page under that filter is.
    """
    if not _keeps_by_reward(f):
        conds, params = _whole_group_conditions(f)
        if f.prompt_contains:  # contains(), as the table matches: % and _ are characters
            conds.append("contains(lower(p.text), lower(?))"); params.append(f.prompt_contains.strip())
        return int(store.scalar(f"""SELECT count(*) FROM rollouts ro JOIN prompts p USING (prompt_id)
                                    JOIN runs r USING (run_id) WHERE {' AND '.join(conds)}""", params))
    sql, params = rollout_table_sql(rule_version_id, replace(f, limit=1 << 62), credit)
    return int(store.scalar(f"SELECT count(*) FROM ({sql})", params))


def rollout(store: Store, rollout_id: str, rule_version_id: str | None = None,
            credit: Credit | None = None) -> dict | None:
    """One rollout with its prompt, reward, advantage and reward components (None when it is not in
    the store): its row of :func:`scored_group`, the values :func:`scored_rollouts_sql` gives it."""
    row = scored_group(store, rollout_id, rule_version_id, credit).row(rollout_id)
    return None if row is None else dict(row)


def _components_dict(items) -> dict[str, float]:
    """``{component: value}`` from a ``_components`` cell of :func:`scored_rollouts_sql` (NULL values
    as NaN, as :func:`components` gives them)."""
    if not hasattr(items, "__len__"):  # NULL: no components (None or pd.NA)
        return {}
    return {it["c"]: float("nan") if it["v"] is None else float(it["v"]) for it in items}


def components(store: Store, rollout_ids: list[str], rule_version_id: str | None = None) -> dict[str, dict[str, float]]:
    """``{rollout_id: {component: value}}``, each rollout under the version :func:`versions_sql` picks."""
    if not rollout_ids:
        return {}
    # ids as a joined list (not list_contains per row): DuckDB pushes their range into the scans
    ids = "ro.rollout_id IN (SELECT unnest(?::VARCHAR[]))"
    versions, params = versions_sql(rule_version_id, ids)
    df = store.df(f"""
        WITH versions AS ({versions})
        SELECT rw.rollout_id, rw.component, rw.value FROM versions ve
        JOIN rewards rw ON ve.rollout_id = rw.rollout_id AND ve.rule_version_id = rw.rule_version_id
        ORDER BY rw.component""", params + [list(rollout_ids)])
    out: dict[str, dict[str, float]] = {}
    for rid, comp, val in df.itertuples(index=False):
        out.setdefault(rid, {})[comp] = val
    return out


def reward_bounds(store: Store) -> tuple[float, float]:
    """Smallest and largest total reward in the store (0, 1 when there is none)."""
    lo, hi = store.cursor().execute(
        "SELECT coalesce(min(value), 0), coalesce(max(value), 1) FROM rewards WHERE component = 'total'").fetchone()
    return float(lo), float(hi)


def rollout_count(store: Store) -> int:
    return int(store.scalar("SELECT count(*) FROM rollouts"))


TOKEN_COLUMNS = "pos, token_id, token_text, logprob, entropy, topk_ids, topk_logprobs, step_idx"


def tokens(store: Store, rollout_id: str) -> pd.DataFrame:
    """The rollout's tokens in order with their statistics (top-k alternatives as ids)."""
    # ordered here, not by ORDER BY: a rollout's tokens are written in order, so they mostly come back
    # in order, and DuckDB's sort costs a millisecond even on a hundred rows
    df = _small_df(store, f"SELECT {TOKEN_COLUMNS} FROM {store.tokens_between(rollout_id, rollout_id)} "
                   "WHERE rollout_id = ?", [rollout_id])
    if not df["pos"].is_monotonic_increasing:
        df = df.sort_values("pos", kind="stable", ignore_index=True)
    return df


def _small_df(store: Store, sql: str, params: list) -> pd.DataFrame:
    """A read as :meth:`Store.df` returns it, built from DuckDB's numpy arrays: for a point read,
    pandas' conversion inside ``.df()`` takes longer than the read (~4 ms of one rollout's ~9).
    The dtypes and NULLs are ``.df()``'s (tests/test_fast_header.py checks them): nullable integers
    as ``Int32``, NULL floats as NaN, NULL strings as NaN (all NULL: None), NULL lists as ``pd.NA``."""
    types, cols = store._read(sql, params, None, lambda cur: ([str(d[1]) for d in cur.description], cur.fetchnumpy()))
    for (name, col), kind in zip(list(cols.items()), types):
        if not isinstance(col, np.ma.MaskedArray):
            continue
        mask = np.ma.getmaskarray(col)
        if not mask.any():
            cols[name] = col.data
        elif col.dtype.kind in "iu":
            cols[name] = pd.arrays.IntegerArray(col.data, mask)
        elif col.dtype.kind == "b":
            cols[name] = pd.arrays.BooleanArray(col.data, mask)
        elif col.dtype == object:
            cols[name] = np.where(mask, None if kind == "VARCHAR" else pd.NA, col.data)
        else:  # floats: NaN, times: NaT
            cols[name] = col.filled(np.datetime64("NaT") if col.dtype.kind in "mM" else np.nan)
    return pd.DataFrame(cols)


def tokens_of(store: Store, rollout_ids: list[str]) -> dict[str, pd.DataFrame]:
    """Tokens of several rollouts in one query: ``{rollout_id: tokens in order}``."""
    ids = [str(r) for r in rollout_ids]
    if not ids:
        return {}
    # IN (SELECT unnest(?)), not list_contains(?, rollout_id): a semi join whose ids DuckDB pushes into the
    # scan, so only the row groups holding them are read (list_contains reads every column of those row groups).
    # The range of the ids first, a filter the scan applies before it hashes: a group's ids are made together
    # and sort together, so most rows fail it at once (a group's read ~2x faster, on 5k and on 1M rollouts)
    df = _small_df(store, f"SELECT rollout_id, {TOKEN_COLUMNS} FROM {store.tokens_between(min(ids), max(ids))} "
                   "WHERE rollout_id BETWEEN ? AND ? "
                   "AND rollout_id IN (SELECT unnest(?::VARCHAR[])) ORDER BY rollout_id, pos", [min(ids), max(ids), ids])
    # the rows come sorted by rollout: cut them where the id changes (a groupby took ~5x longer, on the loop's GIL)
    got = df["rollout_id"].to_numpy()
    cuts = (np.flatnonzero(got[1:] != got[:-1]) + 1).tolist()
    body = df.drop(columns="rollout_id")
    return {got[a]: body.iloc[a:b].reset_index(drop=True) for a, b in zip([0] + cuts, cuts + [len(got)]) if b > a}


def group(store: Store, group_id: str, rule_version_id: str | None = None, credit: Credit | None = None) -> pd.DataFrame:
    """All completions of one group with reward, advantage and every component as a column."""
    base, params = scored_rollouts_sql(rule_version_id, "ro.group_id = ?", [group_id], credit, components=True)
    df = store.df(f"""
        SELECT s.* EXCLUDE (_components), p.text AS prompt, p.gold, p.task, r.policy, s._components
        FROM ({base}) s JOIN prompts p USING (prompt_id) JOIN runs r USING (run_id)
        ORDER BY s.sample_idx, s.rollout_id""", params)
    comps = {rid: _components_dict(cs) for rid, cs in zip(df["rollout_id"], df.pop("_components"))}
    comps = {rid: d for rid, d in comps.items() if d}
    names = sorted({c for d in comps.values() for c in d if c != "total"})
    for c in names:
        df[c] = [comps.get(r, {}).get(c) for r in df["rollout_id"]]
    df.attrs["components"] = names
    return df


# ---------------------------------------------------------------------------- one group from point reads
#
# Scoring one group in SQL (scored_rollouts_sql over ``ro.group_id = ?``) costs ~30 ms of planning and
# small operators, whatever the store's size. A click on a rollout needs only its group: scored_group
# reads the rollout's group id (the primary key's index), the group's rows and their rewards in point
# reads whose filters are constants (ids sort in the order they were made, so DuckDB's min/max
# statistics skip all but the row groups holding them; rows come back as tuples, as building a
# DataFrame costs more than such a read) while a reader thread (read_ahead) looks up their prompt,
# run and the rule versions' times, plus what a token-level estimator or REINFORCE++'s batches need,
# and scores them with the numpy twins of the estimators under the SQL's rules: NULL and NaN rewards,
# the version picked per rollout, batches. The values equal the SQL path's (tests/test_fast_header.py
# compares them, case by case); per-token terms whose float types matter (FLOAT log-probs and values)
# are still DuckDB's.

SCORED_NAMES = tuple(c.strip().split(".", 1)[1] for c in SCORED_COLUMNS.split(","))


@dataclass
class ScoredGroup:
    """One group scored as :func:`scored_rollouts_sql` scores the scope ``ro.group_id = ?``.

    ``rows``: the group's rollouts in ``(sample_idx, rollout_id)`` order, each a dict of the
    scored columns, ``rule_version_id``, ``reward``, ``accuracy``, ``advantage`` (NULL as NaN for
    these three), ``prompt``, ``gold``, ``task``, ``run``, ``policy`` and ``components``, as
    :func:`rollout` returns them; a rollout whose prompt or run row is missing is scored with its
    group (``members``) but not listed, as the SQL joins them. ``tokens``: what a token-level
    estimator read per rollout, in position order (KL: ``pos, logprob, ref``; GAE: ``pos, value``),
    for :func:`studio.queries.credit.token_advantages`.
    """

    group_id: str | None
    rule_version_id: str | None
    credit: Credit
    members: list[dict]
    rows: list[dict]
    tokens: dict[str, list[dict]]

    def row(self, rollout_id: str) -> dict | None:
        """The listed row of ``rollout_id`` (None when it is not one)."""
        return next((r for r in self.rows if r["rollout_id"] == rollout_id), None)


def scored_group(store: Store, rollout_id: str | None = None, rule_version_id: str | None = None,
                 credit: Credit | None = None, group_id: str | None = None) -> ScoredGroup:
    """The group of ``rollout_id`` (or ``group_id``) with rewards and advantages under ``credit``:
    the rows :func:`scored_rollouts_sql` gives for ``ro.group_id = ?`` with ``components``, joined to
    their prompt and run, from point reads (see :class:`ScoredGroup`)."""
    credit = credit or Credit()
    if group_id is None:
        # the group id first, through the rollouts' primary key index: the group's read then filters on a
        # constant, which DuckDB prunes the scan with as it plans it (a subquery's value, known only as the
        # query runs, scanned ~2.5x longer on a 1M-rollout store)
        head = _fetch(store, "SELECT group_id, prompt_id, run_id FROM rollouts WHERE rollout_id = ?", [rollout_id])
        if not head:
            return ScoredGroup(None, rule_version_id, credit, [], [], {})
        group_id, hint = head[0][0], ([head[0][1]], [head[0][2]])
    else:
        hint = None
    # the prompt and run rows (and the versions' times, to pick each rollout's newest scoring) are looked up
    # beside the group's read: the clicked rollout's own, known now (a group's rollouts share them), then
    # any other that a member names
    times = rule_version_id is None
    lookup = read_ahead(_lookups, store, *hint, times) if hint else None
    with settled(lambda: lookup):
        members = _rollout_rows(store, group_id)
        if not members:
            if lookup is not None:
                lookup.result()
            return ScoredGroup(None if hint else group_id, rule_version_id, credit, [], [], {})
        if lookup is None:
            lookup = read_ahead(_lookups, store, *_prompt_run_ids(members), times)
        scope = members
        if credit.estimator == "reinforce_pp":  # whitened over whole batches: read the batches' groups too
            scope = _batch_rows(store, members)
        reward_rows = _reward_rows(store, [m["rollout_id"] for m in scope], rule_version_id)
    prompts, runs, created = lookup.result()
    gid, key, tokens = members[0]["group_id"], credit.estimator, {}
    picked = _picked([r + (created.get(r[1]),) for r in reward_rows], rule_version_id)
    empty = {"rule_version_id": rule_version_id, "reward": None, "accuracy": None, "components": {}}
    for m in scope:
        m.update(picked.get(m["rollout_id"], empty))
    rewards, groups = [m["reward"] for m in scope], [m["group_id"] for m in scope]
    if key == "reinforce_pp":
        adv = _sequence_sql(key, rewards, groups, [(m["run_id"], m["train_step"]) for m in scope])
        adv = adv[:len(members)]  # _batch_rows lists the group's own rows first
    elif key == "kl":
        adv, tokens = _kl_first(store, members, credit)
    elif key == "gae":
        adv, tokens = _gae_first(store, members, credit)
    else:  # GRPO, Dr. GRPO, RLOO (anything else reads as GRPO, as in the SQL)
        adv = _sequence_sql(key if key in GROUP_STATS else "grpo", rewards, groups)
    for m, a in zip(members, adv):
        m["advantage"] = a
    pids, rids = _prompt_run_ids(members)
    missing = ([p for p in pids if p not in prompts], [r for r in rids if r not in runs])
    if missing[0] or missing[1]:  # members with another prompt or run than the clicked rollout (or none stored)
        more = _lookups(store, *missing)
        prompts, runs = {**prompts, **more[0]}, {**runs, **more[1]}
    for m in members:
        m["_prompt"], m["_run"] = prompts.get(m["prompt_id"]), runs.get(m["run_id"])
    return ScoredGroup(gid, rule_version_id, credit, members, _listed(members), tokens)


_READERS: ThreadPoolExecutor | None = None
_READERS_LOCK = threading.Lock()


def read_ahead(fn: Callable[..., T], *args) -> Future[T]:
    """``fn(*args)`` started in one of two shared reader threads: a click's reads that do not depend
    on each other (its tokens, its group's prompt) run while the calling thread reads the rest; DuckDB
    lets go of the GIL while it reads. ``.result()`` returns the value or raises what ``fn`` raised.
    ``fn`` must not wait on another :func:`read_ahead` (two threads: it could wait forever)."""
    global _READERS
    with _READERS_LOCK:
        if _READERS is None:
            _READERS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="studio-read")
    return _READERS.submit(fn, *args)


@contextmanager
def settled(future: Callable[[], Future | None]):
    """On an error inside, wait for the read ``future()`` started (:func:`read_ahead`) before the error
    leaves: its cursor must not outlive a store that the caller may close next."""
    try:
        yield
    except BaseException:
        f = future()
        if f is not None:
            wait([f])
        raise


def _fetch(store: Store, sql: str, params: list) -> list[tuple]:
    """Rows as tuples, through the store's reader (its time limit, a cursor per call): for point
    reads, where building a DataFrame (:meth:`Store.df`) costs more than the read itself."""
    return store._read(sql, params, None, lambda cur: cur.fetchall())


def _rollout_rows(store: Store, group_id: str) -> list[dict]:
    """The group's rollouts as dicts of the scored columns."""
    rows = _fetch(store, f"SELECT {SCORED_COLUMNS} FROM rollouts ro WHERE ro.group_id = ?", [group_id])
    return [dict(zip(SCORED_NAMES, r)) for r in rows]


def _prompt_run_ids(members: list[dict]) -> tuple[list, list]:
    """The distinct prompt and run ids the members name."""
    return list(dict.fromkeys(m["prompt_id"] for m in members)), list(dict.fromkeys(m["run_id"] for m in members))


def _marks(values: list) -> str:
    """One bound parameter per value, for ``IN (...)`` (NULL when there are none: no row matches)."""
    return ", ".join(["?"] * len(values)) or "NULL"


def _lookups(store: Store, prompt_ids: list, run_ids: list, times: bool = False) -> tuple[dict, dict, dict]:
    """``({prompt_id: (text, gold, task)}, {run_id: (name, policy)}, {rule_version_id: created_at})``
    of the rows that exist, in one read: the prompts and runs through their primary keys' indexes (ids
    as a list of bound values: an index lookup each), with ``times`` every rule version's time."""
    rows = _fetch(store, f"""
        SELECT 0, prompt_id, text, gold::VARCHAR, task, NULL::TIMESTAMP FROM prompts WHERE prompt_id IN ({_marks(prompt_ids)})
        UNION ALL
        SELECT 1, run_id, name, policy, NULL, NULL FROM runs WHERE run_id IN ({_marks(run_ids)})
        UNION ALL
        SELECT 2, rule_version_id, NULL, NULL, NULL, created_at FROM rule_versions WHERE ?""",
                  list(prompt_ids) + list(run_ids) + [bool(times)])
    out: tuple[dict, dict, dict] = ({}, {}, {})
    for r in rows:
        out[r[0]][r[1]] = r[2:5] if r[0] == 0 else r[2:4] if r[0] == 1 else r[5]
    return out


def _batch_keys(store: Store, where: str, params: list) -> list[dict]:
    """Rollouts matching ``where`` with only what REINFORCE++ groups and batches them by."""
    keys = ("rollout_id", "group_id", "run_id", "train_step")
    return [dict(zip(keys, r)) for r in _fetch(store, f"SELECT {', '.join(keys)} FROM rollouts ro WHERE {where}", params)]


def _batch_rows(store: Store, members: list[dict]) -> list[dict]:
    """The group's rows, then every other rollout REINFORCE++ whitens them with: the rest of each
    member's batch (same run and training step; NULL steps are one batch) and, so that each of those
    gets its whole group's mean, the rest of their groups within the group's runs (the SQL's scope)."""
    runs = sorted({m["run_id"] for m in members})
    out, seen = list(members), {m["rollout_id"] for m in members}

    def add(rows):
        for r in rows:
            if r["rollout_id"] not in seen:
                seen.add(r["rollout_id"])
                out.append(r)
    for run_id, step in dict.fromkeys((m["run_id"], m["train_step"]) for m in members):
        if step is None:
            add(_batch_keys(store, "ro.run_id = ? AND ro.train_step IS NULL", [run_id]))
        else:
            add(_batch_keys(store, "ro.run_id = ? AND ro.train_step = ?", [run_id, step]))
    gids = sorted({r["group_id"] for r in out})
    add(_batch_keys(store, "ro.group_id BETWEEN ? AND ? AND ro.group_id IN (SELECT unnest(?::VARCHAR[])) "
                           "AND ro.run_id IN (SELECT unnest(?::VARCHAR[]))", [gids[0], gids[-1], gids, runs]))
    return out


REWARD_ROWS_PER_ROLLOUT = 64  # a range read returning more than this per rollout asks for the ids instead


def _reward_rows(store: Store, ids: list[str], rule_version_id: str | None) -> list[tuple]:
    """``(rollout_id, rule_version_id, component, value)`` of these rollouts (only the version's, if
    one is given). Read through their id range: ids sort in the order they were made, so a group's
    range holds little but its own rewards, and DuckDB skips the other row groups. Should the range
    hold many other rollouts' rewards (a group made far apart), the read stops there and asks for the
    ids instead."""
    if not ids:
        return []
    ver, vparams = ("", []) if rule_version_id is None else (" AND rw.rule_version_id = ?", [rule_version_id])
    sql = f"""SELECT rw.rollout_id, rw.rule_version_id, rw.component, rw.value FROM rewards rw
              WHERE rw.rollout_id BETWEEN ? AND ?{ver}"""
    cap = REWARD_ROWS_PER_ROLLOUT * len(ids)
    rows = _fetch(store, sql + " LIMIT ?", [min(ids), max(ids)] + vparams + [cap + 1])
    if len(rows) > cap:
        rows = _fetch(store, sql + " AND rw.rollout_id IN (SELECT unnest(?::VARCHAR[]))",
                      [min(ids), max(ids)] + vparams + [list(ids)])
    keep = set(ids)
    return [r for r in rows if r[0] in keep]


def _picked(rewards: list[tuple], rule_version_id: str | None) -> dict[str, dict]:
    """``{rollout_id: {rule_version_id, reward, accuracy, components}}``: what :func:`picked_sql` (with
    ``components``) picks from these reward rows (:func:`_reward_rows`'s, each with its version's
    ``created_at`` after them: NULL for a version missing from ``rule_versions``)."""
    per: dict[tuple, list[tuple]] = {}
    for r in rewards:
        per.setdefault((r[0], r[1]), []).append(r)
    out: dict[str, dict] = {}
    newest: dict = {}
    for (rid, v), rs in per.items():
        total = [r[3] for r in rs if r[2] == "total"]
        if rule_version_id is None:
            # the newest version with a total row: a version missing from rule_versions (the SQL joins it)
            # or without a time is skipped, as arg_max skips it; of equal times the first read wins (so
            # does arg_max, in an order SQL leaves open)
            t = rs[0][4]
            if not total or t is None or (rid in newest and newest[rid] >= t):
                continue
            newest[rid] = t
        out[rid] = {"rule_version_id": v, "reward": _sql_max(total),
                    "accuracy": _sql_max([r[3] for r in rs if r[2] == "accuracy"]),
                    "components": {r[2]: math.nan if r[3] is None else float(r[3]) for r in sorted(rs, key=lambda r: r[2])}}
    return out


def _sql_max(xs: list) -> float | None:
    """``max`` as SQL takes it: NULLs skipped, NaN above every number, NULL when nothing is left."""
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return math.nan if any(math.isnan(x) for x in xs) else max(xs)


def _sql_sum(xs: list) -> float | None:
    """``sum`` as SQL takes it, in the order given: NULLs skipped, NULL when nothing is left."""
    xs = [x for x in xs if x is not None]
    return sum(xs) if xs else None


def _codes(values: list) -> np.ndarray:
    """Integer codes of hashable values (equal values, equal codes)."""
    index: dict = {}
    return np.array([index.setdefault(v, len(index)) for v in values], dtype=np.int64)


def _sequence_sql(key: str, rewards: list, groups: list, batches: list | None = None) -> np.ndarray:
    """A sequence estimator's numpy twin under the SQL twins' rules: a NULL reward (None) is left
    out of its group's statistics and gets 0 (here: a group of its own, which the twins give 0), and
    a NaN reward makes its group's other advantages NaN (it propagates through SQL's avg, and a NaN
    spread is not "all equal"). REINFORCE++ then whitens per batch (:func:`~studio.signals.advantages.whiten`)."""
    null = np.array([x is None for x in rewards], dtype=bool)
    r = np.array([0.0 if x is None else x for x in rewards], dtype=np.float64)
    g = _codes(groups)
    g[null] = -1 - np.arange(int(null.sum()))
    with np.errstate(invalid="ignore"):
        a = SEQUENCE_FNS["dr_grpo" if key == "reinforce_pp" else key](r, g)
    a[np.isin(g, g[np.isnan(r)])] = np.nan
    return whiten(a, _codes(batches)) if key == "reinforce_pp" else a


def _token_rows(store: Store, sql: str, params: list) -> dict[str, list[dict]]:
    """``{rollout_id: rows in position order}`` of a per-token read (one list of structs)."""
    out: dict[str, list[dict]] = {}
    for t in store.scalar(sql, params) or []:
        out.setdefault(t["rollout_id"], []).append(t)
    return out


def _kl_first(store: Store, members: list[dict], credit: Credit) -> tuple[list, dict]:
    """KL in the reward, first token, as :func:`scored_rollouts_sql`: G_0 = R - β·Σ_t (log π - log π_ref)
    when every token has a reference log-prob (the FLOAT difference taken by DuckDB, as there), and
    A_0 = G_0 - mean over the group of G_0. Also returns the tokens read."""
    ids = [m["rollout_id"] for m in members]
    toks = _token_rows(store, """
        SELECT list({'rollout_id': t.rollout_id, 'pos': t.pos, 'logprob': t.logprob, 'ref': sc.logprob,
                     'd': t.logprob - sc.logprob} ORDER BY t.rollout_id, t.pos)
        FROM tokens t LEFT JOIN token_scores sc ON sc.rollout_id = t.rollout_id AND sc.pos = t.pos
             AND sc.policy_version = ?
        WHERE t.rollout_id IN (SELECT unnest(?::VARCHAR[]))""", [credit.reference or "", ids])
    g0 = []
    for m in members:
        ts = toks.get(m["rollout_id"])
        kl = _sql_sum([t["d"] for t in ts]) if ts and all(t["ref"] is not None for t in ts) else None
        g0.append(None if kl is None or m["reward"] is None else m["reward"] - float(credit.beta) * kl)
    known = [x for x in g0 if x is not None]
    base = sum(known) / len(known) if known else None
    return [math.nan if x is None else x - base for x in g0], toks


def _gae_first(store: Store, members: list[dict], credit: Credit) -> tuple[list, dict]:
    """GAE's first-token advantage, as :func:`scored_rollouts_sql`: A_0 = Σ_t (γλ)^t δ_t + (γλ)^T·R over
    the critic's values (each term taken by DuckDB, in its types), NULL unless every token has a value.
    Also returns the values read."""
    ids = [m["rollout_id"] for m in members]
    gl = float(credit.gamma) * float(credit.lam)
    vals = _token_rows(store, f"""
        SELECT list({{'rollout_id': rollout_id, 'pos': pos, 'value': value, 'term': term}} ORDER BY rollout_id, pos)
        FROM (SELECT rollout_id, pos, value,
                     pow({gl!r}, pos) * ({float(credit.gamma)!r} * lead(value, 1, 0.0) OVER (PARTITION BY rollout_id ORDER BY pos)
                                         - value) AS term
              FROM token_scores WHERE policy_version = ? AND rollout_id IN (SELECT unnest(?::VARCHAR[])))""",
                       [credit.values or "", ids])
    out = []
    for m in members:
        ts = vals.get(m["rollout_id"])
        part = _sql_sum([t["term"] for t in ts]) if ts else None
        n = sum(t["value"] is not None for t in ts) if ts else None
        if part is None or m["reward"] is None or m["n_tokens"] is None or n != m["n_tokens"]:
            out.append(math.nan)
        else:
            out.append(part + math.pow(gl, max(t["pos"] for t in ts)) * m["reward"])
    return out, vals


def _listed(members: list[dict]) -> list[dict]:
    """The members with a prompt and a run row, as :func:`rollout` returns them, in sample order."""
    rows = []
    for m in members:
        if m["_prompt"] is None or m["_run"] is None:
            continue
        row = {n: m[n] for n in SCORED_NAMES}
        row["rule_version_id"] = m["rule_version_id"]
        for k in ("reward", "accuracy", "advantage"):
            row[k] = math.nan if m[k] is None else float(m[k])
        (row["prompt"], row["gold"], row["task"]), (row["run"], row["policy"]) = m["_prompt"], m["_run"]
        row["components"] = m["components"]
        rows.append(row)
    return sorted(rows, key=lambda r: (r["sample_idx"] is None, r["sample_idx"] or 0, r["rollout_id"]))


def groups(store: Store, run_id: str | None = None, rule_version_id: str | None = None,
           group_ids: list[str] | None = None, limit: int | None = None) -> pd.DataFrame:
    """One row per group, newest first: prompt, size, mean reward, and whether all rewards are
    equal. ``group_ids``: only these groups; ``limit``: only the newest this many (both read just
    those groups' rows)."""
    conds, sparams = ["TRUE"], []
    if run_id:
        conds.append("ro.run_id = ?"); sparams.append(run_id)
    if group_ids is not None:
        conds.append("ro.group_id IN (SELECT unnest(?::VARCHAR[]))"); sparams.append(list(group_ids))
    if limit is not None:
        conds.append(f"""ro.group_id IN (SELECT group_id FROM rollouts ro WHERE {' AND '.join(conds)}
                                          GROUP BY group_id ORDER BY max(created_at) DESC NULLS LAST LIMIT ?)""")
        sparams = sparams + sparams + [int(limit)]
    scope = " AND ".join(conds)
    picked, params = picked_sql(rule_version_id, scope, sparams)  # rewards only: no advantage is shown
    return store.df(f"""
        WITH picked AS ({picked})
        SELECT ro.group_id, any_value(p.text) AS prompt, any_value(r.name) AS run, count(*) AS size,
               avg(pk.reward) AS mean_reward, avg(CASE WHEN pk.accuracy >= 1 THEN 1 ELSE 0 END) AS accuracy,
               coalesce(max(pk.reward) - min(pk.reward) <= {EQUAL_TOL!r}, true) AS all_equal,
               max(ro.created_at) AS created_at
        FROM rollouts ro LEFT JOIN picked pk ON pk.rollout_id = ro.rollout_id
        JOIN prompts p USING (prompt_id) JOIN runs r USING (run_id)
        WHERE {scope}
        GROUP BY ro.group_id ORDER BY created_at DESC, prompt""", params + sparams)


def runs(store: Store) -> pd.DataFrame:
    return store.df("""
        SELECT r.run_id, r.kind, r.name, r.policy, r.status, r.created_at, count(ro.rollout_id) AS rollouts
        FROM runs r LEFT JOIN rollouts ro USING (run_id)
        GROUP BY ALL ORDER BY r.created_at DESC""")


def prompt_of_row(row: dict) -> Prompt:
    """The :class:`Prompt` of a rollout row that carries ``prompt`` text and ``gold`` JSON."""
    gold = row.get("gold")
    return Prompt(row["prompt"], json.loads(gold) if isinstance(gold, str) else (gold or {}))


def sample_prompts(store: Store, limit: int = 200) -> list[str]:
    """Prompt texts already in the store, for the generate panel's picker."""
    return [r[0] for r in store.cursor().execute(
        "SELECT text FROM prompts ORDER BY text LIMIT ?", [limit]).fetchall()]
