"""What backends hand to the core, and how they fail: no torch needed to import this."""
from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np


class PolicyLoadError(ValueError):
    """The given policy cannot be used: not a loadable causal-LM folder, or a backend URL
    that does not answer as one (``backends.remote.RemoteError``); the message says why."""


ROLES = ("system", "user", "assistant", "tool")


@dataclass
class Turn:
    """One turn of a trajectory: a span of its completion's tokens and what it was.

    A single-turn completion has no turns list (one assistant turn over every token). In an agent
    trajectory an assistant turn that ends in a tool call carries the call (``tool_name``,
    ``tool_args`` as the policy wrote them); the tool turn after it carries the tool's response as
    ``text`` (its tokens are not the policy's: masked, no statistics) and ``error`` when the call
    failed (invalid JSON, unknown tool, the tool raised, ran out of time or memory).
    """

    role: str  # system | user | assistant | tool
    start: int | None  # first token of the turn (pos in the completion); None: the turn has no tokens
    end: int | None  # one past its last token
    text: str = ""
    tool_name: str | None = None
    tool_args: str | None = None  # the call's arguments: JSON text as written (an assistant turn's call)
    tool_call_id: str | None = None
    error: str | None = None  # why the call failed (on the tool turn that answered it)

    @property
    def trained(self) -> bool:
        """Whether the loss sees this turn's tokens: only the policy's own (assistant) turns."""
        return self.role == "assistant"


@dataclass
class ToolReply:
    """What the environment answers to one tool call of an agent trajectory."""

    text: str  # appended to the context as the policy sees it (the tool turn's tokens), e.g. "<tool_response>24</tool_response>"
    tool_name: str | None = None  # the tool the call named (None: the call could not be read)
    tool_args: str | None = None  # the call's arguments, JSON text as the policy wrote them
    error: str | None = None  # why the call failed: not valid JSON, an unknown tool, the tool raised / timed out / ran out of memory


class AgentEnv(Protocol):
    """The environment of an agent loop (``backends.agent``): where a call ends, and how it is answered.

    The studio's side (``studio.workers.agent_env``) reads the call with the task and runs the tool in
    the sandbox; a backend only sees text.
    """

    call_end: str  # the text that closes a tool call (e.g. "</tool_call>"): sampling pauses after it

    def reply(self, prompt_index: int, call: str) -> ToolReply:
        """Answer the call that ends ``call`` (the assistant turn's text, ``call_end`` included)."""
        ...


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
    # agent trajectories: the turns in order (None: one assistant turn over all tokens) and the loss mask
    # (True on the policy's own tokens; tool responses False, their statistics NaN / topk ids -1)
    turns: list[Turn] | None = None
    loss_mask: np.ndarray | None = None  # [T] bool; None: every token trained
    # the training-inference mismatch: what computed ``logprobs`` (the behaviour side, e.g. 'torch 2.13.0 cpu
    # float32'), the log-probs a training side recomputed for the same tokens, and each token's rank under the
    # policy that scored it (teacher forcing: 1 = its argmax)
    engine: str = ""
    train_logprobs: np.ndarray | None = None  # [T] float32; None: not recomputed
    ranks: np.ndarray | None = None  # [T] int64; None: not computed

    @property
    def n_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def mask(self) -> np.ndarray:
        """The loss mask, [T] bool (all True for a completion without one)."""
        return np.ones(self.n_tokens, dtype=bool) if self.loss_mask is None else self.loss_mask.astype(bool)


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
