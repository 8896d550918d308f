"""What backends hand to the core, and how they fail: no torch needed to import this."""
from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np


class PolicyLoadError(ValueError):
    """The given policy cannot be used: not a loadable causal-LM folder, or a backend URL
    that does not answer as one (``backends.remote.RemoteError``); the message says why."""


@dataclass
class Generation:
    """One completion and its per-token statistics (arrays have one row per token)."""

    prompt_index: int
    sample_idx: int
    prompt: str
    text: str
    token_ids: np.ndarray  # [T] int64
    token_texts: list[str]
    logprobs: np.ndarray  # [T] float32
    entropies: np.ndarray  # [T] float32
    topk_ids: np.ndarray  # [T, k] int64
    topk_logprobs: np.ndarray  # [T, k] float32
    finish_reason: str  # "stop" (end token sampled) or "length" (max_new_tokens reached)
    entropy_estimate: bool = False  # entropies bounded from top-k logprobs (a plain OpenAI server), not exact

    @property
    def n_tokens(self) -> int:
        return int(self.token_ids.shape[0])


def is_policy_url(policy: object) -> bool:
    """Whether ``policy`` names a remote backend (``http://`` or ``https://``) rather than a folder.

    >>> is_policy_url("http://gpu-box:8000"), is_policy_url("sample_data/policy")
    (True, False)
    """
    return isinstance(policy, str) and policy.lower().startswith(("http://", "https://"))


def check_policy_folder(path: str | Path) -> None:
    """Raise :class:`PolicyLoadError` unless ``path`` looks like a saved causal-LM folder."""
    if is_policy_url(path):
        raise PolicyLoadError(f"{path} is a remote backend (a URL); this needs the policy's weights in a local "
                              "folder: give the folder written by save_pretrained")
    path = Path(path)
    if not path.exists():
        raise PolicyLoadError(f"policy folder {str(path)!r} does not exist")
    if not path.is_dir():
        raise PolicyLoadError(f"policy {str(path)!r} is a file; give the folder written by save_pretrained")
    if not (path / "config.json").is_file():
        raise PolicyLoadError(
            f"{str(path)!r} is not a transformers model folder: it has no config.json "
            "(expected the output of model.save_pretrained + tokenizer.save_pretrained)")
    weights = list(path.glob("*.safetensors")) + list(path.glob("pytorch_model*.bin"))
    if not weights:
        raise PolicyLoadError(f"{str(path)!r} has a config.json but no weights (*.safetensors or pytorch_model.bin)")


def weights_version(path: str | Path) -> str:
    """``<folder>@<sha256 of its weight files, 10 hex>``: names exactly which weights were used.

    Cached per file size and modification time, so weights rewritten in place (a new
    checkpoint saved over an old one) get a new version.
    """
    p = Path(path).expanduser().resolve()
    files = sorted(p.glob("*.safetensors")) + sorted(p.glob("pytorch_model*.bin"))
    return _hash_weights(str(p), tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files))


@functools.lru_cache(maxsize=16)
def _hash_weights(path: str, signature: tuple) -> str:
    h = hashlib.sha256()
    for f, _, _ in signature:
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
    return f"{Path(path).name}@{h.hexdigest()[:10]}"
