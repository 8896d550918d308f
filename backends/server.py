"""Serve a policy over HTTP: the OpenAI completions API as vLLM implements it, plus the studio's extension.

    rollout-studio backend --policy PATH [--reward-model PATH] [--port 8000] [--host ADDR --api-key KEY]
    python -m backends.server ...   (the same)

Standard endpoints (vLLM's names and shapes):

- ``POST /v1/completions``: ``prompt`` is a string, a list of strings, a list of token ids
  or a list of such lists; ``n``, ``temperature`` (0: greedy), ``top_p``, ``max_tokens``
  (default 16), ``seed``, ``logprobs`` (how many top alternatives, at most 20; the chosen
  token is always listed too, as vLLM does), ``echo`` (the prompt's tokens first; with
  ``max_tokens: 0`` only they: teacher-forced scoring, the first token's logprob null),
  ``return_tokens_as_token_ids`` (tokens as ``"token_id:N"``). ``stream`` and sampling
  options this server lacks (``stop``, penalties, ``logit_bias``, ``best_of`` > n …) are
  refused with a 400 naming them. Choices come prompt-major (index = prompt × n + sample).
  Logprobs describe the policy at temperature 1 (vLLM's ``raw_logprobs``), whatever the
  sampling temperature.
- ``GET /v1/models``, ``GET /health`` (no key needed; model calls and requests so far, ``busy``,
  ``waiting``: the queue), ``POST /tokenize``
  (``{prompt, add_special_tokens}`` → ``{tokens, count, max_model_len}``),
  ``POST /detokenize`` (``{tokens}`` → ``{prompt}``).

The extension (off with ``--no-extension``, which makes the server a plain vLLM look-alike):

- request field ``studio`` of ``/v1/completions``: ``stats: true`` gives every choice a
  ``studio`` object (``token_ids``, ``token_texts``, ``logprobs``, ``entropies`` over the
  full vocabulary, ``topk_ids``, ``topk_logprobs``, ``text``, ``finish_reason``, ``start``:
  the index in the choice's tokens where these arrays begin); ``top_k`` sets the width of
  ``topk_*`` (default ``logprobs``, else 5); ``prefix`` + ``choices`` branch a fork (one
  prompt: keep the completion tokens ``prefix``, force each of ``choices`` next, ``null``
  drawing it, ``n`` continuations each, choice-major; ``max_tokens`` bounds the whole
  completion, prefix included, as ``Policy.branch``); ``completions`` (with ``echo`` and
  ``max_tokens: 0``) teacher-forces these token ids after each prompt and scores only them.
- ``GET /v1/models``: ``data[0].studio`` = ``{version, device, vocab_size, eos_token_id}``.
- ``POST /studio/pieces`` ``{tokens}`` → ``{pieces}``: each token's text decoded alone.
- ``POST /studio/reward`` ``{prompt: [...], completion: [...]}`` →
  ``{model, version, data: [{index, score}]}`` with ``--reward-model``: the reward model's
  score of ``prompt + completion`` (``backends.reward_model``).

Errors have OpenAI's shape ``{"error": {"message", "type", "param", "code"}}`` with the HTTP
status as ``code``. The policy loads on the first request that needs it, on CUDA when
present; model work runs on one thread, so the server answers health checks meanwhile.

Batching: requests that arrive while a model call runs wait; when it ends, the waiting
sampling requests with no ``seed`` and identical settings are merged into one
``sample_batch`` call. A request with a seed always runs alone: one generator draws every
row of a call, so merged with others it would get other tokens, and alone it gets exactly
what the local backend gives for that seed, prompts and settings.
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import hmac
import ipaddress
import json
import logging
import os
import random
import signal
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import tornado.web

from .types import PolicyLoadError, check_policy_folder, weights_version

log = logging.getLogger("rollout_studio.backend")
ENV_KEY = "ROLLOUT_STUDIO_API_KEY"
MAX_LOGPROBS = 20  # vLLM's default --max-logprobs
MAX_ROWS = 256  # completions per request (n × prompts, or n × fork choices)
# sampling options of vLLM / OpenAI this server does not implement, with the value that means "off"
UNSUPPORTED = {"suffix": None, "stop": None, "presence_penalty": 0, "frequency_penalty": 0, "logit_bias": None,
               "top_k": -1, "min_p": 0, "repetition_penalty": 1, "stop_token_ids": None, "ignore_eos": False,
               "min_tokens": 0, "use_beam_search": False, "prompt_logprobs": None}


class ApiError(Exception):
    """A request the server refuses, in OpenAI's error shape."""

    TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 500: "InternalServerError",
             503: "ServiceUnavailableError"}

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.TYPES.get(self.status, "BadRequestError"),
                          "param": self.param, "code": self.status}}


