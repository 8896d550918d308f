"""``RemotePolicy(url)``: a policy served by a backend elsewhere, with the methods and return
types of ``backends.policy.Policy`` (``sample``, ``branch``, ``score``, ``sample_agent``,
``branch_agent``, ``tokenizer``, ``device``, ``name``), so a worker job runs a URL exactly as it
runs a folder (``load_policy`` dispatches). Against the rollout-studio extension its results are
exact; against a plain server they are estimated (:mod:`.generations`), and branching and the
agent loop are refused (:class:`.ExtensionRequired`). One client per URL and key per process (:func:`load_remote`).
"""
from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass

import numpy as np

from ..types import Generation
from .errors import ExtensionRequired, IncompatibleBackend
from .generations import ESTIMATE_TOP_K, estimated, from_studio, sorted_choices, standard_tokens
from .tokenizer import RemoteTokenizer
from .transport import DEFAULT_TIMEOUT_S, ENV_KEY, ENV_TIMEOUT, HEALTH_TIMEOUT_S, normalize_url, request_json

INFO_TTL_S = 30.0  # how long a server's model card is trusted before it is read again
CHUNK = 64  # prompts per scoring request


@dataclass(frozen=True)
class BackendInfo:
    """What a backend says about itself (``GET /v1/models``), and how fast it said it."""

    url: str
    model: str
    extension: bool  # the rollout-studio extension is offered
    version: str  # the policy version runs record: url#folder@weights-hash, or url#model@entropy-est-topK
    device: str | None  # "cuda" / "cpu" (extension only)
    vocab_size: int | None
    eos_token_id: int | None
    max_model_len: int | None
    latency_s: float
    engine: str | None = None  # what the studio backend computes with ('torch 2.13.0 cuda bfloat16'; extension only)
    server: str | None = None  # the card's owned_by ('vllm', 'sglang', 'rollout-studio')

    def describe(self) -> dict:
        """What a run's config records about the backend (no key, no credentials)."""
        return {"url": self.url, "model": self.model, "version": self.version, "device": self.device,
                "extension": self.extension,
                "entropy": "full distribution" if self.extension else
                f"estimate: lower bound from the top-{ESTIMATE_TOP_K} logprobs (plain OpenAI-compatible server)"}


