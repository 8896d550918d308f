"""The value each token of a strip is coloured by: its channel's own column (log-prob, entropy, the
``mismatch`` column Δ that :func:`widgets.mismatch_marks.with_mismatch` adds), the advantage, or the effective weight of an entropy-masked update (advantage × loss mask × entropy
mask, 0 on a tool response's tokens: the loss mask). The token strip, the group view's cards and
the other strips share them."""
from __future__ import annotations

import numpy as np
import pandas as pd

from studio.signals.forks import fork_mask


def channel_values(tokens: pd.DataFrame, channel: str, advantage,
                   fork_threshold: float | None = None) -> list[float | None]:
    """The value each token is coloured by.

    ``advantage`` is one number for the whole rollout (a sequence-level estimator) or one
    per token (GAE, KL in the reward). ``weight`` is the effective per-token weight of an
    entropy-masked (80/20-style) update: advantage × loss mask × entropy mask, where the loss
    mask is the tokens' ``trained`` column (False on a tool response's tokens: their weight is
    0 whatever the advantage; every token trained when there is no such column) and the
    entropy mask keeps tokens at or above ``fork_threshold``. A masked token has no advantage.
    """
    trained = tokens["trained"].tolist() if "trained" in tokens.columns else None
    return column_values(tokens[channel].tolist() if channel in tokens.columns else None,
                         tokens["entropy"].tolist(), channel, advantage, fork_threshold, trained)


def column_values(column: list | None, entropy: list, channel: str, advantage,
                  fork_threshold: float | None, trained: list | None = None) -> list[float | None]:
    """:func:`channel_values` from the token columns as lists (``column``: the channel's own)."""
    n = len(entropy)
    if advantage is None or (np.ndim(advantage) == 0 and pd.isna(advantage)):
        adv = None
    else:
        adv = np.broadcast_to(np.asarray(advantage, dtype=np.float64), (n,)).tolist()
    masked = [t is False for t in trained] if trained is not None else [False] * n  # NULL: trained
    if channel == "advantage":
        return [None] * n if adv is None else [None if m else a for a, m in zip(adv, masked)]
    if channel == "weight":
        if adv is None or fork_threshold is None:  # unknown, except where the loss mask makes it 0
            return [0.0 if m else None for m in masked]
        mask = fork_flags(entropy, fork_threshold)
        return [a if f and not m else 0.0 for a, f, m in zip(adv, mask, masked)]
    if column is None:  # a channel whose column these tokens lack (Δ of a rollout never recomputed): no values
        return [None] * n
    return [None if missing(v) else float(v) for v in column]


def missing(x) -> bool:
    """NULL, NA or NaN (a column as a list holds whichever its dtype uses)."""
    return x is None or x is pd.NA or x != x


def fork_flags(entropy: list, threshold: float | None) -> list[bool]:
    """:func:`fork_mask` of an entropy column as a list (a missing entropy is never a fork)."""
    if threshold is None or not entropy:
        return [False] * len(entropy)
    e = np.array([-1.0 if missing(x) else x for x in entropy], dtype=np.float64)
    return fork_mask(e, threshold).tolist()