# ---------------------------------------------------------------------------- requests

@dataclass
class Completion:
    """One validated ``/v1/completions`` request."""

    prompts: list  # str or list[int] each
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 16
    seed: int | None = None
    logprobs: int | None = None
    echo: bool = False
    as_ids: bool = False
    stats: bool = False  # extension: per-choice studio fields
    top_k: int = 5
    prefix: list[int] | None = None  # extension: fork branching
    choices: list | None = None
    completions: list[list[int]] | None = None  # extension: teacher forcing after each prompt
    id: str = field(default_factory=lambda: f"cmpl-{uuid.uuid4().hex}")
    abandoned: bool = False  # the client closed the connection: not run if still waiting

    @property
    def k(self) -> int:
        """Alternatives to compute per token."""
        return max(self.top_k if self.stats else 0, self.logprobs or 0, 1)

    def batch_key(self) -> tuple | None:
        """Requests with equal keys may share one sampling call; None: this one runs alone."""
        if self.seed is not None or self.echo or self.prefix is not None:
            return None
        return (self.n, self.temperature, self.top_p, self.max_tokens, self.logprobs, self.as_ids, self.stats,
                self.top_k)


def _num(body: dict, name: str, kind: type, default, lo=None, hi=None):
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not float(v).is_integer()):
        raise ApiError(400, f"'{name}' must be {'an integer' if kind is int else 'a number'}, got {v!r}", name)
    v = kind(v)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise ApiError(400, f"'{name}' must be between {lo} and {hi}, got {v}", name)
    return v


def _ids(v, name: str) -> list[int]:
    if not isinstance(v, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in v):
        raise ApiError(400, f"'{name}' must be a list of token ids", name)
    return v