class RemotePolicy:
    """A policy served by a backend at ``url``: the interface of ``backends.policy.Policy``.

    Args:
        url: the server's base URL (``http://gpu-box:8000``; a trailing ``/v1`` is dropped).
        api_key: sent as ``Authorization: Bearer``; default ``$ROLLOUT_STUDIO_API_KEY``.
        timeout: seconds a model request may stay silent; default
            ``$ROLLOUT_STUDIO_REMOTE_TIMEOUT`` or 120. Health checks wait at most 5 s.
    """

    def __init__(self, url: str, api_key: str | None = None, timeout: float | None = None):
        self.url = normalize_url(url)
        self._key = api_key if api_key is not None else (os.environ.get(ENV_KEY) or None)
        self.timeout = float(timeout or os.environ.get(ENV_TIMEOUT) or DEFAULT_TIMEOUT_S)
        self._info: BackendInfo | None = None
        self._info_at = 0.0
        self.tokenizer = RemoteTokenizer(self)

    def __repr__(self) -> str:  # never the key
        return f"RemotePolicy({self.url!r})"

    # -- what it is -------------------------------------------------------------------
    @property
    def path(self) -> str:
        """The URL: what ``policy_version`` and the worker jobs are given, as a folder's path."""
        return self.url

    @property
    def name(self) -> str:
        return self.info().model

    @property
    def device(self) -> str:
        """``remote http://host:port (cuda)``: where the policy runs."""
        return f"remote {self.url} ({self.info().device or 'device not reported'})"

    @property
    def version(self) -> str:
        return self.info().version

    @property
    def engine(self) -> str:
        """What samples and scores (``rollouts.engine``): ``backend <url> (<the server's engine>)`` for the
        studio's backend, ``<server> <url> (precision unknown)`` for a plain one (``vllm http://h:8000 …``)."""
        info = self.info()
        if info.extension:
            return f"backend {self.url} ({info.engine or 'engine not reported'})"
        return f"{info.server or 'openai-compatible server'} {self.url} (precision unknown)"

    def _stamped(self, gens: list[Generation]) -> list[Generation]:
        engine = self.engine
        for g in gens:
            g.engine = engine
        return gens

    def info(self, refresh: bool = False, timeout: float | None = None) -> BackendInfo:
        """The server's model card (cached for ``INFO_TTL_S``); raises :class:`.RemoteError`."""
        if not refresh and self._info is not None and time.monotonic() - self._info_at < INFO_TTL_S:
            return self._info
        t0 = time.perf_counter()
        data = self._call("GET", "/v1/models", timeout=timeout)
        latency = time.perf_counter() - t0
        cards = data.get("data") if isinstance(data, dict) else None
        if not cards or not isinstance(cards[0], dict) or "id" not in cards[0]:
            raise IncompatibleBackend(f"{self.url}/v1/models lists no model: is this an OpenAI-compatible server?")
        card = cards[0]
        ext = card.get("studio") if isinstance(card.get("studio"), dict) else None
        model = str(card["id"])
        self._info = BackendInfo(
            url=self.url, model=model, extension=ext is not None,
            version=f"{self.url}#{ext['version']}" if ext else f"{self.url}#{model}@entropy-est-top{ESTIMATE_TOP_K}",
            device=(ext or {}).get("device"), vocab_size=(ext or {}).get("vocab_size"),
            eos_token_id=(ext or {}).get("eos_token_id"), max_model_len=card.get("max_model_len"), latency_s=latency,
            engine=(ext or {}).get("engine"), server=card.get("owned_by"))
        self._info_at = time.monotonic()
        return self._info

    def health(self) -> BackendInfo:
        """Check the server now (at most ``HEALTH_TIMEOUT_S``): its card, with the round trip time."""
        return self.info(refresh=True, timeout=min(HEALTH_TIMEOUT_S, self.timeout))

    # -- the Policy interface -----------------------------------------------------------
    def sample(self, prompts: list[str], n: int = 1, temperature: float = 1.0, top_p: float = 1.0,
               max_new_tokens: int = 64, seed: int = 0, top_k_stats: int = 5) -> list[Generation]:
        """See ``backends.policy.sample_batch``: ``n`` completions per prompt, prompt-major."""
        if not prompts:
            return []
        info = self.info()
        body = {"model": info.model, "prompt": list(prompts), "n": n, "temperature": temperature, "top_p": top_p,
                "max_tokens": max_new_tokens, "seed": seed}
        if info.extension:
            body["studio"] = {"stats": True, "top_k": top_k_stats}
            resp = self._call("POST", "/v1/completions", body)
            return self._stamped([from_studio(c, prompts[c["index"] // n], n, top_k_stats)
                                  for c in sorted_choices(resp)])
        body.update(logprobs=max(top_k_stats, ESTIMATE_TOP_K), return_tokens_as_token_ids=True)
        resp = self._call("POST", "/v1/completions", body)
        out = []
        for c in sorted_choices(resp):
            ids, lps, top = standard_tokens(c, body["logprobs"], self.url)
            out.append(estimated(self.url, self.tokenizer.pieces, c["index"] // n, c["index"] % n,
                                 prompts[c["index"] // n], c.get("text") or "", ids, lps, top, top_k_stats,
                                 body["logprobs"], c.get("finish_reason") or "length"))
        return self._stamped(out)

    def branch(self, prompt: str, prefix_ids: list[int], choices: list[int | None], n: int = 1,
               temperature: float = 1.0, top_p: float = 1.0, max_new_tokens: int = 64, seed: int = 0,
               top_k_stats: int = 5) -> list[Generation]:
        """See ``backends.policy.branch_batch`` (needs the extension: forced-prefix continuation)."""
        info = self.info()
        if not info.extension:
            raise ExtensionRequired(
                f"branching needs the rollout-studio extension (forced-prefix continuation, request field "
                f"'studio.prefix'), which the server at {self.url} does not offer (a plain OpenAI-compatible server "
                "such as vLLM or SGLang). Serve the policy with `rollout-studio backend --policy PATH`, "
                "or branch with a local policy folder")
        body = {"model": info.model, "prompt": prompt, "n": n, "temperature": temperature, "top_p": top_p,
                "max_tokens": max_new_tokens, "seed": seed,
                "studio": {"stats": True, "top_k": top_k_stats, "prefix": [int(i) for i in prefix_ids],
                           "choices": [None if c is None else int(c) for c in choices]}}
        resp = self._call("POST", "/v1/completions", body)
        return self._stamped([from_studio(c, prompt, n, top_k_stats) for c in sorted_choices(resp)])

    def sample_agent(self, prompts: list[str], env, **kwargs) -> list[Generation]:
        """See ``backends.agent.sample_agent``: the loop runs here, each turn sampled by the backend
        (:mod:`.agent`; needs the extension)."""
        from .agent import sample_agent

        return self._stamped(sample_agent(self, prompts, env, **kwargs))

    def branch_agent(self, prompt: str, prefix_ids: list[int], prefix_mask: list[bool] | None, prefix_turns,
                     choices: list[int | None], env, **kwargs) -> list[Generation]:
        """See ``backends.agent.branch_agent`` (:mod:`.agent`; needs the extension)."""
        from .agent import branch_agent

        return self._stamped(branch_agent(self, prompt, prefix_ids, prefix_mask, prefix_turns, choices, env,
                                          **kwargs))

    def score(self, prompts: list[str], completions: list[str | list[int]], top_k_stats: int = 5,
              batch_size: int = 8) -> list[Generation]:
        """See ``backends.policy.score_batch``: teacher-forced statistics of given completions.

        ``batch_size`` is the server's business (it batches as it can); requests carry up
        to ``CHUNK`` completions each.
        """
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        info = self.info()
        c_ids = [c if isinstance(c, list) else self.tokenizer(c, add_special_tokens=False)["input_ids"]
                 for c in completions]
        out: list[Generation] = []
        for lo in range(0, len(prompts), CHUNK):
            ps, cs = list(prompts[lo:lo + CHUNK]), [[int(i) for i in c] for c in c_ids[lo:lo + CHUNK]]
            if info.extension:
                body = {"model": info.model, "prompt": ps, "echo": True, "max_tokens": 0,
                        "studio": {"stats": True, "top_k": top_k_stats, "completions": cs}}
                for c in sorted_choices(self._call("POST", "/v1/completions", body)):
                    g = from_studio(c, ps[c["index"]], 1, top_k_stats)
                    g.prompt_index = lo + c["index"]
                    out.append(g)
                continue
            # standard echo: the prompt's ids + the completion's as one token-id prompt; one token
            # is generated (vLLM refuses max_tokens 0 in some versions) and dropped
            p_ids = [self.tokenizer(p)["input_ids"] for p in ps]
            k_est = max(top_k_stats, ESTIMATE_TOP_K)
            body = {"model": info.model, "prompt": [p + c for p, c in zip(p_ids, cs, strict=False)], "echo": True,
                    "max_tokens": 1, "temperature": 0.0, "logprobs": k_est, "return_tokens_as_token_ids": True}
            for c in sorted_choices(self._call("POST", "/v1/completions", body)):
                i = c["index"]
                ids, lps, top = standard_tokens(c, k_est, self.url)
                sl = slice(len(p_ids[i]), len(p_ids[i]) + len(cs[i]))
                if ids[sl] != cs[i]:
                    raise IncompatibleBackend(f"{self.url} echoed other token ids than it was sent: it cannot "
                                              "teacher-force given completions")
                eos = info.eos_token_id
                finish = "stop" if cs[i] and eos is not None and cs[i][-1] == eos else "length"
                g = estimated(self.url, self.tokenizer.pieces, lo + i, 0, ps[i], None, ids[sl], lps[sl], top[sl],
                              top_k_stats, k_est, finish)
                out.append(g)
        return self._stamped(out)

    def reward(self, prompts: list[str], completions: list[str]) -> np.ndarray:
        """Reward-model scores of ``prompt + completion`` (``POST /studio/reward``; a server
        started with ``--reward-model``). float32 ``[N]``."""
        if not self.info().extension:
            raise ExtensionRequired(f"reward scoring needs the rollout-studio extension ('/studio/reward'), which "
                                    f"the server at {self.url} does not offer")
        resp = self._call("POST", "/studio/reward", {"prompt": list(prompts), "completion": list(completions)})
        out = np.zeros(len(prompts), np.float32)
        for row in resp["data"]:
            out[row["index"]] = row["score"]
        return out

    # -- HTTP ------------------------------------------------------------------------------
    def _call(self, method: str, path: str, body: dict | None = None, timeout: float | None = None) -> dict:
        """One JSON request; every failure becomes a :class:`.RemoteError` naming the URL."""
        return request_json(self.url, self._key, method, path, body, self.timeout if timeout is None else timeout)


@functools.lru_cache(maxsize=8)
def _cached(url: str, key: str | None) -> RemotePolicy:
    return RemotePolicy(url, api_key=key)


def load_remote(url: str) -> RemotePolicy:
    """One client per URL and key per process (its caches are shared), the key from
    ``$ROLLOUT_STUDIO_API_KEY``."""
    return _cached(normalize_url(url), os.environ.get(ENV_KEY) or None)


def remote_info(url: str, timeout: float = HEALTH_TIMEOUT_S) -> BackendInfo:
    """Check the backend at ``url`` now; raises :class:`.RemoteError` saying what is wrong."""
    return load_remote(url).info(refresh=True, timeout=timeout)
