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

The formulas are :mod:`studio.signals.mismatch`'s (the same the Mismatch tab applies to stored tokens). Torch is imported inside the functions.
"""
from __future__ import annotations

import numpy as np

from studio.runs.training.config import MiniRunConfig
from studio.signals.mismatch import STATES, Correction, delta, kl_terms, token_correction


def correction_of(cfg: MiniRunConfig) -> Correction | None:
    """The run's correction as :mod:`studio.signals.mismatch` names it (its band resolved,
    :meth:`MiniRunConfig.correction_band`), or None for ``correction = none``."""
    if cfg.correction == "none":
        return None
    low, high = cfg.correction_band()
    return Correction(cfg.correction, cap=high, low=low)


def is_weights(d, c: Correction):
    """Importance weights of tokens with Δ ``d`` (a torch tensor; NaN on untrained tokens, which get 1)
    under ``c`` (:func:`studio.signals.mismatch.token_correction`: TIS min(r, C), MIS / ICEPOP r inside
    [low, C] else 0), as a tensor like ``d``.

    >>> import torch
    >>> d = torch.log(torch.tensor([0.25, 1.0, 3.0]))
    >>> [round(w, 4) for w in is_weights(d, Correction("tis", cap=2.0)).tolist()]   # only r = 3 is capped, at 2
    [0.25, 1.0, 2.0]
    >>> [round(w, 4) for w in is_weights(d, Correction("mis", cap=2.0, low=0.5)).tolist()]   # 0.25, 3 dropped
    [0.0, 1.0, 0.0]
    """
    import torch

    w, _ = token_correction(d.detach().cpu().double().numpy(), c)
    return torch.as_tensor(w, dtype=d.dtype, device=d.device)


def correction_fn(cfg: MiniRunConfig):
    """The callable :func:`backends.trainer.backward` takes as ``correction`` (``(old, behaviour, mask)
    -> weights``), or None for ``correction = none``."""
    c = correction_of(cfg)
    if c is None:
        return None
    return lambda old, behaviour, mask: is_weights(old - behaviour, c) * mask


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
    d = np.concatenate([delta(t, b)[m] for t, b, m in zip(train, behaviour, masks, strict=True)])
    d = d[np.isfinite(d)]
    if not d.size:
        return {}
    k1, _, k3 = kl_terms(d)
    out = {"mismatch/k1": float(k1.mean()), "mismatch/k3": float(k3.mean()),
           "mismatch/abs_delta_mean": float(np.abs(d).mean()), "mismatch/abs_delta_max": float(np.abs(d).max())}
    c = correction_of(cfg)
    if c is None:
        return out
    w, states = token_correction(d, c)
    return out | {"is/weight_mean": float(w.mean()), "is/clipped_share": float((states == STATES.index("clipped")).mean()),
                  "is/masked_share": float((states == STATES.index("masked")).mean())}