def parse_completion(body: object, served: str, extension: bool) -> Completion:
    """Check a request body; raise :class:`ApiError` naming the first problem."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    if body.get("model") not in (None, served):
        raise ApiError(404, f"The model `{body['model']}` does not exist.", "model")
    if body.get("stream"):
        raise ApiError(400, "streaming is not supported by this server: send 'stream': false (or leave it out)", "stream")
    for name, off in UNSUPPORTED.items():
        v = body.get(name)
        if v is not None and v != off and v not in ([], {}, "") and not (name == "top_k" and v == 0):
            raise ApiError(400, f"'{name}' is not supported by this server (rollout-studio backend)", name)
    p = body.get("prompt")
    if isinstance(p, str):
        prompts = [p]
    elif isinstance(p, list) and p and all(isinstance(x, str) for x in p):
        prompts = list(p)
    elif isinstance(p, list) and p and all(isinstance(x, int) and not isinstance(x, bool) for x in p):
        prompts = [list(p)]
    elif isinstance(p, list) and p and all(isinstance(x, list) for x in p):
        prompts = [_ids(x, "prompt") for x in p]
    else:
        raise ApiError(400, "'prompt' must be a string, a list of strings, a list of token ids or a list of lists "
                            "of token ids (not empty)", "prompt")
    if any(x == [] or x == "" for x in prompts):
        raise ApiError(400, "every prompt must have at least one token", "prompt")
    c = Completion(prompts=prompts, n=_num(body, "n", int, 1, 1, MAX_ROWS),
                   temperature=_num(body, "temperature", float, 1.0, 0.0, 100.0),
                   top_p=_num(body, "top_p", float, 1.0, 1e-9, 1.0), max_tokens=_num(body, "max_tokens", int, 16, 0),
                   seed=_num(body, "seed", int, None), logprobs=_num(body, "logprobs", int, None, 0, MAX_LOGPROBS),
                   echo=bool(body.get("echo")), as_ids=bool(body.get("return_tokens_as_token_ids")))
    best_of = body.get("best_of")
    if best_of is not None and best_of != c.n:
        raise ApiError(400, "'best_of' other than n is not supported by this server", "best_of")
    if c.max_tokens == 0 and not c.echo:
        raise ApiError(400, "'max_tokens' must be at least 1 (0 only with 'echo', to score the prompt)", "max_tokens")
    ext = body.get("studio")
    if ext is not None and extension:  # a plain server ignores unknown fields, as vLLM does
        if not isinstance(ext, dict):
            raise ApiError(400, "'studio' must be an object", "studio")
        c.stats = bool(ext.get("stats"))
        c.top_k = _num(ext, "top_k", int, c.logprobs or 5, 1, MAX_LOGPROBS)
        if ext.get("prefix") is not None or ext.get("choices") is not None:
            c.prefix = _ids(ext.get("prefix") or [], "studio.prefix")
            ch = ext.get("choices")
            if not isinstance(ch, list) or not ch or not all(x is None or (isinstance(x, int) and not isinstance(x, bool))
                                                            for x in ch):
                raise ApiError(400, "'studio.choices' must be a non-empty list of token ids or nulls", "studio.choices")
            c.choices = list(dict.fromkeys(ch))
            if len(prompts) != 1 or c.echo:
                raise ApiError(400, "a fork request ('studio.prefix') takes one prompt and no echo", "studio.prefix")
            if len(c.prefix) + 1 > c.max_tokens:
                raise ApiError(400, f"the fork is at position {len(c.prefix)} but max_tokens is {c.max_tokens} "
                                    "(in a fork request it bounds the whole completion, prefix included)", "max_tokens")
            if len(c.choices) * c.n > MAX_ROWS:
                raise ApiError(400, f"{len(c.choices)} choices × n {c.n} is more than {MAX_ROWS} completions", "n")
        if ext.get("completions") is not None:
            comps = ext["completions"]
            if not isinstance(comps, list) or len(comps) != len(prompts):
                raise ApiError(400, "'studio.completions' must hold one list of token ids per prompt",
                               "studio.completions")
            c.completions = [_ids(x, "studio.completions") for x in comps]
            if not c.echo or c.max_tokens != 0:
                raise ApiError(400, "'studio.completions' needs 'echo': true and 'max_tokens': 0", "studio.completions")
    if c.prefix is None and len(prompts) * c.n > MAX_ROWS:
        raise ApiError(400, f"{len(prompts)} prompts × n {c.n} is more than {MAX_ROWS} completions", "n")
    return c


# ---------------------------------------------------------------------------- the model side

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
                 extension: bool = True, delay_s: float = 0.0):
        self.policy_path, self.reward_path = policy, reward_model
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
        from .policy import load_policy

        p = load_policy(self.policy_path)
        self.loaded = True
        return p

    def reward_model(self):
        from .reward_model import load_reward_model

        if self.reward_path is None:
            raise ApiError(404, "this server has no reward model: start it with --reward-model PATH")
        return load_reward_model(self.reward_path)

    @functools.cached_property
    def tokenizer(self):  # info thread only
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.policy_path)

    @functools.cached_property
    def device(self) -> str:
        from .device import pick_device

        return pick_device()

    def card(self) -> dict:
        """``/v1/models``'s entry for the policy (info thread: hashes the weights once)."""
        c = {"id": self.name, "object": "model", "created": int(time.time()), "owned_by": "rollout-studio",
             "root": self.name, "parent": None, "max_model_len": self.max_model_len}
        if self.extension:
            c["studio"] = {"version": weights_version(self.policy_path), "device": self.device,
                           "vocab_size": self.vocab_size, "eos_token_id": self.tokenizer.eos_token_id}
        return c

    def pieces(self, tok, ids: list[int]) -> list[str]:
        """Each id decoded alone with ``tok`` (special tokens keep their names), cached."""
        missing = sorted({int(i) for i in ids} - self._pieces.keys())
        if missing:
            self._pieces.update(zip(missing, tok.batch_decode([[i] for i in missing], skip_special_tokens=False)))
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
        for name, seqs in (("prompt", ids), ("studio.prefix", [r.prefix or []]), ("studio.completions", r.completions or []),
                           ("studio.choices", [[c for c in r.choices or [] if c is not None]])):
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
                                        "completion). Please reduce the length of the prompt or completion.", "max_tokens")
        return ids

    def _sample(self, policy, tok: _Pretokenized, ok: list, out: list) -> None:
        from .policy import sample_batch

        r0 = ok[0][1]
        keys = [p if isinstance(p, str) else tok.key(p) for _, r, _ in ok for p in r.prompts]
        seed = r0.seed if len(ok) == 1 and r0.seed is not None else random.randrange(2 ** 31)
        gens = sample_batch(policy.model, tok, keys, n=r0.n, temperature=r0.temperature, top_p=r0.top_p,
                            max_new_tokens=r0.max_tokens, seed=seed, top_k_stats=r0.k)
        at = 0
        for i, r, ids in ok:
            mine = gens[at * r.n:(at + len(r.prompts)) * r.n]
            at += len(r.prompts)
            choices = [self._choice(policy, r, j, g.text, _columns(g), g.finish_reason, g.text, g.finish_reason)
                       for j, g in enumerate(mine)]
            out[i] = self._response(r, choices, sum(map(len, ids)), sum(g.n_tokens for g in mine))

    def _fork(self, policy, tok: _Pretokenized, r: Completion, ids: list[int]) -> dict:
        from .policy import branch_batch

        prompt = r.prompts[0] if isinstance(r.prompts[0], str) else tok.key(ids)
        gens = branch_batch(policy.model, tok, prompt, r.prefix, r.choices, n=r.n, temperature=r.temperature,
                            top_p=r.top_p, max_new_tokens=r.max_tokens,
                            seed=r.seed if r.seed is not None else random.randrange(2 ** 31), top_k_stats=r.k)
        choices = [self._choice(policy, r, j, g.text, _columns(g), g.finish_reason, g.text, g.finish_reason)
                   for j, g in enumerate(gens)]
        return self._response(r, choices, len(ids), sum(g.n_tokens for g in gens))

    def _echo(self, policy, tok: _Pretokenized, r: Completion, ids: list[list[int]]) -> dict:
        """The prompt's tokens (teacher-forced statistics when asked for), then any sampled ones."""
        from .policy import sample_batch, score_batch, token_texts

        full = [s + (r.completions[j] if r.completions else []) for j, s in enumerate(ids)]
        start = [len(s) if r.completions else 1 for s in ids]
        scored = None
        if r.logprobs is not None or r.stats:
            scored = score_batch(policy.model, tok, [tok.key(f[:s]) for f, s in zip(full, start)],
                                 [f[s:] for f, s in zip(full, start)], top_k_stats=r.k)
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
                d = dict(zip(alt_names, cols["tkl"][t][:k]))
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
                "topk_ids": [row[:k] for row in cols["tki"][start:]], "topk_logprobs": [row[:k] for row in cols["tkl"][start:]],
                "text": studio_text, "finish_reason": studio_finish, "start": start}
        return choice

    def _response(self, r: Completion, choices: list[dict], prompt_tokens: int, completion_tokens: int) -> dict:
        return {"id": r.id, "object": "text_completion", "created": int(time.time()), "model": self.name,
                "choices": choices, "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                              "total_tokens": prompt_tokens + completion_tokens}}


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
                    for (_, fut), res in zip(group, results):
                        if not fut.done():
                            fut.set_result(res)
        finally:
            self.running = False


# ---------------------------------------------------------------------------- HTTP

class Handler(tornado.web.RequestHandler):
    """JSON in and out, OpenAI's error shape, Bearer auth on everything but ``/health``."""

    def initialize(self, engine: Engine, batcher: Batcher, api_key: str | None):
        self.engine, self.batcher, self.api_key = engine, batcher, api_key

    def prepare(self):
        if self.api_key and self.request.path != "/health":
            given = self.request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
                self.fail(ApiError(401, "missing or wrong API key: send 'Authorization: Bearer KEY' with the key "
                                        "the server was started with"))

    def body(self) -> object:
        try:
            return json.loads(self.request.body or b"null")
        except ValueError:
            raise ApiError(400, "the request body is not valid JSON") from None

    def reply(self, obj: dict, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(obj))

    def fail(self, err: ApiError) -> None:
        self.reply(err.body(), err.status)

    def write_error(self, status_code: int, **kwargs) -> None:  # tornado's own errors, same shape
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(ApiError(status_code, self._reason).body()))

    async def run(self, work) -> None:
        """Answer with ``await work()``; ApiErrors and failures in OpenAI's shape."""
        try:
            if self.engine.delay_s and self.request.path != "/health":
                await asyncio.sleep(self.engine.delay_s)
            self.reply(await work())
        except ApiError as exc:
            self.fail(exc)
        except Exception as exc:
            log.exception("request failed")
            self.fail(ApiError(500, f"{type(exc).__name__}: {exc}"))

    async def on_info_thread(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.engine.info_thread, fn, *args)


