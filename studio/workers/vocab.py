"""Policy references (a folder, ``"sample"`` or a backend URL) and token texts for stored ids.

Token texts are the hover card's top-k alternatives. For a folder only its tokenizer's
``tokenizer.json`` is read, with the ``tokenizers`` library (not transformers, which would
import torch into the server), once per policy per process; a remote backend decodes them
(``backends.remote``), within a short time limit.
"""
from __future__ import annotations

import asyncio
import functools
import time
from pathlib import Path

from backends.types import PolicyLoadError, check_policy_folder, is_policy_url

__all__ = ["PolicyLoadError", "is_policy_url", "backend_info", "resolve_policy", "policy_target", "check_policy",
           "policy_label", "decode_ids", "SAMPLE_POLICY", "SAMPLE_CHAT_POLICY", "REMOTE_DECODE_TIMEOUT_S"]

SAMPLE_POLICY = "sample"  # how runs of the bundled sample policy name it (portable across machines)
SAMPLE_CHAT_POLICY = "sample-chat"  # the realistic world's bundled chat policy, likewise
REMOTE_DECODE_TIMEOUT_S = 1.0  # a hover card waits at most this long for a remote backend
_remote_down: dict[str, float] = {}  # url -> when decoding last failed (not asked again for 30 s)


def resolve_policy(policy: str | Path | None) -> Path | str | None:
    """The folder of a policy as a run records it; ``"sample"`` and ``"sample-chat"`` are the bundled
    policies, and a backend URL stays a URL (normalized: ``backends.remote.normalize_url``)."""
    if policy is None:
        return None
    if str(policy) in (SAMPLE_POLICY, SAMPLE_CHAT_POLICY):
        from sample_data import CHAT_POLICY_DIR, POLICY_DIR
        return POLICY_DIR if str(policy) == SAMPLE_POLICY else CHAT_POLICY_DIR
    if is_policy_url(policy):
        from backends.remote import normalize_url
        return normalize_url(policy)
    return Path(policy).expanduser()


def policy_target(policy: str | Path) -> Path | str:
    """What worker jobs are given for a policy: an absolute folder, or a backend's URL."""
    ref = resolve_policy(policy)
    return ref if isinstance(ref, str) else Path(ref).expanduser().resolve()


def backend_info(url: str):
    """What a backend URL says about itself (``BackendInfo``: model, device, extension), asked now.

    Raises:
        PolicyLoadError: the backend does not answer, refuses, or the URL is malformed.
    """
    from backends.remote import remote_info

    return remote_info(url)


async def check_policy(policy: str | Path):
    """Check a policy before anything is written: a folder must look like a model folder,
    a URL must answer (asked off the event loop, within seconds).

    Returns:
        ``(target, info)``: :func:`policy_target`, and the backend's ``BackendInfo`` (None for a folder).

    Raises:
        PolicyLoadError: not a model folder, or a backend that does not answer (``RemoteError``).
    """
    target = policy_target(policy)
    if isinstance(target, str):
        return target, await asyncio.to_thread(backend_info, target)
    check_policy_folder(target)
    return target, None


def policy_label(path: str | Path) -> str:
    """What a run stores as its policy: ``"sample"`` / ``"sample-chat"`` for the bundled ones, a
    backend's URL (never a key), else the absolute path."""
    from sample_data import CHAT_POLICY_DIR, POLICY_DIR

    if is_policy_url(path):
        from backends.remote import normalize_url
        return normalize_url(path)
    p = Path(path).expanduser().resolve()
    bundled = {POLICY_DIR.resolve(): SAMPLE_POLICY, CHAT_POLICY_DIR.resolve(): SAMPLE_CHAT_POLICY}
    return bundled.get(p, str(p))


@functools.lru_cache(maxsize=8)
def _tokenizer(path: str):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)


def decode_ids(policy: str | None, ids: list[int]) -> list[str]:
    """Each id as display text; ``#id`` when the policy's tokenizer is unavailable."""
    if policy is not None and is_policy_url(policy):
        return _remote_pieces(policy, ids)
    folder = resolve_policy(policy)
    file = folder / "tokenizer.json" if folder is not None else None
    try:
        tok = _tokenizer(str(file)) if file is not None and file.is_file() else None
    except Exception:  # an unreadable tokenizer only costs the alternatives' text
        tok = None
    if tok is None:
        return [f"#{i}" for i in ids]
    return tok.decode_batch([[int(i)] for i in ids], skip_special_tokens=False)


def _remote_pieces(url: str, ids: list[int]) -> list[str]:
    """Token texts from a backend (cached per process); ``#id`` while it does not answer,
    and for 30 s after, so a page never waits on a backend that is down."""
    from backends.remote import load_remote
    from backends.types import PolicyLoadError

    if time.monotonic() - _remote_down.get(url, -1e9) < 30:
        return [f"#{i}" for i in ids]
    try:
        return load_remote(url).tokenizer.pieces(ids, timeout=REMOTE_DECODE_TIMEOUT_S)
    except PolicyLoadError:  # a RemoteError, or a malformed URL
        _remote_down[url] = time.monotonic()
        return [f"#{i}" for i in ids]
