"""The read side: SQL builders that return ``(sql, params)`` and thin runners over them.

Every view reads the store through this package (widgets never write SQL). Its modules:

- :mod:`~studio.queries.scoring`: rollouts with reward, accuracy and advantage under an
  estimator (:func:`scored_rollouts_sql`), the rule version shown per rollout.
- :mod:`~studio.queries.filters`: what the table shows (:class:`RolloutFilter`) as conditions on
  the rollouts.
- :mod:`~studio.queries.table`: the rollout table under a :class:`RolloutFilter`, one page at a
  time, sorted and counted.
- :mod:`~studio.queries.mismatch`: training–inference mismatch: one rollout's Δ per token, sequence
  summaries, the Mismatch tab's distributions, worst tokens, corrections, drift and engines.
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
from studio.queries.filters import MAX_TABLE_ROWS, RolloutFilter
from studio.queries.mismatch import (
    Distributions,
    by_step,
    correction_shares,
    distributions,
    engine_comparison,
    mismatch_sources,
    rollout_mismatch,
    sequence_summaries,
    worst_tokens,
)
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
    MISMATCH_SORTS,
    PAGE_FIRST_MAX,
    ROLLOUT_SORTS,
    TABLE_SORTS,
    rollout_table,
    rollout_table_count,
    rollout_table_counted,
    rollout_table_sql,
    scores_scope,
)

__all__ = [
    "Distributions", "GROUP_OF", "MAX_TABLE_ROWS", "MISMATCH_SORTS", "PAGE_FIRST_MAX", "ROLLOUT_SORTS", "TABLE_SORTS", "TOKEN_COLUMNS",
    "RolloutFilter", "ScoredGroup", "components", "group", "groups", "picked_sql", "prompt_of_row",
    "read_ahead", "reward_bounds", "rollout", "rollout_count", "rollout_table", "rollout_table_count",
    "rollout_table_counted", "rollout_table_sql", "runs", "sample_prompts", "scored_group",
    "scored_rollouts_sql", "scores_scope", "settled", "tokens", "tokens_of", "versions_sql",
    "by_step", "correction_shares", "distributions", "engine_comparison", "mismatch_sources", "rollout_mismatch",
    "sequence_summaries", "worst_tokens",
]