class Completions(Handler):
    req: Completion | None = None

    async def post(self):
        async def work():
            self.req = parse_completion(self.body(), self.engine.name, self.engine.extension)
            return await self.batcher.submit(self.req)
        await self.run(work)

    def on_connection_close(self) -> None:
        if self.req is not None:
            self.req.abandoned = True


class Models(Handler):
    async def get(self):
        async def work():
            return {"object": "list", "data": [await self.on_info_thread(self.engine.card)]}
        await self.run(work)


class Health(Handler):
    async def get(self):
        self.reply({"status": "ok", "policy_loaded": self.engine.loaded, "model_calls": self.batcher.calls,
                    "requests": self.batcher.requests, "busy": self.batcher.running,
                    "waiting": len(self.batcher.waiting)})


class Tokenize(Handler):
    async def post(self):
        async def work():
            b = self.body()
            if not isinstance(b, dict) or not isinstance(b.get("prompt"), str):
                raise ApiError(400, "'prompt' must be a string", "prompt")
            if b.get("model") not in (None, self.engine.name):
                raise ApiError(404, f"The model `{b['model']}` does not exist.", "model")
            special = bool(b.get("add_special_tokens", True))
            ids = await self.on_info_thread(lambda: self.engine.tokenizer(b["prompt"], add_special_tokens=special)["input_ids"])
            return {"count": len(ids), "max_model_len": self.engine.max_model_len, "tokens": ids, "token_strs": None}
        await self.run(work)


