"""Where models run: CUDA when present, then Apple MPS, else CPU."""
from __future__ import annotations

import os

PRECISIONS = ("auto", "float32", "bfloat16", "float16")
"""How a policy's weights are loaded: ``auto`` is float32 on a CPU, the checkpoint's own dtype elsewhere
(here, not in ``backends.policy``, so settings can name them without importing torch)."""


def pick_device() -> str:
    """The best available device; ``ROLLOUT_STUDIO_DEVICE`` overrides the choice."""
    forced = os.environ.get("ROLLOUT_STUDIO_DEVICE")
    if forced:
        return forced
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def tune_attention(device: str) -> None:
    """Keep scaled-dot-product attention off cuDNN on CUDA. Decoding gives every step a new key
    length, and the cuDNN backend builds a new plan per shape: on an H200 with torch 2.11, a bf16
    agent loop on the sample agent policy spent 4.3 of its 4.9 s in ``_cudnn_attention_forward``
    (11 ms a call, host side) and ran at a fifth of its fp32 speed; the flash / memory-efficient
    kernels have no such cost. Process-wide: model workers are the studio's own processes."""
    if not device.startswith("cuda"):
        return
    import torch

    if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(False)


def cpu_threads(reserve: int = 1, cap: int = 4) -> int:
    """Intra-op threads for a model worker process on a CPU: the cores less ``reserve`` left
    to the owner process (the server answering pages, writing the store), at most ``cap``.

    Threads beyond the free cores do not just share them: OpenMP workers spin-wait on each
    other, and a step stalls whenever one is descheduled. On a 2-core machine with the
    owner busy, sampling 64 completions from the sample policy took 4.1 s with 2 threads and
    0.34 s with 1 (measured; benchmarks/bench_minirun.py prints its thread count).
    ``ROLLOUT_STUDIO_THREADS`` overrides the choice.
    """
    forced = os.environ.get("ROLLOUT_STUDIO_THREADS")
    if forced:
        return max(1, int(forced))
    return max(1, min(cap, (os.cpu_count() or 1) - reserve))


def yield_to_server() -> None:
    """Run this worker process (sampling, scoring, training, user rules) below the server's
    priority, so that when the cores are contended pages are answered first and background work
    waits its turn; a Generate or mini-run then never makes browsing slow. Children (a mini-run's
    sampler) inherit it. ``ROLLOUT_STUDIO_WORKER_NICE`` sets the niceness added (default 10; 0
    leaves workers at the server's priority)."""
    step = int(os.environ.get("ROLLOUT_STUDIO_WORKER_NICE", "10") or 0)
    if step > 0 and hasattr(os, "nice"):
        try:
            os.nice(step)
        except OSError:  # not permitted here: run at the same priority
            pass
