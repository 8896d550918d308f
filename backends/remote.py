"""Remote policies: a backend on another machine, reached over the OpenAI completions API.

``RemotePolicy(url)`` has the methods and return types of ``backends.policy.Policy``
(``sample``, ``branch``, ``score``, ``tokenizer``, ``device``, ``name``), so a worker job
runs a URL exactly as it runs a folder (``load_policy`` dispatches). Torch-free: numpy and
the standard library only.

Two kinds of server:
- ``rollout-studio backend`` (``backends.server``) offers the studio extension: exact
  full-vocabulary entropies with token ids and top-k in one response, forced-prefix
  continuation for fork branching, teacher forcing of given completion ids. Results equal
  the local backend's for the same seed and settings.
- a plain OpenAI-compatible server (vLLM, SGLang) offers only standard fields. Sampling and
  scoring still work: token ids come from vLLM's ``return_tokens_as_token_ids``, and each
  token's entropy is *estimated* from its top-``ESTIMATE_TOP_K`` logprobs
  (:func:`entropy_bounds`); every ``Generation`` says so (``entropy_estimate``) and the
  policy version carries the mark (``…@entropy-est-top20``). Branching needs the
  extension and is refused (:class:`ExtensionRequired`).

Every failure is a :class:`RemoteError` (a ``PolicyLoadError``, so callers that show a
policy's problems show these too) whose message names the URL and what to do.
"""
from __future__ import annotations

import functools
import http.client
import json
import os
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from .types import Generation, PolicyLoadError

ENV_KEY = "ROLLOUT_STUDIO_API_KEY"  # the API key, never stored or shown
ENV_TIMEOUT = "ROLLOUT_STUDIO_REMOTE_TIMEOUT"  # seconds a model request may take (default DEFAULT_TIMEOUT_S)
DEFAULT_TIMEOUT_S = 120.0
HEALTH_TIMEOUT_S = 5.0
INFO_TTL_S = 30.0  # how long a server's model card is trusted before it is read again
ESTIMATE_TOP_K = 20  # logprobs asked of a plain server to estimate entropy (vLLM's default --max-logprobs)
CHUNK = 64  # prompts per scoring request


class RemoteError(PolicyLoadError):
    """A remote backend could not do what was asked; the message names the URL and what to do."""


class BackendUnavailable(RemoteError, ConnectionError):
    """Nothing answers at the URL, or the server closed the connection before answering."""


class BackendTimeout(RemoteError, TimeoutError):
    """The server did not answer within the timeout."""


class BackendAuthError(RemoteError, PermissionError):
    """The server refused the API key (HTTP 401 or 403)."""


class BackendRequestError(RemoteError):
    """The server refused the request as invalid (HTTP 4xx); its message is passed on."""


class BackendServerError(RemoteError):
    """The server failed while answering (HTTP 5xx)."""


class ExtensionRequired(RemoteError):
    """The feature needs the rollout-studio extension, which this server (plain vLLM/SGLang) lacks."""


class IncompatibleBackend(RemoteError):
    """The server answers, but not with what the studio needs (not JSON, no token ids)."""


def normalize_url(url: str) -> str:
    """The base URL of a backend: scheme, host, port and path prefix, no trailing ``/`` or ``/v1``.

    >>> normalize_url("http://gpu-box:8000/v1/")
    'http://gpu-box:8000'

    Raises:
        PolicyLoadError: not an http(s) URL, or it carries credentials, a query or a fragment.
    """
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise PolicyLoadError(f"{url!r} is not a backend URL: expected http://HOST:PORT or https://HOST[:PORT][/PATH]")
    if parts.username or parts.password:
        raise PolicyLoadError(f"the backend URL for {parts.hostname} carries credentials: remove them from the URL "
                              f"and set the API key in {ENV_KEY} (or pass --api-key), so it is never stored")
    if parts.query or parts.fragment:
        raise PolicyLoadError(f"the backend URL {url!r} has a query or fragment: give only http(s)://HOST:PORT[/PATH]")
    try:
        port = parts.port
    except ValueError:
        raise PolicyLoadError(f"the backend URL {url!r} has an invalid port") from None
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return f"{parts.scheme.lower()}://{host}{f':{port}' if port else ''}{path}"


