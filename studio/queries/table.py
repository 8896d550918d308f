"""The rollout table: the rows a :class:`RolloutFilter` keeps, one page at a time, ordered, cut and counted in DuckDB.

Filters that keep or drop whole groups (run, group, training step, branches; the prompt
text, as "groups with a row whose prompt contains it") narrow the rollouts before any reward
is read, so advantages are those of the unfiltered store. Correctness is a column of the
rollout (``rollouts.correct``, set by its task or by the import's own correctness field), so
the *correct* / *incorrect* filter is a condition on ``rollouts`` like the others: no reward
version is read to decide it, and the shown version never changes it.

A page is ordered and cut from ``rollouts`` first (its last row's creation time bounds the
scans) and only its groups are scored (a 1M-rollout store scores ~5,000 rollouts, not a
million), unless its order depends on rewards (a sort by reward or advantage) or (nearly)
every row is asked for: then the filtered scope is scored whole (:func:`scores_scope`), then
cut (so is a scope narrowed by a run or a prompt text under a reward range). A reward range is a
condition on the ``total`` rows of **one** rule version
(:func:`reward_source`): the version asked for, or, under "latest scoring", the newest version
that scored the scope, so rewards of rules on different scales are never filtered or sorted
together; the table then shows that version's rewards on every row, and
:attr:`RewardSource.note` says which versions the scope holds when there are several. The
newest-first page finds the creation time of its last row first (:func:`_cut`; under a reward
range, among the newest rollouts first), a constant that lets every scan skip older row groups,
so a range is checked on a few thousand reward rows, not a million.
``offset`` gives a page further down, cut in DuckDB; the filter's row count comes from
``rollouts`` alone, from the version's reward rows (a reward range over the whole store), or
from the page's own scoring pass where that scored every row (:func:`rollout_table_counted`).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import pandas as pd

from studio.queries.filters import (
    RolloutFilter,
    has_range,
    mismatch_summaries_sql,
    narrows_rows,
    range_sql,
    row_conditions,
    whole_group_conditions,
)
from studio.queries.scoring import scored_rollouts_sql
from studio.signals.advantages import Credit
from studio.store import Store

# a page without a reward sort is cut from the rollouts first and only its groups are scored, however far
# down it is; a limit above this asks for (nearly) every row, so the scope is scored directly
PAGE_FIRST_MAX = 100_000
# a newest-first page under a reward range is looked for among the newest 2 x (its rows), at least this many, then
# 8 and 64 times more, before every rollout of the filter is checked (_cut)
REWARD_WINDOW_MIN = 2048


def _table_order(ro: str, p: str) -> str:
    """The table's order: newest first, then prompt text, group, sample, id (``ro``: rollout alias,
    ``p``: prompt). The id last: rows that tie on the rest (branches) keep their place across pages."""
    return f"{ro}.created_at DESC, {p}.text, {ro}.group_id, {ro}.sample_idx, {ro}.rollout_id"


def _in_range_ids(f: RolloutFilter, version: str, within: str | None = None) -> tuple[str, list]:
    """``SELECT rollout_id`` of the rollouts whose ``total`` under ``version`` is in ``f``'s range; with
    ``within`` (a relation with a ``rollout_id`` column) only theirs, read through their id range."""
    rng, params = range_sql(f, "rw.value")
    sql = f"""SELECT rw.rollout_id FROM rewards rw
              WHERE rw.rule_version_id = ? AND rw.component = 'total' AND {rng}"""
    if within is not None:
        sql += (f" AND rw.rollout_id BETWEEN (SELECT min(rollout_id) FROM {within}) AND (SELECT max(rollout_id) "
                f"FROM {within}) AND rw.rollout_id IN (SELECT rollout_id FROM {within})")
    return sql, [version] + params


# the table's columns it can be sorted by -> their SQL over the scored rows ``s`` and prompts ``p``
TABLE_SORTS = {"prompt": "p.text", "completion": "s.text", "reward": "s.reward", "advantage": "s.advantage",
               "correct": "s.correct", "n_tokens": "s.n_tokens", "fork_pos": "s.fork_pos",
               "created_at": "s.created_at", "turns": "s.n_turns",
               # the mismatch summaries (mismatch_summaries_sql), joined as ``mm`` only under these sorts
               "max_abs_delta": "mm.max_abs_delta", "k3": "mm.k3", "delta_mean": "mm.delta_mean",
               "geo_ratio": "mm.geo_ratio", "rejected": "mm.rejected"}
MISMATCH_SORTS = ("max_abs_delta", "k3", "delta_mean", "geo_ratio", "rejected")
# the sorts that do not depend on rewards, over the rollouts ``ro``: their pages are cut from the rollouts
# alone, as the newest-first page is, and only the page's groups are scored
ROLLOUT_SORTS = {k: TABLE_SORTS[k].replace("s.", "ro.") for k in ("prompt", "completion", "correct", "n_tokens",
                                                                   "fork_pos", "created_at", "turns")}


def rollout_table_sql(rule_version_id: str | None, f: RolloutFilter, credit: Credit | None = None,
                      offset: int = 0, sort: tuple[str, bool] | None = None, count: bool = False,
                      cut: datetime | None = None) -> tuple[str, list]:
    """The rollout table's rows for filter ``f``: newest first (or by ``sort``: a column of
    :data:`TABLE_SORTS` and whether descending, then newest first), at most ``f.limit`` of them
    after skipping ``offset`` (a page further down, cut in DuckDB). Columns: ``rollout_id, prompt,
    completion, reward, version`` (the rule version the reward comes from), ``advantage, correct,
    answer, n_tokens, finish_reason, run, group_id, sample_idx, created_at, fork_pos, parent_rollout_id,
    n_turns, n_tool_calls, n_tool_errors`` (an agent trajectory's turns, tool calls and failed calls).

    Filters that keep or drop whole groups (run, group, training step, branches; the prompt
    text, as "groups with a row whose prompt contains it") narrow the rollouts before any
    reward is read: advantages are computed over whole groups, so they are the same as over
    the unfiltered store. Correctness (``rollouts.correct``) and a reward range under a given
    version are conditions on rows that do not need advantages, so unless the order depends on
    rewards the page is ordered and cut in DuckDB from ``rollouts`` (and the version's ``total``
    rows) and only its groups are scored (a 1M-rollout store scores ~5,000 rollouts, not a million).

    A reward range with ``rule_version_id`` None (each rollout's latest scoring) is checked on
    each rollout's latest total, the scope scored whole: :func:`rollout_table` and the other
    runners resolve one version first (:func:`reward_source`) and pass it here, so the table never
    filters or sorts rewards of several versions together. ``cut`` (the newest-first page under a
    newest-first page, from :func:`_cut`): no row of the page was made before it, so the rows (and a
    reward range) are read only from the rollouts made since.

    With ``count``, where the whole scope is scored (:func:`scores_scope`), each row also carries
    ``_total``: how many rows the filter keeps over all pages, counted in the same pass
    (``count(*) OVER ()``, before the page is cut).
    """
    ctes, cparams = [], []
    groups, sparams = whole_group_conditions(f)
    scope, rows, rparams = list(groups), list(groups), list(sparams)  # what is scored; which of those rows are shown
    if f.prompt_contains:
        # contains(), not LIKE: a typed % or _ is a character, not a wildcard; matched once for every scan
        ctes.append("matched AS MATERIALIZED (SELECT prompt_id FROM prompts WHERE contains(lower(text), lower(?)))")
        cparams.append(f.prompt_contains.strip())
        rows.append("ro.prompt_id IN (SELECT prompt_id FROM matched)")
        # a group's completions share one prompt; asked per group all the same, so a group whose rows
        # disagree is still scored whole, as without the filter
        scope.append(f"ro.group_id IN (SELECT ro.group_id FROM rollouts ro WHERE {' AND '.join(groups)} "
                     "AND ro.prompt_id IN (SELECT prompt_id FROM matched))")
    row_conds, row_params = row_conditions(f)
    rows += row_conds
    rparams += row_params
    # a prompt text alone picks rollouts from all over the store: their ids span it (see scoring._scoped_rewards)
    narrow = not (f.prompt_contains and groups == ["TRUE"])
    order = _table_order("s", "p")
    if sort is not None:
        column, descending = sort
        if column not in TABLE_SORTS:
            raise ValueError(f"cannot sort the rollout table by {column!r}; by one of {', '.join(TABLE_SORTS)}")
        order = f"{TABLE_SORTS[column]} {'DESC' if descending else 'ASC'} NULLS LAST, {order}"
    # a page cut from the rollouts first (only its groups are scored) unless its order depends on rewards,
    # every row is asked for, or a reward range is asked under each rollout's latest scoring
    paged = not scores_scope(f, sort) and not (has_range(f) and rule_version_id is None)
    on_scored, wparams = [], []
    if has_range(f) and not paged:
        rng, wparams = range_sql(f, "s.reward")
        on_scored.append(rng)
    elif has_range(f):  # one version's total rows in range: a condition on the rows, like correctness
        if cut is not None:
            # the rows made since the cut, and the reward rows of just those, read through their id range
            ctes.append(f"""recent AS MATERIALIZED (SELECT ro.rollout_id FROM rollouts ro
                                                  WHERE {' AND '.join(rows)} AND ro.created_at >= ?)""")
            cparams += rparams + [cut]
            ids, iparams = _in_range_ids(f, rule_version_id, "recent")
            ctes.append(f"in_range AS MATERIALIZED ({ids})")
            cparams += iparams
            rows.append("ro.rollout_id IN (SELECT rollout_id FROM in_range)")
        else:
            ids, iparams = _in_range_ids(f, rule_version_id)
            rows.append(f"ro.rollout_id IN ({ids})")
            rparams += iparams
    if cut is not None and sort is None:  # no row of the page was made before it: a constant the scans skip on
        rows.append("ro.created_at >= ?")
        rparams.append(cut)
    shown = " AND ".join(rows)
    if not paged:
        cond, skip = " AND ".join(scope), int(offset)
        sparams = sparams + sparams if f.prompt_contains else sparams  # the groups' conditions twice
        where = ["s.prompt_id IN (SELECT prompt_id FROM matched)"] if f.prompt_contains else []
        where += [c.replace("ro.", "s.") for c in row_conds] + on_scored
        wparams = row_params + wparams
    elif sort is not None:  # by a column of the rollouts: the page is cut from them alone
        column, descending = sort
        ctes.append(f"""page AS MATERIALIZED (
            SELECT ro.rollout_id, ro.group_id
            FROM rollouts ro JOIN prompts p USING (prompt_id) JOIN runs r USING (run_id)
            WHERE {shown}
            ORDER BY {ROLLOUT_SORTS[column]} {'DESC' if descending else 'ASC'} NULLS LAST, {_table_order("ro", "p")}
            LIMIT ? OFFSET ?)""")
        cparams += rparams + [int(f.limit), int(offset)]
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
        cparams += rparams + [max(n - 1, 0)] + rparams + [n] + rparams + rparams + [int(f.limit), int(offset)]
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
    mm, mparams = "", []
    if sort is not None and sort[0] in MISMATCH_SORTS:  # read only where the order asks for it
        summaries, mparams = mismatch_summaries_sql(f)
        mm = f"\n        LEFT JOIN ({summaries}) mm ON mm.rollout_id = s.rollout_id"
    sql = f"""{"WITH " + ", ".join(ctes) if ctes else ""}
        SELECT s.rollout_id, p.text AS prompt, s.text AS completion, s.reward, s.rule_version_id AS version,
               s.advantage, s.correct, s.answer, s.n_tokens, s.finish_reason, r.name AS run,
               s.group_id, s.sample_idx, s.created_at, s.fork_pos, s.parent_rollout_id,
               s.n_turns, s.n_tool_calls, s.n_tool_errors{total}
        FROM ({base}) s
        JOIN prompts p USING (prompt_id)
        JOIN runs r USING (run_id){mm}
        {"WHERE " + " AND ".join(where) if where else ""}
        ORDER BY {order}
        LIMIT ? OFFSET ?
    """
    return sql, cparams + params + mparams + wparams + [int(f.limit), skip]


@dataclass(frozen=True)
class RewardSource:
    """Which rule version's rewards a reward filter or sort of the table reads (:func:`reward_source`).

    ``version``: the one read (None: nothing in the scope has a reward); ``asked``: it was
    picked by the user, else it is the newest version that scored the scope's rollouts (each
    rollout's "latest scoring" would mix rules on different scales); ``versions``: every version
    with a total among the scope's rollouts, newest first (just ``version`` when asked);
    ``n_in_range``: over the whole store, the rollouts whose total under ``version`` is in the
    filter's range (None where the filter narrows the rollouts: they are counted from them).
    """

    version: str | None
    asked: bool
    versions: tuple[str, ...] = ()
    n_in_range: int | None = None

    @property
    def note(self) -> str | None:
        """What the table says above its rows when the scope holds rewards of several versions and the
        rows are filtered or sorted by one of them (None otherwise)."""
        if self.asked or len(self.versions) < 2:
            return None
        others = ", ".join(self.versions[1:4]) + (f" and {len(self.versions) - 4} more" if len(self.versions) > 4 else "")
        return (f"Rewards of {len(self.versions)} rule versions score these rollouts. Filtering and sorting by "
                f"reward read one, the newest: {self.version} (also here: {others}); a rollout it did not score "
                "has no reward here. Pick a version under “Rewards shown from” to use another; their scales differ.")


def reward_source(store: Store, f: RolloutFilter, rule_version_id: str | None = None,
                  count: bool = True) -> RewardSource:
    """The rule version whose ``total`` rows a reward range or a reward sort of the table under ``f``
    reads: ``rule_version_id`` when one is asked for, else the newest version (by ``created_at``) with
    a total among the rollouts of ``f``'s whole-group conditions. One read of the ``total`` rows (over
    the whole store, that read also counts the rollouts in ``f``'s range: :attr:`RewardSource.n_in_range`;
    for a version asked for, only with ``count``)."""
    groups, sparams = whole_group_conditions(f)
    whole = groups == ["TRUE"] and not f.prompt_contains and not narrows_rows(f)
    rng, rparams = range_sql(f, "rw.value")
    if rule_version_id is not None:
        n = None
        if whole and count:  # a version's total rows are its rollouts (one each: a version scores a rollout once)
            n = int(store.scalar(f"""SELECT count(*) FROM rewards rw WHERE rw.rule_version_id = ?
                                     AND rw.component = 'total' AND {rng}""", [rule_version_id] + rparams))
        return RewardSource(rule_version_id, True, (rule_version_id,), n)
    from studio.queries.scoring import _scoped_rewards

    rows = store._read(f"""
        SELECT per.rule_version_id, per.n FROM (
            SELECT rw.rule_version_id, count(*) FILTER (WHERE {rng}) AS n
            FROM {_scoped_rewards(" AND ".join(groups))} WHERE rw.component = 'total'
            GROUP BY rw.rule_version_id) per
        JOIN rule_versions v USING (rule_version_id)
        ORDER BY v.created_at DESC NULLS LAST, per.rule_version_id DESC""", rparams + sparams, None,
                       lambda cur: cur.fetchall())
    if not rows:
        return RewardSource(None, False)
    return RewardSource(rows[0][0], False, tuple(r[0] for r in rows), int(rows[0][1]) if whole else None)


def _depends_on_rewards(f: RolloutFilter, sort: tuple[str, bool] | None) -> bool:
    """Whether the rows ``f`` keeps or their order ``sort`` depend on rewards (one version is then read)."""
    return has_range(f) or (sort is not None and sort[0] not in ROLLOUT_SORTS and sort[0] not in MISMATCH_SORTS)


def _cut(store: Store, f: RolloutFilter, version: str | None, n: int) -> datetime | None:
    """The creation time from which the newest ``n`` rows of ``f`` are all made (with a reward range,
    under ``version``), as a constant the page's scans then skip older row groups on: the time of the
    ``n``-th newest rollout of the filter's other conditions, or, with a reward range, of the newest
    ``window`` of them (``2·n``, then 8 and 64 times more) once at least ``n`` rollouts made since then
    are in range. None: no such time (fewer rows, or too few in range: every row is then checked)."""
    groups, sparams = whole_group_conditions(f)
    row_conds, row_params = row_conditions(f)
    conds, ctes, head, sparams = groups + row_conds, "", [], sparams + row_params
    if f.prompt_contains:
        ctes = "matched AS MATERIALIZED (SELECT prompt_id FROM prompts WHERE contains(lower(text), lower(?))),"
        head = [f.prompt_contains.strip()]
        conds.append("ro.prompt_id IN (SELECT prompt_id FROM matched)")
    cond = " AND ".join(conds)
    keep = f"{cond} AND ro.prompt_id IN (SELECT prompt_id FROM prompts) AND ro.run_id IN (SELECT run_id FROM runs)"
    ranged = has_range(f) and version is not None
    windows = [max(2 * int(n), REWARD_WINDOW_MIN) * k for k in (1, 8, 64)] if ranged else [int(n)]
    for window in windows:
        rows = store._read(f"""WITH {ctes} _c AS (SELECT 1) SELECT ro.created_at FROM rollouts ro WHERE {cond}
                               ORDER BY ro.created_at DESC LIMIT 1 OFFSET ?""", head + sparams + [max(window - 1, 0)],
                           None, lambda cur: cur.fetchall())
        if not rows or rows[0][0] is None:
            return None  # fewer rollouts than the window (or rows without a time): no cut
        at = rows[0][0]
        if ranged:
            ids, iparams = _in_range_ids(f, version, "recent")
            sql = f"""WITH {ctes} recent AS MATERIALIZED (SELECT ro.rollout_id FROM rollouts ro
                                                          WHERE {keep} AND ro.created_at >= ?)
                      SELECT count(*) FROM ({ids})"""
            params = head + sparams + [at] + iparams
        else:
            sql = f"WITH {ctes} _c AS (SELECT 1) SELECT count(*) FROM rollouts ro WHERE {keep} AND ro.created_at >= ?"
            params = head + sparams + [at]
        if store._read(sql, params, None, lambda cur: cur.fetchall())[0][0] >= n:
            return at
    return None


def _resolved(store: Store, f: RolloutFilter, rule_version_id: str | None, sort: tuple[str, bool] | None,
              source: RewardSource | None = None) -> tuple[str | None, RewardSource | None]:
    """The version the table reads for ``f`` and ``sort``: under "latest scoring" with a reward range or
    sort, the one :func:`reward_source` picks (and it); otherwise ``rule_version_id`` as given."""
    if not _depends_on_rewards(f, sort):
        return rule_version_id, None
    source = source or reward_source(store, f, rule_version_id, count=False)
    return (source.version if source.version is not None else rule_version_id), source


def _page(store: Store, f: RolloutFilter, rule_version_id: str | None, credit: Credit | None, offset: int,
          sort: tuple[str, bool] | None, count: bool, source: RewardSource | None = None) -> pd.DataFrame:
    version, source = _resolved(store, f, rule_version_id, sort, source)
    cut = None
    if sort is None and not scores_scope(f, sort) and not (has_range(f) and version is None):
        cut = _cut(store, f, version, int(f.limit) + int(offset))
    df = store.df(*rollout_table_sql(version, f, credit, offset, sort, count, cut))
    df.attrs["reward_source"] = source
    return df


def rollout_table(store: Store, f: RolloutFilter = RolloutFilter(), rule_version_id: str | None = None,
                  credit: Credit | None = None, offset: int = 0, sort: tuple[str, bool] | None = None) -> pd.DataFrame:
    """The page of :func:`rollout_table_sql` for ``f``, a reward range or a sort by reward or advantage
    read under one version (:func:`reward_source`; it is in ``df.attrs["reward_source"]``, None when
    nothing depends on rewards)."""
    return _page(store, f, rule_version_id, credit, offset, sort, False)


def scores_scope(f: RolloutFilter, sort: tuple[str, bool] | None = None) -> bool:
    """Whether :func:`rollout_table` scores every row under ``f`` before it cuts the page: the order
    depends on rewards (a sort by reward or advantage), (nearly) every row is asked for, or a reward
    range narrowed by whole-group conditions or a prompt text (a run's rows: scoring them whole, under
    one version, costs less than checking the range row by row). Otherwise the page is cut from the
    rollouts first (correctness, and a reward range over the whole store, are conditions on rows) and
    only its groups are scored."""
    narrowed = whole_group_conditions(f)[0] != ["TRUE"] or bool(f.prompt_contains)
    return ((sort is not None and sort[0] not in ROLLOUT_SORTS) or f.limit > PAGE_FIRST_MAX
            or (has_range(f) and narrowed))


def rollout_table_counted(store: Store, f: RolloutFilter = RolloutFilter(), rule_version_id: str | None = None,
                          credit: Credit | None = None, offset: int = 0,
                          sort: tuple[str, bool] | None = None) -> tuple[pd.DataFrame, int | None]:
    """:func:`rollout_table`'s page, and how many rows ``f`` keeps over all its pages where that came
    with the page: counted in the same pass where the page came from scoring the whole scope
    (:func:`scores_scope`) and is not empty, or by :func:`reward_source`'s read (a reward range over
    the whole store). None: ask :func:`rollout_table_count` (from ``rollouts`` alone)."""
    source = reward_source(store, f, rule_version_id) if _depends_on_rewards(f, sort) else None
    version, source = _resolved(store, f, rule_version_id, sort, source)
    df = _page(store, f, rule_version_id, credit, offset, sort, True, source)
    if "_total" in df.columns:
        total = df.pop("_total")
        return df, (int(total.iloc[0]) if len(df) else None)
    if source is not None and source.n_in_range is not None and has_range(f) and version == source.version:
        return df, source.n_in_range
    return df, None


def rollout_table_count(store: Store, f: RolloutFilter = RolloutFilter(), rule_version_id: str | None = None,
                        credit: Credit | None = None) -> int:
    """How many rows :func:`rollout_table` has under ``f`` over all its pages (``f.limit`` aside).

    Counted from ``rollouts`` alone (a 1M-rollout store counts in milliseconds); with a reward range,
    the ``total`` rows in range of the version :func:`reward_source` picks, of the filter's rollouts
    (over the whole store, that read counted them; a version scores a rollout once).
    """
    conds, params = whole_group_conditions(f)
    row_conds, row_params = row_conditions(f)
    conds, params = conds + row_conds, params + row_params
    if f.prompt_contains:  # contains(), as the table matches: % and _ are characters
        conds.append("contains(lower(p.text), lower(?))")
        params.append(f.prompt_contains.strip())
    if has_range(f):
        source = reward_source(store, f, rule_version_id)
        version = source.version
        if version is None:  # each rollout's latest scoring, and none has a reward: nothing is in range
            return 0
        if source.n_in_range is not None:
            return source.n_in_range
        # the filter's rollouts, then the reward rows of just those, read through their id range
        ids, iparams = _in_range_ids(f, version, "scoped")
        return int(store.scalar(f"""WITH scoped AS MATERIALIZED (
                                        SELECT ro.rollout_id FROM rollouts ro JOIN prompts p USING (prompt_id)
                                        JOIN runs r USING (run_id) WHERE {' AND '.join(conds)})
                                    SELECT count(*) FROM ({ids})""", params + iparams))
    return int(store.scalar(f"""SELECT count(*) FROM rollouts ro JOIN prompts p USING (prompt_id)
                                JOIN runs r USING (run_id) WHERE {' AND '.join(conds)}""", params))

