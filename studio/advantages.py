"""Advantage estimators: pure functions of group rewards, and their SQL twins.

Advantages are derived, not stored: the SQL forms compute them inside DuckDB with window
functions over the stored rewards, and the numpy forms are the reference they are tested
against.
"""
from __future__ import annotations

import numpy as np

GRPO_EPS = 1e-4  # TRL's GRPOTrainer adds 1e-4 to the group std
EQUAL_TOL = 1e-9  # rewards closer than this count as equal: the group gets exactly A = 0


def grpo(rewards: np.ndarray, groups: np.ndarray, eps: float = GRPO_EPS) -> np.ndarray:
    """GRPO group-normalised advantage (Shao et al., DeepSeekMath).

    A_i = (r_i - mean(r_g)) / (std(r_g) + eps), with the sample standard deviation
    (Bessel-corrected, as ``torch.std`` in TRL's GRPOTrainer) over the completions g that
    share the rollout's group. A group whose rewards are all equal gets A = 0 everywhere;
    a group of one has an undefined std and gets A = 0 too. (Exactly 0: computing
    r - mean(r) for equal rewards would leave float residue like -3e-13.)

    >>> grpo(np.array([1.0, 0.0, 1.0, 0.0]), np.array([0, 0, 0, 0])).round(3).tolist()
    [0.866, -0.866, 0.866, -0.866]
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    groups = np.asarray(groups)
    adv = np.zeros_like(rewards)
    for g in np.unique(groups):
        idx = groups == g
        r = rewards[idx]
        if r.size < 2 or np.ptp(r) <= EQUAL_TOL:
            continue
        adv[idx] = (r - r.mean()) / (r.std(ddof=1) + eps)
    return adv


def all_equal_groups(rewards: np.ndarray, groups: np.ndarray, tol: float = EQUAL_TOL) -> set:
    """Groups whose rewards are all equal: advantage collapse, no learning signal."""
    rewards, groups = np.asarray(rewards, dtype=np.float64), np.asarray(groups)
    return {g for g in np.unique(groups) if np.ptp(rewards[groups == g]) <= tol}


def grpo_sql(reward: str = "reward", group: str = "group_id", eps: float = GRPO_EPS) -> str:
    """SQL expression for :func:`grpo` over a relation with ``reward`` and ``group`` columns.

    ``stddev_samp`` is NULL for a one-row group and ``coalesce`` turns that into 0; an
    all-equal group (spread <= ``EQUAL_TOL``) gets exactly 0, matching the numpy form.
    """
    win = f"OVER (PARTITION BY {group})"
    return (f"CASE WHEN max({reward}) {win} - min({reward}) {win} <= {EQUAL_TOL!r} THEN 0.0 ELSE "
            f"coalesce(({reward} - avg({reward}) {win}) / (stddev_samp({reward}) {win} + {float(eps)!r}), 0.0) END")
