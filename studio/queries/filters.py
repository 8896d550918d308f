"""What the rollout table shows, as conditions on ``rollouts ro``: the :class:`RolloutFilter`, the
conditions that keep or drop whole groups (run, group, training step, branches), the conditions on
single rows (correctness, trajectories) and the reward range. The table (:mod:`studio.queries.table`)
and the views scoped like it (:mod:`studio.queries.mismatch`) build their SQL from these.
"""
from __future__ import annotations

from dataclasses import dataclass

from studio.signals.mismatch import Correction

MAX_TABLE_ROWS = 5000


@dataclass(frozen=True)
class RolloutFilter:
    """What the rollout table shows. ``None`` means no constraint."""

    run_id: str | None = None
    prompt_contains: str | None = None
    correct: bool | None = None  # rollouts.correct: True / False (unchecked rollouts, NULL, are in neither)
    reward_min: float | None = None  # total reward under one version (see reward_source)
    reward_max: float | None = None
    group_id: str | None = None
    branches_of: str | None = None  # only branches of this rollout, at any depth
    train_step: int | None = None  # only rollouts sampled at this training step (mini-runs)
    min_turns: int | None = None  # agent trajectories of at least this many turns (rollouts.n_turns; a single answer: 1)
    tool: str | None = None  # trajectories that called this tool (an assistant turn's tool_name)
    tool_errors: bool | None = None  # True: at least one failed tool call; False: none (rollouts.n_tool_errors)
    limit: int = MAX_TABLE_ROWS
    # the mismatch columns (Δ per rollout, studio.queries.mismatch): read only where a filter or sort asks
    mismatch_source: str = ""  # the recomputed log-prob: "" the stored tokens.train_logprob, else a token_scores source
    correction: Correction | None = None  # the sequence-level correction deciding ``rejected`` (None: nothing rejected)
    min_max_abs_delta: float | None = None  # rollouts whose largest |Δ| is at least this
    rejected_only: bool = False  # only rollouts the sequence-level ``correction`` rejects

# rollout ids of every branch below one rollout (one bound parameter: the rollout id)
DESCENDANTS = """
    WITH RECURSIVE down(rid, depth) AS (
        SELECT rollout_id, 1 FROM rollouts WHERE parent_rollout_id = ?
        UNION ALL
        SELECT c.rollout_id, down.depth + 1 FROM down JOIN rollouts c ON c.parent_rollout_id = down.rid
        WHERE down.depth < 100)
    SELECT rid FROM down"""


def whole_group_conditions(f: RolloutFilter) -> tuple[list[str], list]:
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


def row_conditions(f: RolloutFilter) -> tuple[list[str], list]:
    """The conditions of ``f`` on single rows of ``rollouts ro`` (correctness, the trajectory filters: no
    reward version is read to decide them) and their values. Every column they name is one of the scored
    rows' too (``scoring.SCORED_COLUMNS``), so ``ro.`` can be read as ``s.``."""
    conds, params = [], []
    if f.correct is not None:
        conds.append("ro.correct" if f.correct else "NOT ro.correct")
    if f.min_turns is not None and f.min_turns > 1:  # NULL n_turns (never counted): a single answer
        conds.append("coalesce(ro.n_turns, 1) >= ?")
        params.append(int(f.min_turns))
    if f.tool:
        conds.append("ro.rollout_id IN (SELECT rollout_id FROM turns WHERE role = 'assistant' AND tool_name = ?)")
        params.append(f.tool)
    if f.tool_errors is not None:
        conds.append("coalesce(ro.n_tool_errors, 0) > 0" if f.tool_errors else "coalesce(ro.n_tool_errors, 0) = 0")
    if f.min_max_abs_delta is not None or f.rejected_only:
        summaries, sparams = mismatch_summaries_sql(f)
        keep, kparams = ["TRUE"], []
        if f.min_max_abs_delta is not None:
            keep.append("max_abs_delta >= ?")
            kparams.append(float(f.min_max_abs_delta))
        if f.rejected_only:
            keep.append("rejected")
        conds.append(f"ro.rollout_id IN (SELECT rollout_id FROM ({summaries}) WHERE {' AND '.join(keep)})")
        params += sparams + kparams
    return conds, params


def mismatch_summaries_sql(f: RolloutFilter) -> tuple[str, list]:
    """Per-rollout mismatch summaries (:func:`studio.queries.mismatch.sequence_summaries_sql`) of the
    rollouts ``f``'s whole-group conditions keep, under ``f.mismatch_source`` and ``f.correction``: what
    the table's mismatch filters and sorts read (only when one is asked)."""
    from studio.queries.mismatch import sequence_summaries_sql  # it scopes its reads by this module's filter

    scope = RolloutFilter(run_id=f.run_id, group_id=f.group_id, train_step=f.train_step, branches_of=f.branches_of)
    return sequence_summaries_sql(scope, f.mismatch_source, f.correction)


def narrows_rows(f: RolloutFilter) -> bool:
    """Whether ``f`` has a condition on single rows (:func:`row_conditions`)."""
    return bool(row_conditions(f)[0])


def has_range(f: RolloutFilter) -> bool:
    return f.reward_min is not None or f.reward_max is not None


def range_sql(f: RolloutFilter, col: str) -> tuple[str, list]:
    """``f``'s reward range on column ``col`` (``TRUE`` without one) and its values."""
    conds, params = [], []
    if f.reward_min is not None:
        conds.append(f"{col} >= ?")
        params.append(float(f.reward_min))
    if f.reward_max is not None:
        conds.append(f"{col} <= ?")
        params.append(float(f.reward_max))
    return " AND ".join(conds) or "TRUE", params
