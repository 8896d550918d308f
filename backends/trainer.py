"""The mini-run's training side: the clipped policy-gradient loss and one GRPO step.

Runs only in the mini-run's worker process (imports torch). The owner process (server or
CLI, :mod:`studio.runs.minirun`) starts the worker, receives every finished step as plain data
and writes it to the store; nothing here touches the store.

One training step (:func:`policy_loss` and :func:`backward`), as TRL's ``GRPOTrainer`` does it with
``num_iterations`` = μ:

1. sample ``group_size`` completions for each of ``prompts_per_step`` prompts with the
   current policy (the studio's own sampler, with per-token statistics);
2. score them with the reward (a callable the worker was given);
3. advantages with the chosen estimator (:mod:`studio.signals.advantages`, the same functions
   the views use), per completion;
4. μ optimiser updates on :func:`policy_loss` over the batch; the first update's
   log-probs are π_old (detached), the reference policy's (frozen copy of the start
   weights) give the KL term. With a mismatch correction (decoupled, as verl's TIS / MIS), the
   sampler's log-probs are the behaviour policy and per-token importance weights w, computed from
   π_old and them, multiply the policy-gradient term (:func:`backward`'s ``correction``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from .policy import cache_kwargs, kv_cache

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo")


def policy_loss(logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                eps_low: float = 0.2, eps_high: float | None = None, beta: float = 0.0,
                ref_logps: torch.Tensor | None = None, entropy_mask: torch.Tensor | None = None,
                loss_type: str = "grpo", max_completion_length: int | None = None,
                kl_ratio_correction: bool = True, is_weights: torch.Tensor | None = None,
                ) -> tuple[torch.Tensor, dict[str, float]]:
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

    ``mask`` is padding and the loss mask together (:func:`completion_logps` makes it): a token
    outside it (padding, a tool response's token in an agent trajectory) contributes nothing,
    neither to the loss nor to the length it is averaged over, and its gradient is exactly 0.
    Its ``old_logps`` / ``ref_logps`` may be NaN (a tool token has no policy statistics): they
    are never read. (An entropy-masked token, by contrast, still counts in the length.)

    ``is_weights`` (``[B, T]``, detached; None: 1) are the training-inference mismatch's
    importance weights w (TIS, MIS, ICEPOP): they multiply the policy-gradient term of each
    token, as verl's decoupled correction does (``pg_losses * rollout_is_weights``), so
    ℓ_{i,t} = -w_{i,t}·min(ρ·A_i, clip(ρ)·A_i)·m^H_{i,t} + β·KL_{i,t}; a token with w = 0 (masked)
    adds nothing but still counts in the length.

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
    keep = mask > 0
    mask = keep.to(logps.dtype)
    # outside the mask π_old and π_ref read as π (ratio 1, KL 0): a NaN there never reaches a sum or a gradient
    old_logps = torch.where(keep, old_logps, logps.detach())
    if ref_logps is not None:
        ref_logps = torch.where(keep, ref_logps, logps.detach())
    ratio = torch.exp(logps - old_logps)
    clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    per_token = -torch.min(ratio * adv, clipped * adv)
    if entropy_mask is not None:
        per_token = per_token * entropy_mask
    if is_weights is not None:  # a tool token's weight may be NaN: torch.where below drops it, gradient included
        per_token = per_token * torch.where(keep, is_weights.detach(), 0.0)
    kl = None
    if beta != 0.0:
        if ref_logps is None:
            raise ValueError("β > 0 needs the reference policy's log-probs (ref_logps)")
        d = ref_logps - logps
        kl = torch.exp(d) - d - 1
        per_token = per_token + beta * (kl * ratio if kl_ratio_correction else kl)
    per_token = torch.where(keep, per_token, 0.0)  # a masked token adds an exact 0, and gets an exact 0 gradient
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
                     with_entropy: bool = False, loss_masks: list | None = None,
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Per-token log π(completion token | context) for a batch, with gradients.

    ``loss_masks`` (per row, a [T] bool sequence; None: every token trained) is each
    completion's loss mask: an agent trajectory's tool-response tokens are False. They stay in
    the context the later tokens read (the policy saw them), but the returned ``mask`` is 0 on
    them as on padding, so :func:`policy_loss` neither trains on them nor counts them.

    Prompts are left-padded and completions right-padded, with position ids counted over
    the real tokens (as the sampler counts them), so a log-prob here equals the one
    recorded while sampling. Rows that share a prompt (a GRPO group) share its forward pass:
    each distinct prompt is run once and its KV cache, gradients attached, serves every row
    of it (as the sampler shares a group's prefill), so a chat template's long prompt is not
    paid for once per completion. Returns ``(logps [B, C], mask [B, C], entropies [B, C] or None)``.
    """
    device = next(model.parameters()).device
    C = max(1, max(map(len, completion_ids)))
    distinct: dict[tuple[int, ...], int] = {}
    row_prompt = [distinct.setdefault(tuple(p), len(distinct)) for p in prompt_ids]
    if len(distinct) < len(prompt_ids):
        logits, comp, mask = _shared_prompt_logits(model, list(distinct), row_prompt, completion_ids, C, pad_id, device)
    else:
        logits, comp, mask = _whole_logits(model, prompt_ids, completion_ids, C, pad_id, device)
    logp_all = torch.log_softmax(logits, -1)  # [B, C, V]: row j predicts completion token j
    logps = logp_all.gather(-1, comp[..., None]).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
    mask = mask.to(logps.dtype)
    if loss_masks is not None:
        mask = mask * _right_padded_mask(loss_masks, C, mask.device)
    return logps, mask, ent


