"""Which tokens are forks: the entropy quantile rule (TRL's ``top_entropy_quantile``) or an absolute threshold.

A *forking token* is one whose entropy is at or above the (1 - q) quantile of the token
entropies in a scope (a run, one training step of a run, or the rollouts the table filter
keeps), or above an absolute threshold in nats. With linear interpolation between order
statistics this is exactly TRL's ``top_entropy_quantile`` rule
(``GRPOTrainer.get_high_entropy_mask``: ``torch.quantile(entropies, 1 - q)`` over the
batch's completion tokens, keep ``entropy >= threshold``), where the batch is one
training step; DuckDB's ``quantile_cont`` and numpy's default ``quantile`` interpolate the
same way. :func:`studio.queries.forks.threshold` computes it over a scope of the store.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_Q = 0.2
SCOPES = {"run": "this rollout's run", "step": "this rollout's training step", "filter": "the table's filter"}


def quantile_threshold(entropies: np.ndarray, q: float = DEFAULT_Q) -> float:
    """The entropy at the (1 - q) quantile (linear interpolation, as ``torch.quantile``).

    >>> quantile_threshold(np.array([0.0, 1.0, 2.0, 3.0, 4.0]), q=0.25)
    3.0
    """
    if not 0.0 < q <= 1.0:
        raise ValueError(f"q must be in (0, 1], got {q}")
    return float(np.quantile(np.asarray(entropies, dtype=np.float64), 1.0 - q))


def fork_mask(entropies: np.ndarray, threshold: float) -> np.ndarray:
    """True for forking tokens: entropy at or above ``threshold`` (TRL keeps ``>=`` too).

    >>> fork_mask(np.array([0.1, 0.5, 0.9]), 0.5).tolist()
    [False, True, True]
    """
    return np.asarray(entropies) >= threshold


@dataclass(frozen=True)
class ForkRule:
    """Which tokens count as forks: the top ``q`` share by entropy in ``scope``, or every
    token at or above ``absolute`` nats when that is set."""

    q: float = DEFAULT_Q
    absolute: float | None = None
    scope: str = "run"

    def validate(self) -> None:
        if not 0.0 < self.q <= 1.0:
            raise ValueError(f"fork share q must be in (0, 1], got {self.q}")
        if self.absolute is not None and not (self.absolute >= 0 and np.isfinite(self.absolute)):
            raise ValueError(f"absolute entropy threshold must be a finite number of nats >= 0, got {self.absolute}")
        if self.scope not in SCOPES:
            raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {self.scope!r}")

    def describe(self) -> str:
        if self.absolute is not None:
            return f"entropy ≥ {self.absolute:.2f} nats"
        return f"top {self.q:.0%} by entropy in {SCOPES[self.scope]}"


@dataclass(frozen=True)
class Threshold:
    """The entropy a token needs to be a fork, over ``n_tokens`` tokens of the scope."""

    value: float | None
    n_tokens: int
    share: float | None  # fraction of the scope's tokens at or above it
    rule: ForkRule
