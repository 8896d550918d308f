"""Which tokens are forks, the tokens where the policy was unsure: the top share by entropy
(TRL's ``top_entropy_quantile``) above a minimum entropy, or an absolute threshold.

A *forking token* is one whose entropy is at or above the (1 - q) quantile of the token
entropies in a scope (a run, one training step of a run, or the rollouts the table filter
keeps) *and* at or above a minimum entropy in nats; or, in absolute mode, at or above a fixed
threshold. With linear interpolation between order statistics the quantile is exactly TRL's
``top_entropy_quantile`` rule (``GRPOTrainer.get_high_entropy_mask``:
``torch.quantile(entropies, 1 - q)`` over the batch's completion tokens, keep ``entropy >=
threshold``), where the batch is one training step; DuckDB's ``quantile_cont`` and numpy's
default ``quantile`` interpolate the same way. A minimum of 0 gives TRL's rule alone.

Why a minimum: a well-trained policy is near-certain on most tokens, so the top 20 % of a
run's tokens starts far below any real doubt. On the sample arithmetic run the 0.8 quantile
is 0.0099 nats and 69 % of the tokens it keeps had one choice at > 90 % (the chat world: 0.0067
nats, 83 %). No token whose most likely choice had more than 90 % has an entropy above 0.48
nats in either sample world, so the default minimum, 0.5 nats, marks only tokens where the
policy was split (5.2 % of the arithmetic run's tokens, 3.0 % of the chat run's).

A branch's tokens are judged against the population of its tree's root (its run, its
step), so the prefix a branch shares with its root shows the same forks in both;
:func:`studio.queries.forks.threshold` computes the threshold over a scope of the store.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_Q = 0.2
DEFAULT_MIN_ENTROPY = 0.5  # nats: above every sample token whose top choice had > 90 % (max 0.48)
SCOPES = {"run": "the run's tokens", "step": "the training step's tokens", "filter": "the table filter's tokens"}


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
    """Which tokens count as forks: the top ``q`` share by entropy in ``scope`` that also have
    at least ``min_entropy`` nats, or every token at or above ``absolute`` nats when that is set."""

    q: float = DEFAULT_Q
    absolute: float | None = None
    scope: str = "run"
    min_entropy: float = DEFAULT_MIN_ENTROPY

    def validate(self) -> None:
        if not 0.0 < self.q <= 1.0:
            raise ValueError(f"fork share q must be in (0, 1], got {self.q}")
        for name, v in (("absolute entropy threshold", self.absolute), ("minimum fork entropy", self.min_entropy)):
            if v is not None and not (v >= 0 and np.isfinite(v)):
                raise ValueError(f"{name} must be a finite number of nats >= 0, got {v}")
        if self.scope not in SCOPES:
            raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {self.scope!r}")

    def describe(self) -> str:
        """The rule in words, e.g. "the top 20% by entropy of the run's tokens, at least 0.50 nats".

        >>> ForkRule(q=0.1, min_entropy=0).describe()
        "the top 10% by entropy of the run's tokens"
        """
        if self.absolute is not None:
            return f"entropy ≥ {self.absolute:.2f} nats"
        floor = f", at least {self.min_entropy:.2f} nats" if self.min_entropy > 0 else ""
        return f"the top {self.q:.0%} by entropy of {SCOPES[self.scope]}{floor}"


@dataclass(frozen=True)
class Threshold:
    """The entropy a token needs to be a fork, over ``n_tokens`` tokens of the scope."""

    value: float | None
    n_tokens: int
    share: float | None  # fraction of the scope's tokens at or above it
    rule: ForkRule
    quantile: float | None = None  # the top share's own threshold, before the minimum (top-share rule only)

    @property
    def floored(self) -> bool:
        """True when the minimum entropy, not the top share, sets the threshold."""
        return self.rule.absolute is None and self.quantile is not None and self.quantile < self.rule.min_entropy
