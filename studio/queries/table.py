"""The rollout table: the rows a :class:`RolloutFilter` keeps, one page at a time, ordered, cut and counted in DuckDB.

Filters that keep or drop whole groups (run, group, training step, branches; the prompt
text, as "groups with a row whose prompt contains it") narrow the rollouts before any reward
is read, so advantages are those of the unfiltered store. A page without a correctness or
reward filter (or a sort on rewards) does not depend on rewards: it is ordered and cut from
``rollouts`` first (its last row's creation time bounds the scans) and only its groups are
scored (a 1M-rollout store scores ~5,000 rollouts, not a million). With one, the filtered
scope is scored whole (:func:`scores_scope`), then cut. ``offset`` gives a page further down,
cut in DuckDB; the filter's row count comes from ``rollouts`` alone, or from the page's own
scoring pass where that scored every row (:func:`rollout_table_counted`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import pandas as pd

from studio.queries.scoring import scored_rollouts_sql
from studio.signals.advantages import Credit
from studio.store import Store

MAX_TABLE_ROWS = 5000


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
        conds.append("ro.run_id = ?")
        params.append(f.run_id)
    if f.group_id:
        conds.append("ro.group_id = ?")
        params.append(f.group_id)
    if f.train_step is not None:  # a group is sampled within one step: whole groups again
        conds.append("ro.train_step = ?")
        params.append(int(f.train_step))
    if f.branches_of:  # a branch request is one whole group, so this keeps whole groups too
        conds.append(f"ro.rollout_id IN ({DESCENDANTS})")
        params.append(f.branches_of)
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
        on_rewards.append("s.reward >= ?")
        wparams.append(float(f.reward_min))
    if f.reward_max is not None:
        on_rewards.append("s.reward <= ?")
        wparams.append(float(f.reward_max))
    # a prompt text alone picks rollouts from all over the store: their ids span it (see scoring._scoped_rewards)
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
            SELECT ro.rollout_id, ro.group_id
            FROM rollouts ro JOIN prompts p USING (prompt_id) JOIN runs r USING (run_id)
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
        ctes += [f"""cut0 AS (SELECT ro.created_at FROM rollouts ro WHERE {shown}
                              ORDER BY ro.created_at DESC LIMIT 1 OFFSET ?)""",
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
            conds.append("contains(lower(p.text), lower(?))")
            params.append(f.prompt_contains.strip())
        return int(store.scalar(f"""SELECT count(*) FROM rollouts ro JOIN prompts p USING (prompt_id)
                                    JOIN runs r USING (run_id) WHERE {' AND '.join(conds)}""", params))
    sql, params = rollout_table_sql(rule_version_id, replace(f, limit=1 << 62), credit)
    return int(store.scalar(f"SELECT count(*) FROM ({sql})", params))


