"""The agent loop: multi-turn sampling with tool calls, on a local causal LM.

Every row samples its assistant turn until it writes the environment's call end
(``AgentEnv.call_end``, as tokens) or the end token; a closed call is answered at once
(``env.reply``) and the answer's tokens are appended as a tool turn, masked (not trained, no
policy statistics: NaN log-prob and entropy, top-k ids -1), and the row samples on
(:class:`backends.trajectory.Trajectory` keeps each row's turns, mask and budgets).

One KV cache serves the whole loop: a row that got an answer reads its tokens into the cache
while the other rows go on sampling, a few a step (as many as the batch pads cheaply,
``PAD_SLOTS``; as far as the shortest answer goes when every row is reading one), so nothing is
encoded twice, no row waits for another's turn to end, and a long answer (an error message)
never widens every row's forward.
Finished rows leave the batch and the cache once a quarter of it has finished, as in
``backends.policy._decode``. Every policy token's statistics are those of
``backends.policy.sample_batch`` (the policy at temperature 1 over the full vocabulary), and
sampling is deterministic for a seed.
"""
from __future__ import annotations

import torch

from .policy import (
    _check_context,
    _left_pad,
    _next_token,
    _stop_ids,
    cache_kwargs,
    kv_cache,
    token_stats,
    token_texts,
)
from .trajectory import Trajectory, kept_turns
from .types import AgentEnv, Generation, Turn

# padded token slots a forward may carry so that rows read tool answers several tokens a step: a
# batch of 16 rows or fewer reads two or more, a lone row 17 (measured on the sample agent policy on
# a CPU: 16 beats one token a step by about 10 % in tokens/s, 32 loses: a full batch pays every step).
# On an accelerator, where a step's cost hardly depends on its width, answers are read whole.
PAD_SLOTS = 16


