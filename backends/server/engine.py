"""The served models and the one thread that runs them: :class:`Engine` answers validated
completions with the policy, :class:`Batcher` queues and merges them.

The policy (and the reward model) load on the first request that needs them, on CUDA when
present. Model work runs on one thread (``Engine.model_thread``), so the server answers
health checks meanwhile; the tokenizer-only endpoints use a second tokenizer on the info
thread (``Engine.info_thread``), so they answer while the model works.

Batching: requests that arrive while a model call runs wait; when it ends, the waiting
sampling requests with no ``seed`` and identical settings are merged into one
``sample_batch`` call. A request with a seed always runs alone: one generator draws every
row of a call, so merged with others it would get other tokens, and alone it gets exactly
what the local backend gives for that seed, prompts and settings.
"""
from __future__ import annotations

import asyncio
import functools
import json
import logging
import random
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..types import PolicyLoadError, weights_version
from .protocol import ApiError, Completion

log = logging.getLogger("rollout_studio.backend")

class _Pretokenized:
    """The policy's tokenizer, except that prompts given as token ids reach the model as
    exactly those ids (``sample_batch`` and friends tokenize prompt texts themselves): each
    such prompt is passed as a key no text can collide with."""

    def __init__(self, tokenizer):
        self._tok = tokenizer
        self._ids: dict[str, list[int]] = {}
        self._nonce = uuid.uuid4().hex

    def key(self, ids: list[int]) -> str:
        k = f"\x00ids:{self._nonce}:{len(self._ids)}"
        self._ids[k] = list(ids)
        return k

    def __call__(self, text, *args, **kwargs):
        if isinstance(text, str) and text in self._ids:
            return {"input_ids": list(self._ids[text])}
        return self._tok(text, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tok, name)


