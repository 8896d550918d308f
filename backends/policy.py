"""Policy backend: sample completions with per-token statistics, and score given ones.

Works with any local transformers causal-LM folder (the sample policy, or a user's
Qwen/Llama). Statistics are computed on the fly at every decoding step from that step's
logits and the logits are dropped, so memory does not grow with vocabulary x length the
way ``generate(output_scores=True)`` does.

Every statistic describes the policy's own distribution pi(.|ctx) (temperature 1, no
top-p), whatever the sampling temperature: that is the distribution training optimises.
- ``logprob``: log pi(y_t | ctx) of the token actually generated.
- ``entropy``: H_t = -sum_v pi(v|ctx) log pi(v|ctx) over the full vocabulary (nats).
- ``topk_ids`` / ``topk_logprobs``: the k most likely tokens under pi and their logprobs.
- ``ranks`` (scoring only): each given token's rank under pi, 1 = its argmax.

A policy is loaded in a chosen precision (:data:`PRECISIONS`); every generation carries the
``engine`` that computed it (``torch <version> <device> <dtype>``), the statistics are always
computed from float32 logits of that forward pass.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

from .device import PRECISIONS, pick_device, tune_attention
from .types import Generation, PolicyLoadError, check_policy_folder, is_policy_url


def loaded_dtype(path: str | Path, device: str, precision: str = "auto") -> str:
    """The dtype name a policy folder is loaded in on ``device`` at ``precision`` (``auto``:
    float32 on CPU, else the ``dtype`` / ``torch_dtype`` of its config.json, float32 when absent)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision != "auto":
        return precision
    if device == "cpu":
        return "float32"
    import json

    try:
        cfg = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return "float32"
    name = str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32").removeprefix("torch.")
    return name if name in PRECISIONS else "float32"


def engine_name(device: str, dtype: str) -> str:
    """``torch <version> <device> <dtype>``: what computes a local policy's statistics (``rollouts.engine``)."""
    return f"torch {torch.__version__.split('+')[0]} {device} {dtype}"


