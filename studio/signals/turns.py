"""Credit over the turns of agent trajectories, as pure functions: gating, normalisation, turn advantages.

A group's trajectories (the completions of one prompt) each have a list of assistant-turn
rewards (a rule's ``turn_reward``, imported per-turn scores, or information gain per turn);
tool turns are not the policy's and get no credit. The pipeline, per group:

1. :func:`gate_turns` (optional): gated reward accumulation (G-RA) — a trajectory's turn
   rewards count only when its outcome reaches τ, and the outcome sits on its last turn;
2. :func:`normalise_turns`: each turn reward normalised over the group, either over every
   turn of every trajectory (``group``) or per turn index (``index``), or left raw (``none``);
3. :func:`discounted_to_go`: a turn's advantage is its normalised reward plus the later
   ones discounted by γ (γ = 1: summed to go, the step view's form; γ = 0: the turn alone).

:func:`turn_advantages` runs 2 and 3 (1 is the caller's, with the outcomes it reads).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from studio.signals.advantages import EQUAL_TOL, GRPO_EPS

NORMALISATIONS = ("group", "index", "none")


@dataclass(frozen=True)
class TurnCredit:
    """How turn rewards become turn advantages (the sidebar's per-turn settings)."""

    norm: str = "group"
    """``group``: over every assistant turn of the group (IGPO); ``index``: per turn index
    (turn-level GRPO); ``none``: the raw rewards."""
    gamma: float = 1.0
    """Discount of later turns' rewards: 1 sums them to go, 0 keeps each turn alone."""
    tau: float | None = None
    """G-RA gate: when set, turn rewards count only in trajectories whose outcome reaches τ,
    and the outcome is added on the last assistant turn. None: no gate, turn rewards alone."""

    def validate(self) -> None:
        if self.norm not in NORMALISATIONS:
            raise ValueError(f"unknown turn normalisation {self.norm!r}; choose from {', '.join(NORMALISATIONS)}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"γ must be within [0, 1], got {self.gamma}")


def gate_turns(turn_values, outcome: float | None, tau: float) -> np.ndarray:
    """Gated reward accumulation over turns (G-RA, Sun et al. 2025, "Stabilizing Long-term
    Multi-turn RL with Gated Reward Accumulation"): R = R_out + 1[R_out ≥ τ]·Σ_k r_k.

    Returns the turn rewards that make R: each r_k kept when the outcome reaches τ (else 0),
    and R_out added on the last turn, so they sum to :func:`studio.signals.steps.gated`.
    A trajectory without an outcome (unscored) gets NaN throughout: no credit to give.

    >>> gate_turns([0.2, 0.3], 1.0, tau=1.0).tolist(), gate_turns([0.2, 0.3], 0.0, tau=1.0).tolist()
    ([0.2, 1.3], [0.0, 0.0])
    >>> gate_turns([np.nan, 0.5, np.nan], 1.0, tau=0.5).tolist()  # the last turn carries the outcome
    [nan, 0.5, 1.0]
    """
    v = np.asarray(turn_values, dtype=np.float64)
    if v.size == 0:
        return v
    if outcome is None or outcome != outcome:
        return np.full(v.size, np.nan)
    out = v.copy() if outcome >= tau else np.where(np.isnan(v), np.nan, 0.0)
    out[-1] = (0.0 if np.isnan(out[-1]) else out[-1]) + float(outcome)
    return out


def normalise_turns(turn_values: list[np.ndarray], norm: str = "group", eps: float = GRPO_EPS) -> list[np.ndarray]:
    """Turn rewards of a group's trajectories normalised over the group, r̃ = (r − mean) / (std + ε)
    with the sample std (as GRPO's):

    - ``group``: over every turn reward of the group together (IGPO, Wang et al. 2025,
      "Information Gain-based Policy Optimization", and DeepSeekMath's process supervision);
    - ``index``: over the k-th turns of the trajectories that have one (turn-level GRPO, Zeng et
      al. 2025, "Reinforcing Multi-Turn Reasoning in LLM Agents via Turn-Level Credit Assignment");
    - ``none``: the rewards as they are.

    A turn without a reward (NaN) is left out of the statistics and gets r̃ = 0; rewards that are
    all equal (or one alone) normalise to 0 — no learning signal, as for sequence advantages.

    >>> # group: mean 0.5, std 0.5774 over the four turns
    >>> [a.round(3).tolist() for a in normalise_turns([np.array([1.0, 0.0]), np.array([1.0, 0.0])])]
    [[0.866, -0.866], [0.866, -0.866]]
    >>> # per index: turn 0 is 1 and 0 (±0.707); turn 1 is equal (0), turn 2 has one trajectory (0)
    >>> [a.round(3).tolist() for a in normalise_turns([np.array([1.0, 1, 5]), np.array([0.0, 1])], "index")]
    [[0.707, 0.0, 0.0], [-0.707, 0.0]]
    """
    if norm not in NORMALISATIONS:
        raise ValueError(f"unknown turn normalisation {norm!r}; choose from {', '.join(NORMALISATIONS)}")
    vals = [np.asarray(v, dtype=np.float64) for v in turn_values]
    if norm == "none":
        return [np.nan_to_num(v) for v in vals]
    if norm == "group":
        return _split(_standardise(np.concatenate(vals) if vals else np.array([]), eps), vals)
    out = [np.zeros(v.size) for v in vals]
    for k in range(max((v.size for v in vals), default=0)):
        have = [i for i, v in enumerate(vals) if v.size > k]
        z = _standardise(np.array([vals[i][k] for i in have]), eps)
        for i, x in zip(have, z, strict=True):
            out[i][k] = x
    return out


def _standardise(x: np.ndarray, eps: float) -> np.ndarray:
    """(x − mean) / (std + ε) over the finite entries; NaN entries, all-equal or single values give 0."""
    known = x[~np.isnan(x)]
    if known.size < 2 or np.ptp(known) <= EQUAL_TOL:
        return np.zeros(x.size)
    return np.where(np.isnan(x), 0.0, (x - known.mean()) / (known.std(ddof=1) + eps))


def _split(flat: np.ndarray, like: list[np.ndarray]) -> list[np.ndarray]:
    cuts = np.cumsum([v.size for v in like])[:-1]
    return np.split(flat, cuts) if like else []


def discounted_to_go(values, gamma: float = 1.0) -> np.ndarray:
    """A_k = Σ_{j ≥ k} γ^(j−k)·r̃_j: a turn answers for itself and (discounted) for what follows.

    >>> discounted_to_go([1.0, 2.0, 4.0]).tolist(), discounted_to_go([1.0, 2.0, 4.0], 0.5).tolist()
    ([7.0, 6.0, 4.0], [3.0, 4.0, 4.0])
    >>> discounted_to_go([1.0, 2.0], 0.0).tolist()  # γ = 0: each turn alone
    [1.0, 2.0]
    """
    v = np.asarray(values, dtype=np.float64)
    out = np.zeros(v.size)
    acc = 0.0
    for k in range(v.size - 1, -1, -1):
        acc = v[k] + gamma * acc
        out[k] = acc
    return out


def turn_advantages(turn_values: list[np.ndarray], norm: str = "group", gamma: float = 1.0,
                    eps: float = GRPO_EPS) -> list[np.ndarray]:
    """Each trajectory's advantage per assistant turn: its turn rewards normalised over the group
    (:func:`normalise_turns`), then discounted to go (:func:`discounted_to_go`) — IGPO's turn
    advantage with ``group`` and γ; with ``group`` and γ = 1 it is
    :func:`studio.signals.steps.step_advantages` over turns.

    >>> # two trajectories, turn rewards [1, 0] and [1, 1]: mean 0.75, std 0.5 → r̃ 0.5 / −1.5, summed to go
    >>> [a.round(3).tolist() for a in turn_advantages([np.array([1.0, 0.0]), np.array([1.0, 1.0])])]
    [[-1.0, -1.5], [1.0, 0.5]]
    """
    return [discounted_to_go(v, gamma) for v in normalise_turns(turn_values, norm, eps)]
