"""The backend's wire protocol: request and response shapes, parsing and validation, errors.

The OpenAI completions API as vLLM implements it, plus the studio's extension. Nothing here
touches a model or a socket: :func:`parse_completion` turns a request body into a
:class:`Completion` or raises an :class:`ApiError` naming the first problem.

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
  ``max_tokens: 0``) teacher-forces these token ids after each prompt and scores only them;
  ``call_end`` (a text, e.g. ``"</tool_call>"``) ends each row once it has written that text's
  tokens (a tool call closed: ``studio.finish_reason`` ``call``, standard ``finish_reason``
  ``stop``), the turn of an agent loop run by the client (``backends.remote.agent``); it works
  with ``prefix`` too.
- ``GET /v1/models``: ``data[0].studio`` = ``{version, device, vocab_size, eos_token_id}``.
- ``POST /studio/pieces`` ``{tokens}`` → ``{pieces}``: each token's text decoded alone.
- ``POST /studio/reward`` ``{prompt: [...], completion: [...]}`` →
  ``{model, version, data: [{index, score}]}`` with ``--reward-model``: the reward model's
  score of ``prompt + completion`` (``backends.reward_model``).

Errors have OpenAI's shape ``{"error": {"message", "type", "param", "code"}}`` with the HTTP
status as ``code``:

>>> ApiError(400, "'n' must be an integer, got 'x'", "n").body()["error"]["type"]
'BadRequestError'
>>> parse_completion({"prompt": "Q: 1+1=", "n": 2}, "policy", True).batch_key()
(2, 1.0, 1.0, 16, None, False, False, 5, None)
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field

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
        """The JSON error object sent to the client."""
        return {"error": {"message": self.message, "type": self.TYPES.get(self.status, "BadRequestError"),
                          "param": self.param, "code": self.status}}


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
    call_end: str | None = None  # extension: a row ends once it wrote this text's tokens (an agent turn)
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
                self.top_k, self.call_end)


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


def parse_ids(v, name: str) -> list[int]:
    """``v`` if it is a list of token ids, else an :class:`ApiError` naming the field ``name``."""
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
        raise ApiError(400, "streaming is not supported by this server: send 'stream': false (or leave it out)",
                       "stream")
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
        prompts = [parse_ids(x, "prompt") for x in p]
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
            c.prefix = parse_ids(ext.get("prefix") or [], "studio.prefix")
            ch = ext.get("choices")
            if not isinstance(ch, list) or not ch or not all(
                    x is None or (isinstance(x, int) and not isinstance(x, bool)) for x in ch):
                raise ApiError(400, "'studio.choices' must be a non-empty list of token ids or nulls", "studio.choices")
            c.choices = list(dict.fromkeys(ch))
            if len(prompts) != 1 or c.echo:
                raise ApiError(400, "a fork request ('studio.prefix') takes one prompt and no echo", "studio.prefix")
            if len(c.prefix) + 1 > c.max_tokens:
                raise ApiError(400, f"the fork is at position {len(c.prefix)} but max_tokens is {c.max_tokens} "
                                    "(in a fork request it bounds the whole completion, prefix included)", "max_tokens")
            if len(c.choices) * c.n > MAX_ROWS:
                raise ApiError(400, f"{len(c.choices)} choices × n {c.n} is more than {MAX_ROWS} completions", "n")
        if ext.get("call_end") is not None:
            if not isinstance(ext["call_end"], str) or not ext["call_end"]:
                raise ApiError(400, "'studio.call_end' must be a non-empty text", "studio.call_end")
            if c.echo:
                raise ApiError(400, "'studio.call_end' samples turns: it takes no 'echo'", "studio.call_end")
            c.call_end = ext["call_end"]
        if ext.get("completions") is not None:
            comps = ext["completions"]
            if not isinstance(comps, list) or len(comps) != len(prompts):
                raise ApiError(400, "'studio.completions' must hold one list of token ids per prompt",
                               "studio.completions")
            c.completions = [parse_ids(x, "studio.completions") for x in comps]
            if not c.echo or c.max_tokens != 0:
                raise ApiError(400, "'studio.completions' needs 'echo': true and 'max_tokens': 0", "studio.completions")
    if c.prefix is None and len(prompts) * c.n > MAX_ROWS:
        raise ApiError(400, f"{len(prompts)} prompts × n {c.n} is more than {MAX_ROWS} completions", "n")
    return c

