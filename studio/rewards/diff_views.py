"""Views over a rule diff (:class:`studio.rewards.rules.Diff`): which rollouts to show and how to
fold them, so a diff of thousands of rollouts reads in a few lines.

:func:`pick` keeps the rollouts of one view (:data:`SHOWS`: changed reward, advantage sign
flips, groups whose all-equal state changed, or all), optionally only those whose value of one
reward component changed; :func:`component_changes` counts, per component, the rollouts it
changed on; :func:`collapse` folds rollouts with the same reward change (old → new) into one
line with their count, so forty identical ``+0.750`` rows read as one ``×40`` line. Pure
functions over the diff's frames: the Reward rules tab draws them.
"""
from __future__ import annotations

import pandas as pd

from studio.rewards.rules import Diff

SHOWS = {
    "changed": "rollouts whose reward changed",
    "flips": "rollouts whose advantage changed sign (their own reward changed or their group's did)",
    "all_equal": "rollouts of groups that became or stopped being all-equal",
    "all": "every rollout both versions scored",
}
"""The views :func:`pick` offers, by key."""

DIGITS = 9
"""Rewards equal to this many decimals are the same reward when :func:`collapse` folds changes."""


def _component_changed(d: Diff, tol: float) -> pd.Series:
    """Per (rollout, component) row of ``d.components``: whether its value differs between the
    versions (a component only one version has differs)."""
    c = d.components
    one_sided = c["value_a"].isna() != c["value_b"].isna()
    return one_sided | ((c["value_b"] - c["value_a"]).abs() > tol)


def component_changes(d: Diff, tol: float = 1e-9) -> pd.DataFrame:
    """One row per reward component of either version: ``component``, ``in_a`` / ``in_b`` (whether
    that version has it) and ``changed``, the number of rollouts whose value of it changed."""
    c = d.components
    if c.empty:
        return pd.DataFrame({"component": [], "in_a": [], "in_b": [], "changed": []})
    out = (c.assign(changed=_component_changed(d, tol), in_a=c["value_a"].notna(), in_b=c["value_b"].notna())
           .groupby("component", sort=True).agg(in_a=("in_a", "any"), in_b=("in_b", "any"), changed=("changed", "sum"))
           .reset_index())
    out["changed"] = out["changed"].astype(int)
    return out


def pick(d: Diff, show: str = "changed", component: str | None = None, tol: float = 1e-9) -> pd.DataFrame:
    """The rows of ``d.rows`` that view ``show`` (a key of :data:`SHOWS`) keeps, in the diff's
    order; with ``component``, only those whose value of that component changed."""
    if show not in SHOWS:
        raise ValueError(f"unknown diff view {show!r}: one of {', '.join(SHOWS)}")
    rows = d.rows
    if show == "changed":
        rows = rows[rows["changed"]]
    elif show == "flips":
        rows = rows[rows["sign_flip"]]
    elif show == "all_equal":
        moved = pd.concat([d.became_all_equal["group_id"], d.stopped_all_equal["group_id"]])
        rows = rows[rows["group_id"].isin(moved)]
    if component:
        c = d.components
        hit = c.loc[(c["component"] == component) & _component_changed(d, tol), "rollout_id"]
        rows = rows[rows["rollout_id"].isin(hit)]
    return rows


def collapse(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` (a diff's rows) folded by their reward change: one row per distinct ``(reward_a,
    reward_b)`` with ``n`` (how many rollouts), ``reward_a``, ``reward_b``, ``delta``, ``flips`` (how
    many of them flipped their advantage's sign) and ``rollout_ids`` (in the rows' order). The
    most common change first, then the largest; the ``n`` add up to ``len(rows)``."""
    cols = ["n", "reward_a", "reward_b", "delta", "flips", "rollout_ids"]
    if rows.empty:
        return pd.DataFrame({c: [] for c in cols})
    key = rows.assign(_a=rows["reward_a"].round(DIGITS), _b=rows["reward_b"].round(DIGITS))
    out = key.groupby(["_a", "_b"], sort=False).agg(
        n=("rollout_id", "size"), reward_a=("reward_a", "first"), reward_b=("reward_b", "first"),
        flips=("sign_flip", "sum"), rollout_ids=("rollout_id", list)).reset_index(drop=True)
    out["delta"] = out["reward_b"] - out["reward_a"]
    out["flips"] = out["flips"].astype(int)
    out["_size"] = out["delta"].abs()
    out = out.sort_values(["n", "_size", "reward_a"], ascending=[False, False, True], kind="stable")
    return out[cols].reset_index(drop=True)