class Engine:
    """The served models: the policy (and reward model) load on first use, on CUDA when present.

    Model calls run on the model thread only; the tokenizer-only endpoints use a second
    tokenizer on the info thread, so they answer while the model works.
    """

    def __init__(self, policy: Path, reward_model: Path | None = None, name: str | None = None,
                 extension: bool = True, delay_s: float = 0.0, precision: str = "auto"):
        self.policy_path, self.reward_path = policy, reward_model
        self.precision = precision  # backends.device.PRECISIONS: the dtype the policy is loaded in
        self.name = name or policy.name
        self.extension, self.delay_s = extension, delay_s
        self.model_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model")
        self.info_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="info")
        self._pieces: dict[int, str] = {}
        cfg = json.loads((policy / "config.json").read_text())
        self.vocab_size = cfg.get("vocab_size")
        self.max_model_len = cfg.get("max_position_embeddings") or cfg.get("n_positions")
        self.loaded = False

    def policy(self):
        from ..policy import load_policy

        p = load_policy(self.policy_path, precision=self.precision)
        self.loaded = True
        return p

    def reward_model(self):
        from ..reward_model import load_reward_model

        if self.reward_path is None:
            raise ApiError(404, "this server has no reward model: start it with --reward-model PATH")
        return load_reward_model(self.reward_path)

    @functools.cached_property
    def tokenizer(self):  # info thread only
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.policy_path)

    @functools.cached_property
    def device(self) -> str:
        from ..device import pick_device

        return pick_device()

    def card(self) -> dict:
        """``/v1/models``'s entry for the policy (info thread: hashes the weights once)."""
        c = {"id": self.name, "object": "model", "created": int(time.time()), "owned_by": "rollout-studio",
             "root": self.name, "parent": None, "max_model_len": self.max_model_len}
        if self.extension:
            from ..policy import engine_name, loaded_dtype

            dtype = loaded_dtype(self.policy_path, self.device, self.precision)
            version = weights_version(self.policy_path) + ("" if dtype == "float32" else f"~{dtype}")
            c["studio"] = {"version": version, "device": self.device, "engine": engine_name(self.device, dtype),
                           "vocab_size": self.vocab_size, "eos_token_id": self.tokenizer.eos_token_id}
        return c

    def pieces(self, tok, ids: list[int]) -> list[str]:
        """Each id decoded alone with ``tok`` (special tokens keep their names), cached."""
        missing = sorted({int(i) for i in ids} - self._pieces.keys())
        if missing:
            texts = tok.batch_decode([[i] for i in missing], skip_special_tokens=False)
            self._pieces.update(zip(missing, texts, strict=False))
        return [self._pieces[int(i)] for i in ids]

    # -- completions (model thread) -----------------------------------------------------
    def complete(self, reqs: list[Completion]) -> list[dict | ApiError]:
        """Answer requests: merged into one sampling call when there are several (they share
        a batch key), else the one request as it asks."""
        try:
            policy = self.policy()
        except PolicyLoadError as exc:
            return [ApiError(500, str(exc))] * len(reqs)
        out: list[dict | ApiError] = [ApiError(500, "not run")] * len(reqs)
        tok = _Pretokenized(policy.tokenizer)
        ok = []
        for i, r in enumerate(reqs):
            try:
                ok.append((i, r, self._prompt_ids(policy, tok, r)))
            except ApiError as exc:
                out[i] = exc
        if not ok:
            return out
        if len(ok) > 1 or (ok[0][1].prefix is None and not ok[0][1].echo):
            self._sample(policy, tok, ok, out)
        elif ok[0][1].prefix is not None:
            i, r, ids = ok[0]
            out[i] = self._fork(policy, tok, r, ids[0])
        else:
            i, r, ids = ok[0]
            out[i] = self._echo(policy, tok, r, ids)
        return out

    def _prompt_ids(self, policy, tok: _Pretokenized, r: Completion) -> list[list[int]]:
        ids = [tok(p)["input_ids"] if isinstance(p, str) else p for p in r.prompts]
        V = policy.model.get_output_embeddings().weight.shape[0]
        forced = [[c for c in r.choices or [] if c is not None]]
        for name, seqs in (("prompt", ids), ("studio.prefix", [r.prefix or []]),
                           ("studio.completions", r.completions or []), ("studio.choices", forced)):
            bad = sorted({t for s in seqs for t in s if not 0 <= t < V})
            if bad:
                raise ApiError(400, f"token ids {bad[:5]} in '{name}' are outside the vocabulary (0-{V - 1})", name)
        if any(len(s) == 0 for s in ids):
            raise ApiError(400, "every prompt must encode to at least one token", "prompt")
        L = self.max_model_len
        if L:
            for j, s in enumerate(ids):
                extra = len((r.completions or [[]] * len(ids))[j]) if r.completions else 0
                total = len(s) + extra + r.max_tokens
                if total > L:
                    raise ApiError(400, f"This model's maximum context length is {L} tokens. However, you requested "
                                        f"{total} tokens ({len(s) + extra} in the prompt, {r.max_tokens} in the "
                                        "completion). Please reduce the length of the prompt or completion.",
                                   "max_tokens")
        return ids

    def _sample(self, policy, tok: _Pretokenized, ok: list, out: list) -> None:
        from ..agent import sample_agent
        from ..policy import sample_batch

        r0 = ok[0][1]
        keys = [p if isinstance(p, str) else tok.key(p) for _, r, _ in ok for p in r.prompts]
        seed = r0.seed if len(ok) == 1 and r0.seed is not None else random.randrange(2 ** 31)
        kw = dict(n=r0.n, temperature=r0.temperature, top_p=r0.top_p, max_new_tokens=r0.max_tokens, seed=seed,
                  top_k_stats=r0.k)
        if r0.call_end is not None:  # an agent turn: each row ends at its tool call
            gens = sample_agent(policy.model, tok, keys, None, call_end=r0.call_end, **kw)
        else:
            gens = sample_batch(policy.model, tok, keys, **kw)
        at = 0
        for i, r, ids in ok:
            mine = gens[at * r.n:(at + len(r.prompts)) * r.n]
            at += len(r.prompts)
            choices = [self._choice(policy, r, j, g.text, _columns(g), _standard(g.finish_reason), g.text,
                                    g.finish_reason) for j, g in enumerate(mine)]
            out[i] = self._response(r, choices, sum(map(len, ids)), sum(g.n_tokens for g in mine))

    def _fork(self, policy, tok: _Pretokenized, r: Completion, ids: list[int]) -> dict:
        from ..agent import branch_agent
        from ..policy import branch_batch

        prompt = r.prompts[0] if isinstance(r.prompts[0], str) else tok.key(ids)
        kw = dict(n=r.n, temperature=r.temperature, top_p=r.top_p, max_new_tokens=r.max_tokens,
                  seed=r.seed if r.seed is not None else random.randrange(2 ** 31), top_k_stats=r.k)
        if r.call_end is not None:  # an agent turn from the fork: each row ends at its tool call
            gens = branch_agent(policy.model, tok, prompt, r.prefix, None, None, r.choices, None,
                                call_end=r.call_end, **kw)
        else:
            gens = branch_batch(policy.model, tok, prompt, r.prefix, r.choices, **kw)
        choices = [self._choice(policy, r, j, g.text, _columns(g), _standard(g.finish_reason), g.text,
                                g.finish_reason) for j, g in enumerate(gens)]
        return self._response(r, choices, len(ids), sum(g.n_tokens for g in gens))

    def _echo(self, policy, tok: _Pretokenized, r: Completion, ids: list[list[int]]) -> dict:
        """The prompt's tokens (teacher-forced statistics when asked for), then any sampled ones."""
        from ..policy import sample_batch, score_batch, token_texts

        full = [s + (r.completions[j] if r.completions else []) for j, s in enumerate(ids)]
        start = [len(s) if r.completions else 1 for s in ids]
        scored = None
        if r.logprobs is not None or r.stats:
            scored = score_batch(policy.model, tok, [tok.key(f[:s]) for f, s in zip(full, start, strict=False)],
                                 [f[s:] for f, s in zip(full, start, strict=False)], top_k_stats=r.k)
        texts = token_texts(policy.tokenizer, full)
        gens = None
        if r.max_tokens > 0:
            gens = sample_batch(policy.model, tok, [tok.key(f) for f in full], n=r.n, temperature=r.temperature,
                                top_p=r.top_p, max_new_tokens=r.max_tokens,
                                seed=r.seed if r.seed is not None else random.randrange(2 ** 31), top_k_stats=r.k)
        choices, generated = [], 0
        for j, f in enumerate(full):
            prompt_text = r.prompts[j] if isinstance(r.prompts[j], str) else policy.tokenizer.decode(ids[j])
            if r.completions:
                prompt_text += policy.tokenizer.decode(r.completions[j], skip_special_tokens=True)
            s = scored[j] if scored is not None else None
            cols = {"ids": list(f), "texts": texts[j], "lp": [None] * start[j], "ent": [None] * start[j],
                    "tki": [None] * start[j], "tkl": [None] * start[j]}
            if s is not None:
                cols["lp"] += s.logprobs.tolist()
                cols["ent"] += s.entropies.tolist()
                cols["tki"] += s.topk_ids.tolist()
                cols["tkl"] += s.topk_logprobs.tolist()
            else:
                for c in ("lp", "ent", "tki", "tkl"):
                    cols[c] += [None] * (len(f) - start[j])
            s_text = s.text if s is not None else ""
            s_reason = s.finish_reason if s is not None else "length"
            for k in range(r.n):
                if gens is None:
                    choices.append(self._choice(policy, r, j * r.n + k, prompt_text, cols, "length", s_text, s_reason,
                                                start[j]))
                    continue
                g = gens[j * r.n + k]
                generated += g.n_tokens
                gc = _columns(g)
                both = {c: cols[c] + gc[c] for c in cols}
                choices.append(self._choice(policy, r, j * r.n + k, prompt_text + g.text, both, g.finish_reason,
                                            s_text + g.text, g.finish_reason, start[j]))
        return self._response(r, choices, sum(map(len, full)), generated)

    def _choice(self, policy, r: Completion, index: int, text: str, cols: dict, finish: str, studio_text: str,
                studio_finish: str, start: int = 0) -> dict:
        """One choice: standard logprobs when asked, the extension's fields when asked."""
        choice = {"index": index, "text": text, "logprobs": None, "finish_reason": finish}
        if r.logprobs is not None:
            ids, k = cols["ids"], r.logprobs
            names = ([f"token_id:{i}" for i in ids] if r.as_ids else list(cols["texts"]))
            top = []
            for t, tid in enumerate(ids):
                if cols["lp"][t] is None:
                    top.append(None)
                    continue
                alt = cols["tki"][t][:k]
                alt_names = [f"token_id:{i}" for i in alt] if r.as_ids else self.pieces(policy.tokenizer, alt)
                d = dict(zip(alt_names, cols["tkl"][t][:k], strict=False))
                if tid not in alt:  # the chosen token is always listed (vLLM)
                    d[names[t] if r.as_ids else self.pieces(policy.tokenizer, [tid])[0]] = cols["lp"][t]
                top.append(d)
            offsets, at = [], 0
            for piece in cols["texts"]:
                offsets.append(at)
                at += len(piece)
            choice["logprobs"] = {"tokens": names, "token_logprobs": cols["lp"], "top_logprobs": top,
                                  "text_offset": offsets}
        if r.stats:
            k = r.top_k
            choice["studio"] = {
                "token_ids": cols["ids"][start:], "token_texts": list(cols["texts"][start:]),
                "logprobs": cols["lp"][start:], "entropies": cols["ent"][start:],
                "topk_ids": [row[:k] for row in cols["tki"][start:]],
                "topk_logprobs": [row[:k] for row in cols["tkl"][start:]],
                "text": studio_text, "finish_reason": studio_finish, "start": start}
        return choice

    def _response(self, r: Completion, choices: list[dict], prompt_tokens: int, completion_tokens: int) -> dict:
        return {"id": r.id, "object": "text_completion", "created": int(time.time()), "model": self.name,
                "choices": choices, "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                              "total_tokens": prompt_tokens + completion_tokens}}


def _standard(finish: str) -> str:
    """The standard ``finish_reason`` of a studio one: a closed tool call is a stop sequence."""
    return "stop" if finish == "call" else finish


def _columns(g) -> dict:
    """A Generation's per-token columns as Python lists."""
    return {"ids": g.token_ids.tolist(), "texts": list(g.token_texts), "lp": g.logprobs.tolist(),
            "ent": g.entropies.tolist(), "tki": g.topk_ids.tolist(), "tkl": g.topk_logprobs.tolist()}


class Batcher:
    """Runs completions on the model thread one call at a time, merging waiting sampling
    requests that share a batch key (see the module docstring)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.waiting: list[tuple[Completion, asyncio.Future]] = []
        self.running = False
        self.calls = 0  # model calls made
        self.requests = 0  # requests answered by them

    async def submit(self, req: Completion) -> dict:
        fut = asyncio.get_running_loop().create_future()
        self.waiting.append((req, fut))
        if not self.running:
            self.running = True
            asyncio.ensure_future(self._drain())
        result = await fut
        if isinstance(result, ApiError):
            raise result
        return result

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self.waiting:
                taken, self.waiting = self.waiting, []
                batch = []
                for req, fut in taken:
                    if req.abandoned:  # its client gave up (a timeout): nobody would read the answer
                        fut.set_result(ApiError(400, "the client closed the connection"))
                    else:
                        batch.append((req, fut))
                groups: dict[object, list] = {}
                for req, fut in batch:  # first come, first served; equal keys together
                    key = req.batch_key()
                    groups.setdefault(key if key is not None else id(req), []).append((req, fut))
                for group in groups.values():
                    try:
                        results = await loop.run_in_executor(self.engine.model_thread, self.engine.complete,
                                                             [r for r, _ in group])
                    except Exception as exc:  # a bug or an out-of-memory: the requests get a 500, the server lives
                        log.exception("model call failed")
                        results = [ApiError(500, f"{type(exc).__name__}: {exc}")] * len(group)
                    self.calls += 1
                    self.requests += len(group)
                    for (_, fut), res in zip(group, results, strict=False):
                        if not fut.done():
                            fut.set_result(res)
        finally:
            self.running = False

