"""Worker processes for heavy work (sampling now; training and user reward code later).

One spawn-context process pool per owner process. Models are cached inside the worker
(``backends.load_policy``), so a second Generate reuses the loaded policy. Workers never
touch the store: they return plain records and the owner writes them.
"""
from __future__ import annotations

import functools
import hashlib
import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

_lock = threading.Lock()
_pool: ProcessPoolExecutor | None = None


def _init_worker() -> None:
    import torch

    torch.set_num_threads(max(1, min(4, torch.get_num_threads())))


def pool() -> ProcessPoolExecutor:
    """The shared worker pool, started on first use."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                        initializer=_init_worker)
        return _pool


def reset_pool(broken: ProcessPoolExecutor | None = None) -> None:
    """Drop the pool ``broken`` (a worker died); the next :func:`pool` starts a new one.

    Only that pool is dropped: another session may already have replaced it with a healthy
    one, whose queued work must not be cancelled.
    """
    global _pool
    with _lock:
        if _pool is not None and (broken is None or _pool is broken):
            _pool.shutdown(wait=False, cancel_futures=True)
            _pool = None


@functools.lru_cache(maxsize=8)
def policy_version(path: str) -> str:
    """``<folder>@<hash of its weights>``: names exactly which weights produced a rollout."""
    h = hashlib.sha256()
    for f in sorted(Path(path).glob("*.safetensors")) + sorted(Path(path).glob("pytorch_model*.bin")):
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
    return f"{Path(path).name}@{h.hexdigest()[:10]}"


def sample_job(policy_path: str, prompts: list[str], kwargs: dict) -> tuple[list, str, str]:
    """Runs in a worker: sample completions. Returns (generations, policy_version, device)."""
    from backends import load_policy

    policy = load_policy(policy_path)
    return policy.sample(prompts, **kwargs), policy_version(str(policy.path)), policy.device