def entropy_bounds(top_logprobs, vocab_size: int | None = None, k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Bounds on each row's entropy (nats) when only its most likely tokens' logprobs are known.

    With the known probabilities p_1 ≥ … ≥ p_m (the top k, plus the sampled token when it
    was outside them) and the tail mass r = 1 − Σ p_i spread over the V − m other tokens,
    none more likely than p_k::

        H_known = Σ −p_i log p_i
        lower   = H_known + m' (−p_k log p_k) − s log s,   m' = ⌊r / p_k⌋, s = r − m' p_k
        upper   = H_known − r log(r / (V − m))

    The lower bound packs the tail into as few tokens as the top k allow (it is
    H_known − r log r whenever r ≤ p_k); the upper spreads it evenly (infinite when V is
    unknown). Rows may be padded with −inf. The studio stores the lower bound as its
    estimate: it never overstates a token's entropy.

    Args:
        top_logprobs: ``[T, m]`` logprobs of distinct tokens of each row (any order).
        vocab_size: V, when known (needed for the upper bound).
        k: how many of them were the top k (default all ``m``).

    Returns:
        ``(lower, upper)``, each ``[T]``.

    >>> lo, hi = entropy_bounds([[np.log(0.5), np.log(0.25)]], vocab_size=3)  # the third token holds 0.25
    >>> round(float(lo[0]), 4), round(float(hi[0]), 4)  # both exact: the tail is one token
    (1.0397, 1.0397)
    """
    lp = np.asarray(top_logprobs, np.float64)
    if lp.ndim == 1:
        lp = lp[None]
    if lp.shape[-1] == 0:
        inf = np.full(lp.shape[0], np.inf)
        return np.zeros(lp.shape[0]), inf
    lp = -np.sort(-lp, axis=-1)  # [T, m] descending, -inf padding last
    p = np.exp(lp)
    known = _xlogx(p).sum(-1)
    r = np.clip(1.0 - p.sum(-1), 0.0, 1.0)
    k = lp.shape[-1] if k is None else max(1, min(k, lp.shape[-1]))
    cap = p[:, k - 1]  # the k-th largest: no token outside the known ones is more likely
    cap = np.where(cap > 0, cap, np.maximum(r, 1e-300))  # unknown cap: the tail may be one token
    full = np.floor(r / cap)
    lower = known + full * _xlogx(cap) + _xlogx(np.clip(r - full * cap, 0.0, None))
    if vocab_size is None:
        return lower, np.full_like(lower, np.inf)
    rest = np.maximum(vocab_size - (p > 0).sum(-1), 1)
    upper = known + np.where(r > 0, -r * np.log(np.where(r > 0, r, 1.0) / rest), 0.0)
    return lower, np.maximum(upper, lower)


def _xlogx(x: np.ndarray) -> np.ndarray:
    """−x log x elementwise, 0 at 0."""
    x = np.asarray(x, np.float64)
    return np.where(x > 0, -x * np.log(np.where(x > 0, x, 1.0)), 0.0)


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

    def info(self, refresh: bool = False, timeout: float | None = None) -> BackendInfo:
        """The server's model card (cached for ``INFO_TTL_S``); raises :class:`RemoteError`."""
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
            eos_token_id=(ext or {}).get("eos_token_id"), max_model_len=card.get("max_model_len"), latency_s=latency)
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
            return [_from_studio(c, prompts[c["index"] // n], n, top_k_stats) for c in _choices(resp)]
        body.update(logprobs=max(top_k_stats, ESTIMATE_TOP_K), return_tokens_as_token_ids=True)
        resp = self._call("POST", "/v1/completions", body)
        out = []
        for c in _choices(resp):
            ids, lps, top = self._standard_tokens(c, body["logprobs"])
            out.append(self._estimated(c["index"] // n, c["index"] % n, prompts[c["index"] // n], c.get("text") or "",
                                       ids, lps, top, top_k_stats, body["logprobs"], c.get("finish_reason") or "length"))
        return out

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
        return [_from_studio(c, prompt, n, top_k_stats) for c in _choices(resp)]

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
                for c in _choices(self._call("POST", "/v1/completions", body)):
                    g = _from_studio(c, ps[c["index"]], 1, top_k_stats)
                    g.prompt_index = lo + c["index"]
                    out.append(g)
                continue
            # standard echo: the prompt's ids + the completion's as one token-id prompt; one token
            # is generated (vLLM refuses max_tokens 0 in some versions) and dropped
            p_ids = [self.tokenizer(p)["input_ids"] for p in ps]
            k_est = max(top_k_stats, ESTIMATE_TOP_K)
            body = {"model": info.model, "prompt": [p + c for p, c in zip(p_ids, cs)], "echo": True, "max_tokens": 1,
                    "temperature": 0.0, "logprobs": k_est, "return_tokens_as_token_ids": True}
            for c in _choices(self._call("POST", "/v1/completions", body)):
                i = c["index"]
                ids, lps, top = self._standard_tokens(c, k_est)
                sl = slice(len(p_ids[i]), len(p_ids[i]) + len(cs[i]))
                if ids[sl] != cs[i]:
                    raise IncompatibleBackend(f"{self.url} echoed other token ids than it was sent: it cannot "
                                              "teacher-force given completions")
                eos = info.eos_token_id
                g = self._estimated(lo + i, 0, ps[i], None, ids[sl], lps[sl], top[sl], top_k_stats, k_est,
                                    "stop" if cs[i] and eos is not None and cs[i][-1] == eos else "length")
                out.append(g)
        return out

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

    # -- standard fields -> Generation (plain servers) -----------------------------------
    def _standard_tokens(self, choice: dict, k: int) -> tuple[list[int], list[float | None], list[list[tuple[int, float]]]]:
        lp = choice.get("logprobs")
        if not lp or not lp.get("tokens"):
            if lp and lp.get("tokens") == []:
                return [], [], []
            raise IncompatibleBackend(f"{self.url} returned no logprobs although asked for them")
        ids = [_token_id(t, self.url) for t in lp["tokens"]]
        top = [[(_token_id(t, self.url), float(v)) for t, v in (d or {}).items()] for d in lp["top_logprobs"]]
        return ids, list(lp["token_logprobs"]), top

    def _estimated(self, prompt_index: int, sample_idx: int, prompt: str, text: str | None, ids: list[int],
                   lps: list, top: list[list[tuple[int, float]]], k: int, k_asked: int,
                   finish_reason: str) -> Generation:
        """A Generation from standard fields: the top ``k`` of the ``k_asked`` alternatives
        returned per token, and the entropy's lower bound from all of them."""
        T = len(ids)
        width = max([len(t) for t in top] + [k])
        mat = np.full((T, width), -np.inf)
        tki, tkl = np.zeros((T, k), np.int64), np.zeros((T, k), np.float32)
        for t, entries in enumerate(top):
            entries = sorted(entries, key=lambda e: -e[1])
            if len(entries) < k:
                raise IncompatibleBackend(f"{self.url} returned {len(entries)} alternatives at a token, fewer than the "
                                          f"{k} asked for (is its --max-logprobs lower?)")
            mat[t, :len(entries)] = [v for _, v in entries]
            tki[t] = [i for i, _ in entries[:k]]
            tkl[t] = [v for _, v in entries[:k]]
        lower = entropy_bounds(mat, k=k_asked)[0] if T else np.zeros(0)
        pieces = self.tokenizer.pieces(ids)
        return Generation(
            prompt_index=prompt_index, sample_idx=sample_idx, prompt=prompt,
            text="".join(pieces) if text is None else text, token_ids=np.asarray(ids, np.int64), token_texts=pieces,
            logprobs=np.asarray([np.nan if v is None else v for v in lps], np.float32).reshape(T),
            entropies=np.asarray(lower, np.float32).reshape(T), topk_ids=tki, topk_logprobs=tkl,
            finish_reason="stop" if finish_reason == "stop" else "length", entropy_estimate=True)

    # -- HTTP ------------------------------------------------------------------------------
    def _call(self, method: str, path: str, body: dict | None = None, timeout: float | None = None) -> dict:
        """One JSON request; every failure becomes a :class:`RemoteError` naming the URL."""
        t = self.timeout if timeout is None else timeout
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        req = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=t) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise self._http_error(exc, path) from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, (TimeoutError, socket.timeout)):
                raise self._timeout(path, t) from None
            raise BackendUnavailable(
                f"no backend answers at {self.url} ({_reason(exc.reason)}). Start it on the GPU machine with "
                "`rollout-studio backend --policy PATH --port N` (or check the address, and that the port is "
                "reachable, e.g. through `ssh -L`), then retry") from None
        except (TimeoutError, socket.timeout):
            raise self._timeout(path, t) from None
        except (http.client.HTTPException, OSError) as exc:
            raise BackendUnavailable(
                f"the backend at {self.url} closed the connection before answering {path} ({_reason(exc)}): it "
                "stopped or crashed. Check its log, restart it, then retry") from None
        try:
            return json.loads(raw)
        except ValueError:
            raise IncompatibleBackend(f"{self.url}{path} answered with something that is not JSON: "
                                      "is this an OpenAI-compatible server?") from None

    def _timeout(self, path: str, t: float) -> BackendTimeout:
        return BackendTimeout(f"the backend at {self.url} did not answer {path} within {t:g} s: it is busy or stuck. "
                              f"Retry, or allow longer with {ENV_TIMEOUT} (seconds)")

    def _http_error(self, exc: urllib.error.HTTPError, path: str) -> RemoteError:
        try:
            raw = exc.read()
        except (OSError, http.client.HTTPException):
            raw = b""
        msg = _error_message(raw) or exc.reason or "no message"
        if exc.code in (401, 403):
            what = ("it needs an API key: set" if not self._key else "the key sent is not the one it was started with: set")
            return BackendAuthError(f"the backend at {self.url} refused {path} ({exc.code}: {msg}); {what} the server's "
                                    f"key in {ENV_KEY} (or pass --api-key) and retry")
        if exc.code >= 500:
            return BackendServerError(f"the backend at {self.url} failed on {path} ({exc.code}): {msg}. "
                                      "See the server's log; retry once it is fixed")
        return BackendRequestError(f"the backend at {self.url} refused {path} ({exc.code}): {msg}")


class RemoteTokenizer:
    """What worker jobs use of a tokenizer, answered by the backend: calling it on one text
    (``/tokenize``), ``decode`` / ``batch_decode`` (``/detokenize``), ``eos_token_id`` (the
    extension's model card; None from a plain server), and :meth:`pieces` (each token's
    own text). Encodings and pieces are cached per process."""

    def __init__(self, policy: RemotePolicy):
        self._policy = policy
        self._enc: dict[tuple[str, bool], list[int]] = {}
        self._pieces: dict[int, str] = {}

    @property
    def eos_token_id(self) -> int | None:
        return self._policy.info().eos_token_id

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        if not isinstance(text, str):
            raise TypeError("a remote tokenizer encodes one text per call")
        key = (text, bool(add_special_tokens))
        if key not in self._enc:
            if len(self._enc) > 4096:
                self._enc.clear()
            r = self._policy._call("POST", "/tokenize", {"model": self._policy.info().model, "prompt": text,
                                                         "add_special_tokens": bool(add_special_tokens)})
            self._enc[key] = [int(i) for i in r["tokens"]]
        return {"input_ids": list(self._enc[key])}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        info = self._policy.info()
        body = {"model": info.model, "tokens": [int(i) for i in ids]}
        if info.extension:  # a plain server decodes as it does (vLLM: special tokens kept)
            body["skip_special_tokens"] = bool(skip_special_tokens)
        return str(self._policy._call("POST", "/detokenize", body)["prompt"])

    def batch_decode(self, seqs, skip_special_tokens: bool = False) -> list[str]:
        return [self.decode(s, skip_special_tokens) for s in seqs]

    def pieces(self, ids, timeout: float | None = None) -> list[str]:
        """Each token's text decoded alone (special tokens keep their names): one
        ``/studio/pieces`` request for the ones not cached (extension), else one
        ``/detokenize`` each, eight at a time."""
        ids = [int(i) for i in ids]
        missing = sorted(set(ids) - self._pieces.keys())
        if missing:
            info = self._policy.info(timeout=timeout)
            if info.extension:
                got = self._policy._call("POST", "/studio/pieces", {"tokens": missing}, timeout=timeout)["pieces"]
            else:
                def one(i: int) -> str:
                    return str(self._policy._call("POST", "/detokenize", {"model": info.model, "tokens": [i]},
                                                  timeout=timeout)["prompt"])

                with ThreadPoolExecutor(max_workers=8) as ex:
                    got = list(ex.map(one, missing))
            self._pieces.update(zip(missing, got))
        return [self._pieces[i] for i in ids]


def _choices(resp: dict) -> list[dict]:
    return sorted(resp.get("choices") or [], key=lambda c: c["index"])


def _from_studio(choice: dict, prompt: str, n: int, k: int) -> Generation:
    """A Generation from a choice's extension fields (exact statistics)."""
    s = choice.get("studio")
    if not isinstance(s, dict):
        raise IncompatibleBackend("the backend announced the rollout-studio extension but its answer lacks the "
                                  "'studio' fields: is a proxy rewriting responses?")
    i = int(choice["index"])
    return Generation(
        prompt_index=i // n, sample_idx=i % n, prompt=prompt, text=s["text"],
        token_ids=np.asarray(s["token_ids"], np.int64), token_texts=list(s["token_texts"]),
        logprobs=np.asarray(s["logprobs"], np.float32), entropies=np.asarray(s["entropies"], np.float32),
        topk_ids=np.asarray(s["topk_ids"], np.int64).reshape(-1, k),
        topk_logprobs=np.asarray(s["topk_logprobs"], np.float32).reshape(-1, k),
        finish_reason=s.get("finish_reason") or choice.get("finish_reason") or "length")


def _token_id(token: str, url: str) -> int:
    if isinstance(token, str) and token.startswith("token_id:"):
        return int(token[len("token_id:"):])
    raise IncompatibleBackend(
        f"{url} returned tokens as text ({str(token)[:20]!r}), not ids: the studio needs token ids. A vLLM server "
        "gives them for 'return_tokens_as_token_ids'; or serve the policy with `rollout-studio backend`")


def _reason(reason: object) -> str:
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, socket.gaierror):
        return "unknown host"
    return str(reason) or type(reason).__name__


def _error_message(raw: bytes) -> str:
    """The message of an error body: OpenAI's ``{"error": {"message"}}``, vLLM's older flat
    ``{"message"}``, FastAPI's ``{"detail"}``, or the text itself."""
    try:
        body = json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace").strip()[:300]
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        for key in ("message", "detail", "error"):
            if body.get(key):
                return str(body[key])
    return str(body)[:300]


@functools.lru_cache(maxsize=8)
def _cached(url: str, key: str | None) -> RemotePolicy:
    return RemotePolicy(url, api_key=key)


def load_remote(url: str) -> RemotePolicy:
    """One client per URL and key per process (its caches are shared), the key from
    ``$ROLLOUT_STUDIO_API_KEY``."""
    return _cached(normalize_url(url), os.environ.get(ENV_KEY) or None)


def remote_info(url: str, timeout: float = HEALTH_TIMEOUT_S) -> BackendInfo:
    """Check the backend at ``url`` now; raises :class:`RemoteError` saying what is wrong."""
    return load_remote(url).info(refresh=True, timeout=timeout)