@functools.cache
def _cache_name() -> str:
    """The name of a causal LM's KV cache, as a forward argument and in its output: ``cache``
    since transformers renamed it (``past_key_values`` is deprecated there), ``past_key_values``
    in the 5.x releases before."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def cache_kwargs(past) -> dict:
    """The forward keyword argument that continues from the KV cache ``past``."""
    return {_cache_name(): past}


def kv_cache(out):
    """The KV cache a forward with ``use_cache=True`` returned."""
    return out[_cache_name()]


def token_texts(tokenizer, seqs: list[list[int]], window: int = 4) -> list[list[str]]:
    """Display text of every token of every sequence; special tokens keep their names.

    Each token is decoded alone; where those pieces do not concatenate to the decoded
    sequence (multi-byte characters split across tokens, sentencepiece's leading spaces),
    that sequence's tokens are decoded in context instead: with up to ``window`` tokens
    before each, minus the decode of those tokens. Batched decode calls throughout.
    """
    flat = [[i] for ids in seqs for i in ids]
    singles = tokenizer.batch_decode(flat, skip_special_tokens=False) if flat else []
    wholes = tokenizer.batch_decode(seqs, skip_special_tokens=False)
    out, k = [], 0
    for ids, whole in zip(seqs, wholes, strict=False):
        pieces = singles[k:k + len(ids)]
        k += len(ids)
        out.append(pieces if "".join(pieces) == whole else _in_context(tokenizer, ids, window))
    return out


def _in_context(tokenizer, ids: list[int], window: int) -> list[str]:
    before = [ids[max(0, i - window):i] for i in range(len(ids))]
    upto = [ids[max(0, i - window):i + 1] for i in range(len(ids))]
    b_txt = tokenizer.batch_decode(before, skip_special_tokens=False)
    u_txt = tokenizer.batch_decode(upto, skip_special_tokens=False)
    return [u[len(b):] if u.startswith(b) else tokenizer.decode(x[-1:])
            for b, u, x in zip(b_txt, u_txt, upto, strict=False)]


def _stop_ids(model, tokenizer) -> list[int]:
    ids = model.generation_config.eos_token_id
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def _left_pad(tokenizer, prompts: list[str], device) -> tuple[torch.Tensor, torch.Tensor]:
    enc = [tokenizer(p)["input_ids"] for p in prompts]
    if any(len(e) == 0 for e in enc):
        raise ValueError("every prompt must encode to at least one token")
    width = max(map(len, enc))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (width - len(e)) + e for e in enc], device=device)  # [B, L]
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in enc], device=device)
    return ids, mask


def _check_context(model, prompt_tokens: int, max_new_tokens: int) -> None:
    """Refuse, naming the numbers, a prompt whose completion would run past the policy's context
    (its position embeddings end there: past them a model fails with an index error)."""
    limit = getattr(model.config, "n_positions", None) or getattr(model.config, "max_position_embeddings", None)
    if limit and prompt_tokens + max_new_tokens > limit:
        raise ValueError(f"a prompt of {prompt_tokens} tokens plus up to {max_new_tokens} new tokens runs past the "
                         f"policy's context of {limit} positions: shorten the prompt (a chat template and a system "
                         "prompt add tokens) or lower max new tokens")


def _sampling_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Distribution to draw from: temperature-scaled, then nucleus-truncated.  [B, V]"""
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        drop = sorted_p.cumsum(-1) - sorted_p >= top_p  # keep the smallest set reaching top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    return probs


def _draw(probs: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One token per row by inverse-CDF sampling.  probs [B, V] -> [B]

    Same distribution as ``torch.multinomial(probs, 1)``, an order of magnitude faster on
    large vocabularies (multinomial dominated a 150k-vocab decoding step).
    """
    cdf = probs.cumsum(-1)  # [B, V]
    u = torch.rand(probs.shape[0], 1, generator=gen, device=probs.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


@torch.inference_mode()
def sample_batch(model, tokenizer, prompts: list[str], n: int = 1, temperature: float = 1.0,
                 top_p: float = 1.0, max_new_tokens: int = 64, seed: int = 0,
                 top_k_stats: int = 5) -> list[Generation]:
    """Sample ``n`` completions per prompt with a KV cache, recording per-token statistics.

    Args:
        prompts: prompt texts; completions come back prompt-major (prompt 0's n samples first).
        temperature: 0 means greedy decoding.
        top_p: nucleus sampling mass (1.0 disables it).
        seed: seeds a private generator, so results do not depend on global RNG state.
        top_k_stats: how many most-likely alternatives to record per token.
    """
    device = next(model.parameters()).device
    rows = [p for p in prompts for _ in range(n)]
    ids, attn = _left_pad(tokenizer, prompts, device)  # [P, L]: each prompt once
    _check_context(model, int(attn.sum(-1).max()), max_new_tokens)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    gen = torch.Generator(device=device).manual_seed(seed)
    done = torch.zeros(len(rows), dtype=torch.bool, device=device)
    if max_new_tokens == 0:
        return _to_generations(tokenizer, rows, n, *_decode(model, tokenizer, None, ids.repeat_interleave(n, 0), attn,
                                                            pos, done, 0, temperature, top_p, gen, top_k_stats))
    # the prompt is encoded once and its KV cache shared by its n samples (a group costs one prefill)
    out = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1)
    past = kv_cache(out)
    first = out.logits[:, -1, :].float()
    if n > 1:
        past.batch_repeat_interleave(n)
        first, attn, pos = first.repeat_interleave(n, 0), attn.repeat_interleave(n, 0), pos.repeat_interleave(n, 0)
    stats = _decode(model, tokenizer, past, ids.repeat_interleave(n, 0), attn, pos, done, max_new_tokens, temperature,
                    top_p, gen, top_k_stats, first_logits=first)
    return _to_generations(tokenizer, rows, n, *stats)


def _decode(model, tokenizer, past, step_ids, attn, step_pos, done, steps: int, temperature: float,
            top_p: float, gen: torch.Generator, k: int, first_logits: torch.Tensor | None = None):
    """The decoding loop shared by sampling and branching: ``steps`` tokens per row.

    Starts from ``step_ids`` (the whole prompt when ``past`` is None, else the last token)
    (or ``first_logits`` [B, V], the next-token logits of a prefill already done: the first
    step then only samples) and returns (ids, logprobs, entropies, topk ids, topk logprobs, lengths, finished) for
    the generated positions. Rows already ``done`` only receive padding. Once a quarter of
    the rows being decoded have finished, they leave the batch and the KV cache, so the
    loop's cost follows the completions' lengths rather than the longest one's (sampling
    stays deterministic for a seed: the same rows leave at the same steps).
    """
    device = step_ids.device
    B = step_ids.shape[0]
    stop = torch.tensor(_stop_ids(model, tokenizer), device=device)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    out_ids = torch.full((B, steps), pad_id, dtype=torch.long, device=device)
    out_lp = torch.zeros(B, steps, device=device)
    out_ent = torch.zeros(B, steps, device=device)
    out_tki = torch.zeros(B, steps, k, dtype=torch.long, device=device)
    out_tkl = torch.zeros(B, steps, k, device=device)
    lengths = torch.where(done, torch.zeros(B, dtype=torch.long, device=device),
                          torch.full((B,), steps, dtype=torch.long, device=device))
    done = done.clone()
    if steps == 0 or bool(done.all()):
        return out_ids, out_lp, out_ent, out_tki, out_tkl, lengths, done
    sync_every = 1 if device.type == "cpu" else 8
    live = torch.arange(B, device=device)  # the output row of each row still being decoded
    d = done.clone()  # done flags of the decoded rows
    for t in range(steps):
        if t == 0 and first_logits is not None:
            logits = first_logits
        else:
            out = model(input_ids=step_ids, attention_mask=attn, position_ids=step_pos,
                        **cache_kwargs(past), use_cache=True, logits_to_keep=1)
            past = kv_cache(out)
            logits = out.logits[:, -1, :].float()  # [b, V]
        logp = torch.log_softmax(logits, dim=-1)  # [b, V]
        nxt = _next_token(logits, logp.exp(), temperature, top_p, gen)
        nxt = torch.where(d, torch.full_like(nxt, pad_id), nxt)
        out_ids[live, t] = nxt
        out_lp[live, t], out_ent[live, t], out_tkl[live, t], out_tki[live, t] = token_stats(logp, nxt, k)
        hit = torch.isin(nxt, stop) & ~d
        lengths[live] = torch.where(hit, torch.full_like(nxt, t + 1), lengths[live])
        d |= hit
        done[live] = d
        if t % sync_every == sync_every - 1:  # a host sync: not every step on GPU
            n_done = int(d.sum())
            if n_done == d.shape[0]:
                break
            # a quarter has finished: drop those rows from the batch and cache,
            # so decoding costs the live rows, not the longest one's
            if 4 * n_done >= d.shape[0] and hasattr(past, "batch_select_indices"):
                keep = (~d).nonzero().squeeze(-1)
                past.batch_select_indices(keep)
                live, d, nxt, attn, step_pos = live[keep], d[keep], nxt[keep], attn[keep], step_pos[keep]
        step_ids = nxt[:, None]
        attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=-1)
        step_pos = step_pos[:, -1:] + 1
    return out_ids, out_lp, out_ent, out_tki, out_tkl, lengths, done


def token_stats(logp: torch.Tensor, tokens: torch.Tensor, k: int):
    """The statistics of ``tokens`` [N] under the rows of ``logp`` [N, V] (log pi at temperature 1):
    their log-probs [N], the entropies [N], the top-k log-probs and ids [N, k]."""
    ent = -(logp.exp() * logp).sum(-1)  # [N]
    tkl, tki = logp.topk(k, dim=-1)  # [N, k]
    return logp.gather(-1, tokens[:, None]).squeeze(-1), ent, tkl, tki


def _next_token(logits, probs, temperature: float, top_p: float, gen: torch.Generator) -> torch.Tensor:
    """Draw one token per row: greedy at temperature 0, else from the tempered nucleus.  [B]"""
    if temperature == 0:
        return logits.argmax(-1)
    draw = probs if (temperature == 1.0 and top_p >= 1.0) else _sampling_probs(logits, temperature, top_p)
    return _draw(draw, gen)


@torch.inference_mode()
def branch_batch(model, tokenizer, prompt: str, prefix_ids: list[int], choices: list[int | None],
                 n: int = 1, temperature: float = 1.0, top_p: float = 1.0, max_new_tokens: int = 64,
                 seed: int = 0, top_k_stats: int = 5) -> list[Generation]:
    """Continue a completion from a fork: keep ``prefix_ids``, force the next token, sample on.

    For every entry of ``choices`` (a token id, or ``None`` to draw it from the policy as
    sampling would) ``n`` completions are made: ``prefix_ids`` + the forced token + a
    sampled continuation. Generations come back choice-major with ``prompt_index`` = the
    choice's index. Every token's statistics are computed under this policy with the
    actual context, the forced token's logprob included (log pi(forced | prompt, prefix)).

    The prompt and prefix are encoded once, in one forward pass that also yields the
    prefix's statistics, and all branches share that KV cache: the prefix is not decoded
    again per branch. ``max_new_tokens`` bounds the whole completion, prefix included.
    """
    device = next(model.parameters()).device
    k, P = top_k_stats, len(prefix_ids)
    vocab = model.get_output_embeddings().weight.shape[0]
    bad = [c for c in choices if c is not None and not 0 <= c < vocab]
    if bad:
        raise ValueError(f"forced token ids {bad} are outside this policy's vocabulary (0-{vocab - 1})")
    if not choices or n < 1:
        raise ValueError("branching needs at least one choice and n >= 1")
    if P + 1 > max_new_tokens:
        raise ValueError(f"the fork is at position {P} but max_new_tokens is {max_new_tokens}")
    p_ids = tokenizer(prompt)["input_ids"]
    if not p_ids:
        raise ValueError("every prompt must encode to at least one token")
    ids = torch.tensor([p_ids + list(prefix_ids)], device=device)  # [1, L]
    out = model(input_ids=ids, use_cache=True, logits_to_keep=P + 1)
    logp = torch.log_softmax(out.logits[0].float(), -1)  # [P+1, V]: predicts prefix tokens, then the fork
    ent = -(logp.exp() * logp).sum(-1)  # [P+1]
    tkl, tki = logp.topk(k, -1)  # [P+1, k]
    pre = torch.tensor(prefix_ids, dtype=torch.long, device=device)
    pre_lp = logp[:P].gather(-1, pre[:, None]).squeeze(-1)  # [P]

    B = len(choices) * n
    gen = torch.Generator(device=device).manual_seed(seed)
    fork_logits = out.logits[0, -1].float()[None].expand(B, -1)
    drawn = _next_token(fork_logits, logp[-1].exp()[None].expand(B, -1), temperature, top_p, gen)
    forced = torch.tensor([-1 if c is None else c for c in choices for _ in range(n)], device=device)
    fork_tok = torch.where(forced >= 0, forced, drawn)  # [B]
    stop = torch.tensor(_stop_ids(model, tokenizer), device=device)
    done = torch.isin(fork_tok, stop)

    past = kv_cache(out)
    past.batch_repeat_interleave(B)
    L = ids.shape[1]
    attn = torch.ones(B, L + 1, dtype=torch.long, device=device)
    step_pos = torch.full((B, 1), L, dtype=torch.long, device=device)
    rest = _decode(model, tokenizer, past, fork_tok[:, None], attn, step_pos, done,
                   max_new_tokens - P - 1, temperature, top_p, gen, k)
    r_ids, r_lp, r_ent, r_tki, r_tkl, r_len, r_done = rest

    def cat(prefix_part, fork_part, rest_part):  # [P, ...] + [B, ...] + [B, S, ...] -> [B, P+1+S, ...]
        return torch.cat([prefix_part[None].expand(B, *prefix_part.shape), fork_part[:, None], rest_part], 1)

    all_ids = cat(pre, fork_tok, r_ids)
    all_lp = cat(pre_lp, logp[-1].gather(-1, fork_tok), r_lp)
    all_ent = cat(ent[:P], ent[-1].expand(B), r_ent)
    all_tki = cat(tki[:P], tki[-1].expand(B, k), r_tki)
    all_tkl = cat(tkl[:P], tkl[-1].expand(B, k), r_tkl)
    lengths = P + 1 + r_len
    return _to_generations(tokenizer, [prompt] * B, n, all_ids, all_lp, all_ent, all_tki, all_tkl,
                           lengths, done | r_done)


def _to_generations(tokenizer, rows, n, out_ids, out_lp, out_ent, out_tki, out_tkl, lengths, done):
    ids_np, lp_np, ent_np = out_ids.cpu().numpy(), out_lp.cpu().numpy(), out_ent.cpu().numpy()
    tki_np, tkl_np = out_tki.cpu().numpy(), out_tkl.cpu().numpy()
    len_np, done_np = lengths.cpu().numpy(), done.cpu().numpy()
    seqs = [ids_np[b, :int(len_np[b])].tolist() for b in range(len(rows))]
    texts = token_texts(tokenizer, seqs)
    # the text is the tokens as decoded, special ones included (a <think> tag, a role marker), but
    # without the stop token that ended it: the token rows and the text read the same
    full = tokenizer.batch_decode([s[:-1] if done_np[b] and s else s for b, s in enumerate(seqs)],
                                  skip_special_tokens=False)
    gens = []
    for b, prompt in enumerate(rows):
        L = int(len_np[b])
        gens.append(Generation(
            prompt_index=b // n, sample_idx=b % n, prompt=prompt, text=full[b],
            token_ids=ids_np[b, :L].astype(np.int64), token_texts=texts[b],
            logprobs=lp_np[b, :L].astype(np.float32), entropies=ent_np[b, :L].astype(np.float32),
            topk_ids=tki_np[b, :L].astype(np.int64), topk_logprobs=tkl_np[b, :L].astype(np.float32),
            finish_reason="stop" if done_np[b] else "length",
        ))
    return gens


@torch.inference_mode()
def score_batch(model, tokenizer, prompts: list[str], completions: list[str | list[int]],
                top_k_stats: int = 5, batch_size: int = 8) -> list[Generation]:
    """Teacher-forced statistics of given completions: the same fields as sampling.

    A completion is text (tokenized without special tokens) or a list of token ids.
    Sequences are left-padded so every completion ends at the last position, and logits
    are computed for the completion positions only (``logits_to_keep``), never for the
    prompt: memory is batch x longest completion x vocabulary.
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    stop = set(_stop_ids(model, tokenizer))
    k = top_k_stats
    out: list[Generation] = []
    for lo in range(0, len(prompts), batch_size):
        chunk_p, chunk_c = prompts[lo:lo + batch_size], completions[lo:lo + batch_size]
        p_ids = [tokenizer(p)["input_ids"] for p in chunk_p]
        c_ids = [c if isinstance(c, list) else tokenizer(c, add_special_tokens=False)["input_ids"] for c in chunk_c]
        seqs = [p + c for p, c in zip(p_ids, c_ids, strict=False)]
        width, C = max(map(len, seqs)), max(map(len, c_ids))
        ids = torch.tensor([[pad] * (width - len(s)) + s for s in seqs], device=device)  # [B, T]
        attn = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs], device=device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        if C:
            # positions T-C-1 .. T-2 predict the last C tokens  -> [B, C, V]
            logits = model(input_ids=ids, attention_mask=attn, position_ids=pos,
                           logits_to_keep=C + 1).logits[:, :-1].float()
            logp = torch.log_softmax(logits, -1)
            ent = -(logp.exp() * logp).sum(-1)  # [B, C]
            tkl, tki = logp.topk(k, -1)  # [B, C, k]
            tgt = ids[:, -C:]
            lp = logp.gather(-1, tgt[..., None]).squeeze(-1)  # [B, C]
            rank = (logp > lp[..., None]).sum(-1) + 1  # [B, C]: 1 + how many tokens are more likely
            lp, ent, tki, tkl, rank = (x.cpu().numpy() for x in (lp, ent, tki, tkl, rank))
        texts = token_texts(tokenizer, c_ids)
        for b, c in enumerate(c_ids):
            n = len(c)
            sl = slice(C - n, C)  # this row's completion is the last n of the C kept positions
            empty = n == 0
            out.append(Generation(
                prompt_index=lo + b, sample_idx=0, prompt=chunk_p[b],
                text=tokenizer.decode(c, skip_special_tokens=True), token_ids=np.asarray(c, np.int64),
                token_texts=texts[b],
                logprobs=np.zeros(0, np.float32) if empty else lp[b, sl].astype(np.float32),
                entropies=np.zeros(0, np.float32) if empty else ent[b, sl].astype(np.float32),
                topk_ids=np.zeros((0, k), np.int64) if empty else tki[b, sl].astype(np.int64),
                topk_logprobs=np.zeros((0, k), np.float32) if empty else tkl[b, sl].astype(np.float32),
                ranks=np.zeros(0, np.int64) if empty else rank[b, sl].astype(np.int64),
                finish_reason="stop" if c and c[-1] in stop else "length",
            ))
    return out


class Policy:
    """A loaded causal LM and its tokenizer, on the device picked for this process, in a
    precision of :data:`PRECISIONS`."""

    def __init__(self, path: str | Path, device: str | None = None, precision: str = "auto"):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.path = Path(path).expanduser().resolve()
        check_policy_folder(self.path)
        self.device = device or pick_device()
        tune_attention(self.device)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.path)
            self.precision = loaded_dtype(self.path, self.device, precision)
            dtype = getattr(torch, self.precision)
            self.model = AutoModelForCausalLM.from_pretrained(self.path, dtype=dtype).to(self.device).eval()
        except Exception as exc:  # transformers raises many kinds; the user needs one message
            raise PolicyLoadError(f"could not load the policy in {str(self.path)!r}: {exc}") from exc
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "left"

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def engine(self) -> str:
        """What computes this policy's statistics: ``torch <version> <device> <dtype>``."""
        return engine_name(self.device, self.precision)

    def _stamped(self, gens: list[Generation]) -> list[Generation]:
        for g in gens:
            g.engine = self.engine
        return gens

    def sample(self, prompts: list[str], **kwargs) -> list[Generation]:
        """See :func:`sample_batch`."""
        return self._stamped(sample_batch(self.model, self.tokenizer, prompts, **kwargs))

    def branch(self, prompt: str, prefix_ids: list[int], choices: list[int | None], **kwargs) -> list[Generation]:
        """See :func:`branch_batch`."""
        return self._stamped(branch_batch(self.model, self.tokenizer, prompt, prefix_ids, choices, **kwargs))

    def sample_agent(self, prompts: list[str], env, **kwargs) -> list[Generation]:
        """See ``backends.agent.sample_agent``: agent trajectories, tools answered by ``env``."""
        from .agent import sample_agent

        return self._stamped(sample_agent(self.model, self.tokenizer, prompts, env, **kwargs))

    def branch_agent(self, prompt: str, prefix_ids: list[int], prefix_mask: list[bool] | None, prefix_turns,
                     choices: list[int | None], env, **kwargs) -> list[Generation]:
        """See ``backends.agent.branch_agent``: continue an agent trajectory from a fork."""
        from .agent import branch_agent

        return self._stamped(branch_agent(self.model, self.tokenizer, prompt, prefix_ids, prefix_mask, prefix_turns,
                                          choices, env, **kwargs))

    def score(self, prompts: list[str], completions: list[str | list[int]], **kwargs) -> list[Generation]:
        """See :func:`score_batch`."""
        return self._stamped(score_batch(self.model, self.tokenizer, prompts, completions, **kwargs))


@functools.lru_cache(maxsize=4)
def _cached(path: str, device: str | None, precision: str) -> Policy:
    return Policy(path, device, precision)


def load_policy(path: str | Path, device: str | None = None, precision: str = "auto") -> Policy:
    """Load a policy folder once per process and precision (later calls return the same object).

    A URL (``http://gpu-box:8000``) gives a ``backends.remote.RemotePolicy`` instead: the
    same interface, served by a backend elsewhere (``device`` and ``precision`` are the
    server's business).
    """
    if is_policy_url(path):
        from .remote import load_remote

        return load_remote(str(path))
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    return _cached(str(Path(path).expanduser().resolve()), device, precision)