def _right_padded_mask(loss_masks: list, C: int, device) -> torch.Tensor:
    """Per-row loss masks as one [B, C] float tensor (1 = trained), 0 past each row's end."""
    out = torch.zeros(len(loss_masks), C)
    for b, m in enumerate(loss_masks):
        m = torch.as_tensor(np.asarray(m, dtype=np.float32))
        out[b, :len(m)] = m
    return out.to(device)


def _left_padded(prompt_ids: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    P = max(map(len, prompt_ids))
    ids = torch.full((len(prompt_ids), P), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for b, p in enumerate(prompt_ids):
        ids[b, P - len(p):] = torch.tensor(p)
        attn[b, P - len(p):] = 1
    return ids.to(device), attn.to(device)


def _right_padded(completion_ids: list[list[int]], C: int, pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.full((len(completion_ids), C), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for b, c in enumerate(completion_ids):
        if c:
            ids[b, :len(c)] = torch.tensor(c)
            attn[b, :len(c)] = 1
    return ids.to(device), attn.to(device)


def _whole_logits(model, prompt_ids, completion_ids, C: int, pad_id: int, device):
    """Each row's prompt and completion in one forward pass: the logits predicting its completion."""
    p_ids, p_attn = _left_padded(prompt_ids, pad_id, device)
    c_ids, c_attn = _right_padded(completion_ids, C, pad_id, device)
    ids, attn = torch.cat([p_ids, c_ids], 1), torch.cat([p_attn, c_attn], 1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=C + 1).logits[:, :-1].float()
    return logits, c_ids, c_attn


def _shared_prompt_logits(model, prompts, row_prompt: list[int], completion_ids, C: int, pad_id: int, device):
    """The distinct prompts run once (KV cache kept, with gradients), their cache gathered to the rows,
    then every row's completion run on it: the same logits as :func:`_whole_logits`."""
    p_ids, p_attn = _left_padded([list(p) for p in prompts], pad_id, device)
    out = model(input_ids=p_ids, attention_mask=p_attn, position_ids=(p_attn.cumsum(-1) - 1).clamp(min=0),
                use_cache=True, logits_to_keep=1)
    rows = torch.as_tensor(row_prompt, device=device)
    first = out.logits[:, -1].float()[rows]  # [B, V]: predicts each row's first completion token
    c_ids, c_attn = _right_padded(completion_ids, C, pad_id, device)
    if C == 1:
        return first[:, None], c_ids, c_attn
    past = kv_cache(out)
    past.batch_select_indices(rows)  # the prompts' keys and values, one copy per row (differentiable)
    attn = torch.cat([p_attn[rows], c_attn[:, :-1]], 1)
    pos = p_attn.sum(-1)[rows][:, None] + torch.arange(C - 1, device=device)[None]
    rest = model(input_ids=c_ids[:, :-1], attention_mask=attn, position_ids=pos, **cache_kwargs(past)).logits.float()
    return torch.cat([first[:, None], rest], 1), c_ids, c_attn


def length_buckets(lengths: list[int], max_buckets: int = 4, overhead: int = 64) -> list[np.ndarray]:
    """Split a batch into at most ``max_buckets`` micro-batches of similar lengths.

    Each micro-batch is padded only to its own longest sequence, so sorting by length and
    cutting where it saves most removes most padding (completions of a group often differ
    by 2x). The cuts minimise Σ rows × longest length + ``overhead`` tokens per extra
    micro-batch (the fixed cost of one more forward and backward pass), by dynamic
    programming over at most 64 candidate cut points. Returns index arrays into the batch.

    >>> [b.tolist() for b in length_buckets([10, 100, 11, 98], overhead=8)]
    [[0, 2], [3, 1]]
    """
    n = len(lengths)
    order = np.argsort(np.asarray(lengths), kind="stable")
    if n == 0:
        return []
    srt = np.asarray(lengths)[order]
    cands = np.unique(np.linspace(0, n, min(n, 64) + 1).round().astype(int))  # cut positions, 0 and n included
    m = len(cands)
    best = np.full((max_buckets + 1, m), np.inf)  # best[k, j]: first cands[j] rows in k micro-batches
    back = np.zeros((max_buckets + 1, m), dtype=int)
    best[0, 0] = 0.0
    for k in range(1, max_buckets + 1):
        for j in range(1, m):
            c = best[k - 1, :j] + (cands[j] - cands[:j]) * srt[cands[j] - 1] + (overhead if k > 1 else 0)
            back[k, j] = int(np.argmin(c))
            best[k, j] = c[back[k, j]]
    k = int(np.argmin(best[:, m - 1]))
    cuts, j = [], m - 1
    while k > 0:
        i = back[k, j]
        cuts.append((cands[i], cands[j]))
        j, k = i, k - 1
    return [order[a:b] for a, b in reversed(cuts)]


@dataclass
class MicroBatch:
    """Part of a training batch: its rows' token ids, loss masks and advantages, and its share of
    the batch's loss (``weight``: rows / batch rows, or trained tokens / batch trained tokens for
    ``bnpo``)."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    advantages: torch.Tensor  # [b]
    weight: float
    n_tokens: int  # trained tokens (the loss mask's True entries)
    entropy_mask: torch.Tensor | None = None  # [b, C_b]
    loss_masks: list[np.ndarray] | None = None  # per row [T] bool; None: every token trained
    old_logps: torch.Tensor | None = None  # [b, C_b]; None: this pass's own, detached (μ = 1)
    ref_logps: torch.Tensor | None = None  # [b, C_b]
    behaviour_logps: torch.Tensor | None = None  # [b, C_b]: the sampler's log-probs (a mismatch correction reads them)
    # set by the first backward: the log-probs under the weights the step started from (detached), and the
    # correction's weights (None: no correction)
    train_logps: torch.Tensor | None = None  # [b, C_b]
    is_weights: torch.Tensor | None = None  # [b, C_b]


def micro_batches(prompt_ids: list[list[int]], completion_ids: list[list[int]], advantages: torch.Tensor,
                  buckets: list[np.ndarray], loss_type: str = "grpo",
                  entropy_mask: torch.Tensor | None = None, loss_masks: list | None = None) -> list[MicroBatch]:
    """The batch cut along ``buckets`` (see :func:`length_buckets`), with loss weights such
    that Σ weight × ``policy_loss(micro-batch)`` equals ``policy_loss(batch)`` for every
    loss type: ``grpo`` and ``dr_grpo`` average over completions (weight = rows share),
    ``bnpo`` over trained tokens (weight = trained-token share). ``loss_masks``: per row, the
    completion's loss mask (None: every token trained)."""
    trained = [len(c) if loss_masks is None else int(np.count_nonzero(m))
               for c, m in zip(completion_ids, loss_masks or completion_ids, strict=True)]
    n_rows, n_tok = len(completion_ids), sum(trained)
    out = []
    for idx in buckets:
        c = [completion_ids[i] for i in idx]
        toks = sum(trained[i] for i in idx)
        w = (toks / max(1, n_tok)) if loss_type == "bnpo" else len(idx) / max(1, n_rows)
        width = max(1, max(map(len, c)))
        ti = torch.as_tensor(np.asarray(idx), device=advantages.device)
        em = None if entropy_mask is None else entropy_mask[ti, :width]
        lm = None if loss_masks is None else [np.asarray(loss_masks[i], dtype=bool) for i in idx]
        out.append(MicroBatch([prompt_ids[i] for i in idx], c, advantages[ti], w, toks, em, lm))
    return out


def backward(model, batches: list[MicroBatch], pad_id: int, correction=None, **loss_kw) -> tuple[float, dict[str, float]]:
    """Forward and backward over the micro-batches (gradients accumulate in ``model``):
    the gradient of the whole batch's :func:`policy_loss`. Returns the loss and the
    statistics averaged over the batch's tokens.

    The first call of a step (``mb.train_logps`` still None) keeps each micro-batch's log-probs
    under the weights the step started from (``train_logps``, detached: the trainer's recomputed
    log-probs of the sampled tokens, no extra forward pass) and, given ``correction`` (a callable
    ``(old_logps, behaviour_logps, mask) -> weights``, each ``[b, C]``), the importance weights
    from π_old and the sampler's ``behaviour_logps``, which every update of the step reuses."""
    total, stats = 0.0, {"clip_frac": 0.0, "kl": 0.0, "ratio_mean": 0.0}
    n_tok = max(1, sum(mb.n_tokens for mb in batches))
    for mb in batches:
        logps, mask, _ = completion_logps(model, mb.prompt_ids, mb.completion_ids, pad_id, loss_masks=mb.loss_masks)
        old = mb.old_logps if mb.old_logps is not None else logps.detach()
        if mb.train_logps is None:
            mb.train_logps = logps.detach()
            if correction is not None:
                mb.is_weights = correction(old, mb.behaviour_logps, mask)
        loss, st = policy_loss(logps, old, mb.advantages, mask, ref_logps=mb.ref_logps, entropy_mask=mb.entropy_mask,
                               is_weights=mb.is_weights, **loss_kw)
        (loss * mb.weight).backward()
        total += float(loss.detach()) * mb.weight
        for k in stats:
            stats[k] += st[k] * mb.n_tokens / n_tok
    return total, stats


@dataclass
class StepOutput:
    """What one training step hands back to the owner (plain data, picklable)."""

    step: int
    generations: list  # backends.types.Generation, prompt-major
    prompt_index: list[int]  # per generation: index into the step's prompts
    prompts: list[str]
    rewards: list[dict[str, float | None]]  # per generation: component -> value ('total' included)
    advantages: list[float]  # per generation: the advantage the loss used
    token_weights: list[np.ndarray]  # per generation, per token: advantage × entropy mask × loss mask
    metrics: dict[str, float]
    reward_errors: list[dict[str, str]] = field(default_factory=list)  # per generation: component -> why it failed
    train_engine: str = ""  # what recomputed each generation's train_logprobs (the trainer's engine)


def entropy_threshold(entropies: list[np.ndarray], q: float) -> float | None:
    """The (1 - q) quantile of the batch's token entropies (TRL's ``top_entropy_quantile`` q):
    tokens at or above it are trained on. None for q >= 1 (every token). A tool response's
    tokens (NaN entropy: not the policy's) are not in the quantile."""
    if q >= 1.0:
        return None
    allv = np.concatenate([e for e in entropies if len(e)]) if any(len(e) for e in entropies) else np.zeros(0)
    allv = allv[np.isfinite(allv)]
    return float(np.quantile(allv, 1 - q)) if allv.size else None


def grad_norm(model) -> float:
    total = 0.0
    for p in model.parameters():
        if p.grad is not None:
            total += float(p.grad.detach().float().pow(2).sum())
    return math.sqrt(total)
