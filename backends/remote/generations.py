"""A completions response's choices as :class:`Generation` records: exact from the
extension's ``studio`` fields, estimated from a plain server's standard logprobs.

Degraded mode (a plain OpenAI-compatible server: vLLM, SGLang): token ids come from vLLM's
``return_tokens_as_token_ids``, and each token's entropy is *estimated* from its
top-``ESTIMATE_TOP_K`` logprobs (:func:`entropy_bounds`); every such ``Generation`` says so
(``entropy_estimate``). Torch-free: numpy only.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..types import Generation
from .errors import IncompatibleBackend

ESTIMATE_TOP_K = 20  # logprobs asked of a plain server to estimate entropy (vLLM's default --max-logprobs)
Alternatives = list[list[tuple[int, float]]]  # per token: (token id, logprob) of its top alternatives


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


def sorted_choices(resp: dict) -> list[dict]:
    """A completions response's choices in index order."""
    return sorted(resp.get("choices") or [], key=lambda c: c["index"])


def from_studio(choice: dict, prompt: str, n: int, k: int) -> Generation:
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


def token_id(token: str, url: str) -> int:
    """The id in a token named ``"token_id:N"`` (vLLM's ``return_tokens_as_token_ids``)."""
    if isinstance(token, str) and token.startswith("token_id:"):
        return int(token[len("token_id:"):])
    raise IncompatibleBackend(
        f"{url} returned tokens as text ({str(token)[:20]!r}), not ids: the studio needs token ids. A vLLM server "
        "gives them for 'return_tokens_as_token_ids'; or serve the policy with `rollout-studio backend`")


def standard_tokens(choice: dict, k: int, url: str) -> tuple[list[int], list[float | None], Alternatives]:
    """A plain server's choice (asked for ``k`` logprobs, tokens as ids): its token ids, their
    logprobs, and each token's ``(id, logprob)`` alternatives."""
    lp = choice.get("logprobs")
    if not lp or not lp.get("tokens"):
        if lp and lp.get("tokens") == []:
            return [], [], []
        raise IncompatibleBackend(f"{url} returned no logprobs although asked for them")
    ids = [token_id(t, url) for t in lp["tokens"]]
    top = [[(token_id(t, url), float(v)) for t, v in (d or {}).items()] for d in lp["top_logprobs"]]
    return ids, list(lp["token_logprobs"]), top


def estimated(url: str, pieces_of: Callable[[list[int]], list[str]], prompt_index: int, sample_idx: int,
              prompt: str, text: str | None, ids: list[int], lps: list, top: Alternatives, k: int,
              k_asked: int, finish_reason: str) -> Generation:
    """A Generation from standard fields: the top ``k`` of the ``k_asked`` alternatives
    returned per token, and the entropy's lower bound from all of them; ``pieces_of`` gives
    the tokens' texts (asked only once the alternatives passed their check)."""
    T = len(ids)
    width = max([len(t) for t in top] + [k])
    mat = np.full((T, width), -np.inf)
    tki, tkl = np.zeros((T, k), np.int64), np.zeros((T, k), np.float32)
    for t, entries in enumerate(top):
        entries = sorted(entries, key=lambda e: -e[1])
        if len(entries) < k:
            raise IncompatibleBackend(f"{url} returned {len(entries)} alternatives at a token, fewer than the "
                                      f"{k} asked for (is its --max-logprobs lower?)")
        mat[t, :len(entries)] = [v for _, v in entries]
        tki[t] = [i for i, _ in entries[:k]]
        tkl[t] = [v for _, v in entries[:k]]
    lower = entropy_bounds(mat, k=k_asked)[0] if T else np.zeros(0)
    pieces = pieces_of(ids)
    return Generation(
        prompt_index=prompt_index, sample_idx=sample_idx, prompt=prompt,
        text="".join(pieces) if text is None else text, token_ids=np.asarray(ids, np.int64), token_texts=pieces,
        logprobs=np.asarray([np.nan if v is None else v for v in lps], np.float32).reshape(T),
        entropies=np.asarray(lower, np.float32).reshape(T), topk_ids=tki, topk_logprobs=tkl,
        finish_reason="stop" if finish_reason == "stop" else "length", entropy_estimate=True)
