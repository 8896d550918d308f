"""The training-inference mismatch inside a mini-run: the correction's importance weights and the
step's mismatch metrics.

The sampler (the overlapped sampler process, or the in-process sampling; in the run's
``sampler_precision``) reports the behaviour log-prob of each token it draws; the trainer's
first forward pass of the step gives the same token's log-prob under the weights the step started
from (π_old, the proximal policy of decoupled PPO). With Δ = log π_old − log π_behaviour and
r = exp(Δ), the corrections weigh each token's policy-gradient term as verl's decoupled
``rollout_is`` / ``rollout_rs`` do (:func:`backends.trainer.policy_loss`'s ``is_weights``):

- ``tis`` (truncated IS): w = min(r, C);
- ``mis`` (masked IS) and ``icepop`` (IcePop's band): w = r when low ≤ r ≤ C, else 0 (dropped).

Torch is imported inside the functions.
"""
from __future__ import annotations

import numpy as np

from studio.runs.training.config import MiniRunConfig


def is_weights(d, method: str, low: float, high: float):
    """Importance weights of tokens with Δ ``d`` (a torch tensor, NaN allowed on untrained tokens) under
    ``method``: ``tis`` min(r, high), ``mis`` / ``icepop`` r inside [low, high] else 0.

    >>> import torch
    >>> d = torch.log(torch.tensor([0.25, 1.0, 3.0]))
    >>> [round(w, 4) for w in is_weights(d, "tis", 0.0, 2.0).tolist()]   # r = 0.25, 1, 3: only 3 is capped, at 2
    [0.25, 1.0, 2.0]
    >>> [round(w, 4) for w in is_weights(d, "mis", 0.5, 2.0).tolist()]   # 0.25 and 3 leave [0.5, 2]: dropped
    [0.0, 1.0, 0.0]
    """
    import torch

    r = torch.exp(d)
    if method == "tis":
        return torch.clamp(r, max=high)
    if method in ("mis", "icepop"):
        return torch.where((r >= low) & (r <= high), r, torch.zeros_like(r))
    raise ValueError(f"unknown correction {method!r}; choose from tis, mis, icepop")


def correction_fn(cfg: MiniRunConfig):
    """The callable :func:`backends.trainer.backward` takes as ``correction`` (``(old, behaviour, mask)
    -> weights``), or None for ``correction = none``."""
    if cfg.correction == "none":
        return None
    low, high = cfg.correction_band()

    def weights(old, behaviour, mask):
        return is_weights(old - behaviour, cfg.correction, low, high) * mask

    return weights


def step_metrics(train: list[np.ndarray], behaviour: list[np.ndarray], masks: list[np.ndarray],
                 cfg: MiniRunConfig) -> dict[str, float]:
    """The step's mismatch over its trained tokens (Δ = train − behaviour log-prob, r = exp Δ):

    - ``mismatch/k1``: mean −Δ (k1 estimate of KL(π_behaviour ‖ π_train), verl's ``rollout_corr/kl``),
    - ``mismatch/k3``: mean r − 1 − Δ (k3 estimate, ≥ 0; verl's ``rollout_corr/k3_kl``, prime-rl's ``mismatch_kl``),
    - ``mismatch/abs_delta_mean`` and ``mismatch/abs_delta_max``: |Δ| (slime's
      ``train_rollout_logprob_abs_diff``, verl's ``training/rollout_probs_diff_*`` on log-probs),

    and with a correction: ``is/weight_mean`` (mean w), ``is/clipped_share`` (TIS: r > C) and
    ``is/masked_share`` (MIS, ICEPOP: r outside [low, C]; verl's ``rollout_is_ratio_fraction_high + low``).
    """
    d = np.concatenate([(t - b)[m] for t, b, m in zip(train, behaviour, masks, strict=True)]).astype(np.float64)
    d = d[np.isfinite(d)]
    if not d.size:
        return {}
    r = np.exp(d)
    out = {"mismatch/k1": float(np.mean(-d)), "mismatch/k3": float(np.mean(r - 1 - d)),
           "mismatch/abs_delta_mean": float(np.mean(np.abs(d))), "mismatch/abs_delta_max": float(np.max(np.abs(d)))}
    if cfg.correction == "none":
        return out
    low, high = cfg.correction_band()
    if cfg.correction == "tis":
        w, clipped, masked = np.minimum(r, high), r > high, np.zeros(r.shape, bool)
    else:
        inside = (r >= low) & (r <= high)
        w, clipped, masked = np.where(inside, r, 0.0), np.zeros(r.shape, bool), ~inside
    return out | {"is/weight_mean": float(w.mean()), "is/clipped_share": float(clipped.mean()),
                  "is/masked_share": float(masked.mean())}