@torch.inference_mode()
def sample_agent(model, tokenizer, prompts: list[str], env: AgentEnv | None, n: int = 1, max_turns: int = 8,
                 max_new_tokens: int = 256, temperature: float = 1.0, top_p: float = 1.0, seed: int = 0,
                 top_k_stats: int = 5, call_end: str | None = None) -> list[Generation]:
    """Sample ``n`` agent trajectories per prompt (prompt-major, as ``sample_batch``).

    Args:
        env: answers the tool calls. None samples one turn only: a row that closes a call ends
            there (``finish_reason`` ``call``), which is what a backend serving a remote agent
            loop does (``call_end`` then says where a call ends).
        max_turns: tool calls a trajectory may make; a call past them ends it (``turns``).
        max_new_tokens: the completion's budget in tokens, tool responses included (``length``).
        temperature, top_p, seed, top_k_stats: as ``backends.policy.sample_batch``.
    """
    device = next(model.parameters()).device
    if not prompts:
        return []
    ids, attn = _left_pad(tokenizer, prompts, device)  # [P, L]
    _check_context(model, int(attn.sum(-1).max()), max_new_tokens)
    rows = [Trajectory(b // n, b % n, prompts[b // n]) for b in range(len(prompts) * n)]
    if max_new_tokens == 0:
        return _finish(tokenizer, rows, _Stats(len(rows), 0, top_k_stats, device))
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1)
    past = kv_cache(out)
    first = out.logits[:, -1, :].float()  # [P, V]
    if n > 1:  # the prompt's prefill is shared by its n samples
        past.batch_repeat_interleave(n)
        first, attn, pos = first.repeat_interleave(n, 0), attn.repeat_interleave(n, 0), pos.repeat_interleave(n, 0)
    stats = _Stats(len(rows), max_new_tokens, top_k_stats, device)
    _loop(model, tokenizer, env, call_end, rows, stats, past, first, attn, pos[:, -1] + 1, max_turns, max_new_tokens,
          temperature, top_p, torch.Generator(device=device).manual_seed(seed), None)
    return _finish(tokenizer, rows, stats)


@torch.inference_mode()
def branch_agent(model, tokenizer, prompt: str, prefix_ids: list[int], prefix_mask: list[bool] | None,
                 prefix_turns: list[Turn] | None, choices: list[int | None], env: AgentEnv | None, n: int = 1,
                 max_turns: int = 8, max_new_tokens: int = 256, temperature: float = 1.0, top_p: float = 1.0,
                 seed: int = 0, top_k_stats: int = 5, call_end: str | None = None) -> list[Generation]:
    """Continue an agent trajectory from a fork: keep its first ``len(prefix_ids)`` tokens, force
    each choice next (``None``: drawn from the policy), and run the agent loop on (tools run again).

    The prefix keeps its earlier turns as they were (tool turns included); the assistant turn the
    fork falls in continues. Prefix policy tokens get their statistics by teacher forcing (one
    forward over prompt and prefix, shared by every branch through the KV cache), prefix tool
    tokens (``prefix_mask`` False) none. ``n`` branches per choice, choice-major, ``prompt_index``
    = the choice's index, as ``backends.policy.branch_batch``; ``max_new_tokens`` bounds the whole
    completion, prefix included, and ``max_turns`` its tool calls, the prefix's included. Without
    ``env``, each branch ends at its first call (``call_end``), as in :func:`sample_agent`.

    Raises:
        ValueError: a fork inside a tool turn, a forced id outside the vocabulary, no choice,
            or a fork at or past the token budget.
    """
    device = next(model.parameters()).device
    k, P = top_k_stats, len(prefix_ids)
    mask = [True] * P if prefix_mask is None else [bool(m) for m in prefix_mask]
    if len(mask) != P:
        raise ValueError(f"a loss mask of {len(mask)} entries for a prefix of {P} tokens")
    kept, turn_start = kept_turns(prefix_turns, P)
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
    _check_context(model, len(p_ids), max_new_tokens)
    ids = torch.tensor([p_ids + list(prefix_ids)], device=device)  # [1, L]
    out = model(input_ids=ids, use_cache=True, logits_to_keep=P + 1)
    logits = out.logits[0].float()  # [P+1, V]: predicts the prefix's tokens, then the fork's

    B = len(choices) * n
    stats = _Stats(B, max_new_tokens, k, device)
    if P:
        logp = torch.log_softmax(logits[:P], -1)  # [P, V]
        lp, ent, tkl, tki = token_stats(logp, torch.tensor(prefix_ids, device=device), k)
        m = torch.tensor(mask, device=device)
        nan = torch.tensor(float("nan"), device=device)
        stats.lp[:, :P] = torch.where(m, lp, nan)
        stats.ent[:, :P] = torch.where(m, ent, nan)
        stats.tkl[:, :P] = torch.where(m[:, None], tkl, nan)
        stats.tki[:, :P] = torch.where(m[:, None], tki, torch.full_like(tki, -1))
    rows = [Trajectory(b // n, b % n, prompt, prefix_ids, mask, [_copy(t) for t in kept], turn_start)
            for b in range(B)]
    past = kv_cache(out)
    past.batch_repeat_interleave(B)
    L = ids.shape[1]
    force = torch.tensor([-1 if c is None else c for c in choices for _ in range(n)], device=device)
    _loop(model, tokenizer, env, call_end, rows, stats, past, logits[-1][None].expand(B, -1),
          torch.ones(B, L, dtype=torch.long, device=device), torch.full((B,), L, dtype=torch.long, device=device),
          max_turns, max_new_tokens, temperature, top_p, torch.Generator(device=device).manual_seed(seed), force)
    return _finish(tokenizer, rows, stats)


def _copy(t: Turn) -> Turn:
    return Turn(t.role, t.start, t.end, t.text, t.tool_name, t.tool_args, t.tool_call_id, t.error)


class _Stats:
    """Per-token statistics of every row, filled in as tokens are made: [B, budget] (and [.., k])."""

    def __init__(self, B: int, budget: int, k: int, device):
        nan = float("nan")
        self.lp = torch.full((B, budget), nan, device=device)
        self.ent = torch.full((B, budget), nan, device=device)
        self.tki = torch.full((B, budget, k), -1, dtype=torch.long, device=device)
        self.tkl = torch.full((B, budget, k), nan, device=device)


def _loop(model, tokenizer, env: AgentEnv | None, call_end: str | None, rows: list[Trajectory], stats: _Stats,
          past, logits: torch.Tensor, attn: torch.Tensor, next_pos: torch.Tensor, max_turns: int, budget: int,
          temperature: float, top_p: float, gen: torch.Generator, force: torch.Tensor | None) -> None:
    """Run every row to its end. ``logits`` [B, V] predict each row's next token (``force``: the
    first token of each row, -1 to draw it); ``attn`` [B, L] and ``next_pos`` [B] describe the cache."""
    device = logits.device
    stop = set(_stop_ids(model, tokenizer))
    end_text = env.call_end if env is not None else call_end
    call_ids = tokenizer(end_text, add_special_tokens=False)["input_ids"] if end_text else []
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    live = torch.arange(len(rows), device=device)  # the row of each batch entry
    live_rows = list(rows)
    queued: dict[int, list[int]] = {}  # id(row) -> answer tokens it has yet to read
    wide = device.type != "cpu"
    while True:
        logp = torch.log_softmax(logits, dim=-1)  # [b, V]
        nxt = _next_token(logits, logp.exp(), temperature, top_p, gen)  # [b]
        if force is not None:
            nxt = torch.where(force >= 0, force, nxt)
            force = None
        # a row reading an answer makes no token this step; the others sample one
        active = [j for j, r in enumerate(live_rows) if not r.done and id(r) not in queued]
        feeds = [[pad] for _ in live_rows]  # what each batch entry reads next
        if active:
            at = torch.tensor(active, device=device)
            where = torch.tensor([len(live_rows[j].ids) for j in active], device=device)
            lp, ent, tkl, tki = token_stats(logp[at], nxt[at], stats.tki.shape[-1])
            r_at = live[at]
            stats.lp[r_at, where], stats.ent[r_at, where] = lp, ent
            stats.tkl[r_at, where], stats.tki[r_at, where] = tkl, tki
            for j, tok in zip(active, nxt[at].tolist(), strict=True):
                row = live_rows[j]
                feeds[j] = [tok]
                if row.add(tok, tok in stop, call_ids, max_turns, budget):
                    if env is None:  # one turn only: the caller answers the call
                        row.end("call")
                        continue
                    reply = env.reply(row.prompt_index, tokenizer.decode(row.call_ids(), skip_special_tokens=False))
                    reply_ids = tokenizer(reply.text, add_special_tokens=False)["input_ids"] if reply.text else []
                    answer = row.answer(reply, reply_ids, budget)
                    if answer and not row.done:
                        queued[id(row)] = answer
        # answers are read as wide as the batch pads cheaply (PAD_SLOTS), or as far as the shortest goes
        # when every row is reading one (no padding at all); a row that just called reads after its token
        w = 1 + PAD_SLOTS // len(live_rows)
        if wide and queued:  # on an accelerator a padded [b, w] forward costs about one step: read answers whole
            w = 1 + max(len(q) for q in queued.values())
        elif not active:
            w = max(w, min(len(queued[id(r)]) for r in live_rows if not r.done))
        sampled = set(active)
        for j, r in enumerate(live_rows):
            q = queued.get(id(r))
            if q is not None:
                head = feeds[j] if j in sampled else []
                take = w - len(head)
                feeds[j] = head + q[:take]
                del q[:take]
                if not q:
                    del queued[id(r)]
        done = [r.done for r in live_rows]
        if all(done):
            return
        if 4 * sum(done) >= len(done) and hasattr(past, "batch_select_indices"):
            keep = [j for j, d in enumerate(done) if not d]  # finished rows leave the batch and the cache
            idx = torch.tensor(keep, device=device)
            past.batch_select_indices(idx)
            live, attn, next_pos = live[idx], attn[idx], next_pos[idx]
            live_rows, feeds = [live_rows[j] for j in keep], [feeds[j] for j in keep]
        logits, attn, next_pos = _feed(model, past, feeds, attn, next_pos, pad)


def _feed(model, past, feeds: list[list[int]], attn: torch.Tensor, next_pos: torch.Tensor, pad: int):
    """One forward over each batch entry's next tokens (one, or a call's last token and its
    answer), right-padded to the longest and masked; returns the logits after each entry's last
    token [b, V], and the grown attention mask and next positions."""
    device = attn.device
    lens = torch.tensor([len(f) for f in feeds], device=device)  # [b]
    w = int(lens.max())
    ids = torch.tensor([f + [pad] * (w - len(f)) for f in feeds], device=device)  # [b, w]
    offs = torch.arange(w, device=device)[None]  # [1, w]
    chunk_attn = (offs < lens[:, None]).long()  # [b, w]
    pos = next_pos[:, None] + torch.minimum(offs, lens[:, None] - 1)  # [b, w]: a pad repeats its row's last position
    attn = torch.cat([attn, chunk_attn], dim=-1)
    out = model(input_ids=ids, attention_mask=attn, position_ids=pos, **cache_kwargs(past), use_cache=True,
                logits_to_keep=w)
    logits = out.logits[torch.arange(len(feeds), device=device), lens - 1].float()  # [b, V]
    return logits, attn, next_pos + lens


def _finish(tokenizer, rows: list[Trajectory], stats: _Stats) -> list[Generation]:
    for r in rows:
        if not r.done:
            r.end("length")
    texts = token_texts(tokenizer, [r.ids for r in rows])
    lp, ent, tki, tkl = (x.cpu().numpy() for x in (stats.lp, stats.ent, stats.tki, stats.tkl))

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False)

    return [r.generation(texts[b], decode, lp[b, :len(r.ids)], ent[b, :len(r.ids)], tki[b, :len(r.ids)],
                         tkl[b, :len(r.ids)]) for b, r in enumerate(rows)]
