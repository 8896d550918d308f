"""Where models run: CUDA when present, then Apple MPS, else CPU."""
from __future__ import annotations

import os


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
