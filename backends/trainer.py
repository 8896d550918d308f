"""The mini-run's training side: the clipped policy-gradient loss and one GRPO step.

Runs only in the mini-run's worker process (imports torch). The owner process (server or
CLI, :mod:`studio.minirun`) starts the worker, receives every finished step as plain data
and writes it to the store; nothing here touches the store.

One training step (:func:`grpo_step`), as TRL's ``GRPOTrainer`` does it with
``num_iterations`` = μ:

1. sample ``group_size`` completions for each of ``prompts_per_step`` prompts with the
   current policy (the studio's own sampler, with per-token statistics);
2. score them with the reward (a callable the worker was given);
3. advantages with the chosen estimator (:mod:`studio.advantages`, the same functions
   the views use), per completion;
4. μ optimiser updates on :func:`policy_loss` over the batch; the first update's
   log-probs are π_old (detached), the reference policy's (frozen copy of the start
   weights) give the KL term.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo")


def policy_loss(logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                eps_low: float = 0.2, eps_high: float | None = None, beta: float = 0.0,
                ref_logps: torch.Tensor | None = None, entropy_mask: torch.Tensor | None = None,
                loss_type: str = "grpo", max_completion_length: int | None = None,
                kl_ratio_correction: bool = True) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped surrogate with a KL penalty (PPO clip as in GRPO; DeepSeekMath, TRL).

    Per token t of completion i, with ratio ρ = exp(log π - log π_old):

        ℓ_{i,t} = -min(ρ·A_i, clip(ρ, 1-ε_low, 1+ε_high)·A_i) · m^H_{i,t} + β·KL_{i,t}
        KL_{i,t} = exp(log π_ref - log π) - (log π_ref - log π) - 1      (k3 estimator, ≥ 0)

    With ``kl_ratio_correction`` (TRL's default ``use_bias_correction_kl``, DeepSeek-V3.2)
    the KL term is multiplied by ρ, so its gradient is unbiased for samples from π_old;
    its value is unchanged while π = π_old. ``m^H`` is the entropy mask (1 everywhere when
    None). The loss averages ℓ over the
    completion tokens (``mask``) by ``loss_type``: ``grpo``, per completion then over
    completions; ``bnpo``, over all tokens of the batch; ``dr_grpo``, the sum divided by
    (completions × ``max_completion_length``). ``advantages`` is [B] or [B, T].

    Returns the loss and statistics: ``clip_frac`` (share of tokens whose ratio left the
    clip range on the side that matters for the sign of A, TRL's ``clip_ratio/region_mean``),
    ``kl`` (mean KL per token), ``ratio_mean``.

    >>> lp = torch.tensor([[-1.0, -2.0]]); m = torch.ones(1, 2)
    >>> # ρ = 1 (π = π_old): the loss is -mean(A) over the tokens = -0.5
    >>> policy_loss(lp, lp, torch.tensor([0.5]), m)[0].item()
    -0.5
    >>> # ρ = e^0.5 ≈ 1.65 > 1.2 on a positive advantage: clipped at 1.2, loss = -1.2·A
    >>> round(policy_loss(lp + 0.5, lp, torch.tensor([1.0]), m)[0].item(), 6)
    -1.2
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"unknown loss type {loss_type!r}; choose from {', '.join(LOSS_TYPES)}")
    eps_high = eps_low if eps_high is None else eps_high
    adv = advantages if advantages.dim() == 2 else advantages.unsqueeze(1)
    mask = mask.to(logps.dtype)
    ratio = torch.exp(logps - old_logps)
    clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    per_token = -torch.min(ratio * adv, clipped * adv)
    if entropy_mask is not None:
        per_token = per_token * entropy_mask
    kl = None
    if beta != 0.0:
        if ref_logps is None:
            raise ValueError("β > 0 needs the reference policy's log-probs (ref_logps)")
        d = ref_logps - logps
        kl = torch.exp(d) - d - 1
        per_token = per_token + beta * (kl * ratio if kl_ratio_correction else kl)
    if loss_type == "grpo":
        loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif loss_type == "bnpo":
        loss = (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    else:
        if not max_completion_length:
            raise ValueError("dr_grpo normalises by max_completion_length: give it")
        loss = (per_token * mask).sum() / (per_token.size(0) * max_completion_length)
    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        region = ((ratio < 1 - eps_low) & (adv < 0)) | ((ratio > 1 + eps_high) & (adv > 0))
        stats = {"clip_frac": float((region.to(mask.dtype) * mask).sum() / n),
                 "ratio_mean": float((ratio * mask).sum() / n),
                 "kl": float((kl * mask).sum() / n) if kl is not None else 0.0}
    return loss, stats


def completion_logps(model, prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int,
                     with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Per-token log π(completion token | context) for a batch, with gradients.

    Prompts are left-padded and completions right-padded, with position ids counted over
    the real tokens (as the sampler counts them), so a log-prob here equals the one
    recorded while sampling. Returns ``(logps [B, C], mask [B, C], entropies [B, C] or None)``.
    """
    device = next(model.parameters()).device
    P, C = max(map(len, prompt_ids)), max(1, max(map(len, completion_ids)))
    ids = torch.full((len(prompt_ids), P + C), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for b, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        ids[b, P - len(p):P] = torch.tensor(p)
        attn[b, P - len(p):P] = 1
        if c:
            ids[b, P:P + len(c)] = torch.tensor(c)
            attn[b, P:P + len(c)] = 1
    ids, attn = ids.to(device), attn.to(device)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=C + 1).logits[:, :-1].float()
    logp_all = torch.log_softmax(logits, -1)  # [B, C, V]: position P-1+j predicts completion token j
    tgt = ids[:, P:]
    logps = logp_all.gather(-1, tgt[..., None]).squeeze(-1)
    mask = attn[:, P:].to(logps.dtype)
    ent = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
    return logps, mask, ent


@dataclass
class StepOutput:
    """What one training step hands back to the owner (plain data, picklable)."""

    step: int
    generations: list  # backends.types.Generation, prompt-major
    prompt_index: list[int]  # per generation: index into the step's prompts
    prompts: list[str]
    rewards: list[dict[str, float | None]]  # per generation: component -> value ('total' included)
    advantages: list[float]  # per generation: the advantage the loss used
    token_weights: list[np.ndarray]  # per generation: advantage × entropy mask, per token
    metrics: dict[str, float]


def entropy_threshold(entropies: list[np.ndarray], q: float) -> float | None:
    """The (1 - q) quantile of the batch's token entropies (TRL's ``top_entropy_quantile`` q):
    tokens at or above it are trained on. None for q >= 1 (every token)."""
    if q >= 1.0:
        return None
    allv = np.concatenate([e for e in entropies if len(e)]) if any(len(e) for e in entropies) else np.zeros(0)
    return float(np.quantile(allv, 1 - q)) if allv.size else None


def grad_norm(model) -> float:
    total = 0.0
    for p in model.parameters():
        if p.grad is not None:
            total += float(p.grad.detach().float().pow(2).sum())
    return math.sqrt(total)