class Detokenize(Handler):
    async def post(self):
        async def work():
            b = self.body()
            if not isinstance(b, dict):
                raise ApiError(400, "the request body must be a JSON object")
            ids = _ids(b.get("tokens"), "tokens")
            skip = bool(b.get("skip_special_tokens", False)) if self.engine.extension else False
            text = await self.on_info_thread(lambda: self.engine.tokenizer.decode(ids, skip_special_tokens=skip))
            return {"prompt": text}
        await self.run(work)


class Pieces(Handler):
    async def post(self):
        async def work():
            b = self.body()
            ids = _ids(b.get("tokens") if isinstance(b, dict) else None, "tokens")
            return {"pieces": await self.on_info_thread(self.engine.pieces, self.engine.tokenizer, ids)}
        await self.run(work)


class Reward(Handler):
    async def post(self):
        async def work():
            b = self.body()
            if not isinstance(b, dict):
                raise ApiError(400, "the request body must be a JSON object")
            ps, cs = b.get("prompt"), b.get("completion")
            if not (isinstance(ps, list) and isinstance(cs, list) and len(ps) == len(cs)
                    and all(isinstance(x, str) for x in ps + cs)):
                raise ApiError(400, "'prompt' and 'completion' must be lists of strings of the same length", "prompt")

            def score():
                rm = self.engine.reward_model()
                from .reward_model import reward_model_version

                return rm, rm.score_rollouts(ps, cs), reward_model_version(rm.path)

            rm, scores, version = await asyncio.get_running_loop().run_in_executor(self.engine.model_thread, score)
            return {"object": "list", "model": rm.name, "version": version,
                    "data": [{"index": i, "object": "score", "score": float(s)} for i, s in enumerate(scores)]}
        await self.run(work)


class NotFound(Handler):
    def prepare(self):
        self.fail(ApiError(404, f"no such endpoint: {self.request.method} {self.request.path}"))


