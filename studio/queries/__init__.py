"""The read side: SQL builders that return ``(sql, params)`` and thin runners over them.

Every view reads the store through this package (widgets never write SQL). Its modules:

- :mod:`~studio.queries.scoring`: rollouts with reward, accuracy and advantage under an
  estimator (:func:`scored_rollouts_sql`), the rule version shown per rollout.
- :mod:`~studio.queries.table`: the rollout table under a :class:`RolloutFilter`, one page at a
  time, sorted and counted.
- :mod:`~studio.queries.reads`: one rollout, tokens of one or many rollouts, a group, the
  groups, runs, reward bounds.
- :mod:`~studio.queries.points`: one group scored from point reads and numpy twins of the
  estimators (:func:`scored_group`), which a click on a rollout uses.
- :mod:`~studio.queries.ahead`: reads started on shared reader threads (:func:`read_ahead`).
- :mod:`~studio.queries.lookups`, :mod:`~studio.queries.credit`, :mod:`~studio.queries.forks`,
  :mod:`~studio.queries.timeline`, :mod:`~studio.queries.console`: the views' named reads,
  credit under the tokens, entropy forks, timelines and run diffs, read-only SQL.

This module re-exports the names callers use as ``queries.X``. User values are always bound
parameters, never formatted into SQL.
"""
from studio.queries.ahead import read_ahead, settled
from studio.queries.points import ScoredGroup, scored_group
from studio.queries.reads import (
    TOKEN_COLUMNS,
    components,
    group,
    groups,
    prompt_of_row,
    reward_bounds,
    rollout,
    rollout_count,
    runs,
    sample_prompts,
    tokens,
    tokens_of,
)
from studio.queries.scoring import GROUP_OF, picked_sql, scored_rollouts_sql, versions_sql
from studio.queries.table import (
    MAX_TABLE_ROWS,
    PAGE_FIRST_MAX,
    ROLLOUT_SORTS,
    TABLE_SORTS,
    RolloutFilter,
    rollout_table,
    rollout_table_count,
    rollout_table_counted,
    rollout_table_sql,
    scores_scope,
)

__all__ = [
    "GROUP_OF", "MAX_TABLE_ROWS", "PAGE_FIRST_MAX", "ROLLOUT_SORTS", "TABLE_SORTS", "TOKEN_COLUMNS",
    "RolloutFilter", "ScoredGroup", "components", "group", "groups", "picked_sql", "prompt_of_row",
    "read_ahead", "reward_bounds", "rollout", "rollout_count", "rollout_table", "rollout_table_count",
    "rollout_table_counted", "rollout_table_sql", "runs", "sample_prompts", "scored_group",
    "scored_rollouts_sql", "scores_scope", "settled", "tokens", "tokens_of", "versions_sql",
]