def make_app(engine: Engine, api_key: str | None = None) -> tornado.web.Application:
    """The tornado application serving ``engine`` (the extension's routes only when it is on)."""
    kw = {"engine": engine, "batcher": Batcher(engine), "api_key": api_key}
    routes = [(r"/v1/completions", Completions, kw), (r"/v1/models", Models, kw), (r"/health", Health, kw),
              (r"/tokenize", Tokenize, kw), (r"/detokenize", Detokenize, kw)]
    if engine.extension:
        routes += [(r"/studio/pieces", Pieces, kw), (r"/studio/reward", Reward, kw)]
    return tornado.web.Application(routes, default_handler_class=NotFound, default_handler_args=kw)


# ---------------------------------------------------------------------------- CLI

def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the server on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="rollout-studio backend",
        description="Serve a policy over HTTP with the OpenAI completions API (as vLLM implements it) and the "
                    "studio's extension (full-vocabulary entropy, fork branching). Point the studio at "
                    "http://HOST:PORT as its policy.")
    ap.add_argument("--policy", metavar="PATH", required=True, help="policy folder (transformers causal LM), or 'sample'")
    ap.add_argument("--reward-model", metavar="PATH", default=None, help="reward-model folder served at POST /studio/reward")
    ap.add_argument("--port", metavar="N", type=int, default=8000, help="port to listen on (default 8000)")
    ap.add_argument("--host", metavar="ADDR", default="127.0.0.1",
                    help="address to bind (default 127.0.0.1); any other needs --api-key")
    ap.add_argument("--api-key", metavar="KEY", default=None,
                    help=f"key clients must send as 'Authorization: Bearer KEY' (default ${ENV_KEY})")
    ap.add_argument("--served-model-name", metavar="NAME", default=None, help="model name in the API (default the folder's name)")
    ap.add_argument("--no-extension", action="store_true",
                    help="answer like a plain vLLM server: standard fields only, no /studio routes")
    ap.add_argument("--delay", metavar="S", type=float, default=0.0,
                    help="answer every request but /health this many seconds late (for testing timeouts)")
    return ap


def _folder(arg: str) -> Path:
    if arg == "sample":
        from sample_data import POLICY_DIR
        return POLICY_DIR
    return Path(arg).expanduser().resolve()


def main(argv: list[str] | None = None) -> int:
    """``rollout-studio backend``; returns the exit code."""
    args = build_parser().parse_args(argv)
    key = args.api_key or os.environ.get(ENV_KEY) or None
    if not is_loopback(args.host) and not key:
        print(f"error: refusing to listen on {args.host} without an API key: anyone who reaches the port could run "
              f"the model. Add --api-key KEY (or set {ENV_KEY}) and give the studio the same key, or keep the default "
              "--host 127.0.0.1 and reach it through a tunnel (ssh -L 8000:127.0.0.1:8000 gpu-box).", file=sys.stderr)
        return 2
    if not 0 < args.port < 65536:
        print(f"error: --port must be 1-65535, got {args.port}", file=sys.stderr)
        return 2
    policy = _folder(args.policy)
    reward = Path(args.reward_model).expanduser().resolve() if args.reward_model else None
    try:
        check_policy_folder(policy)
        if reward is not None:
            check_policy_folder(reward)
    except PolicyLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    engine = Engine(policy, reward, args.served_model_name, extension=not args.no_extension, delay_s=args.delay)
    if engine.device == "cpu":
        import torch

        from .device import cpu_threads

        torch.set_num_threads(cpu_threads())  # one core stays with the HTTP loop
    return asyncio.run(_serve(engine, args.host, args.port, key))


async def _serve(engine: Engine, host: str, port: int, key: str | None) -> int:
    app = make_app(engine, key)
    try:
        server = app.listen(port, address=host, xheaders=False)
    except OSError as exc:
        print(f"error: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    engine.info_thread.submit(engine.card)  # tokenizer and weights hash ready before the first client asks
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    shown = f"[{host}]" if ":" in host else host
    print(f"Rollout Studio backend on http://{shown}:{port}  (policy {engine.policy_path.name}"
          f"{f', reward model {engine.reward_path.name}' if engine.reward_path else ''}, device {engine.device}, "
          f"extension {'on' if engine.extension else 'off'}, {'API key required' if key else 'no API key'})", flush=True)
    await stop.wait()
    server.stop()
    engine.model_thread.shutdown(wait=False, cancel_futures=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
