"""Reward-model backend: score whole rollouts with a transformers sequence classifier.

Works with any local ``AutoModelForSequenceClassification`` folder: the sample reward
model (``sample_data/reward_model``) or a user's (a GPT-2, Llama or Qwen classifier head).
The input is exactly what the policy saw, ``prompt + completion`` with no separator.

Score of a text:
- ``num_labels == 1`` (the usual reward-model head): ``sigmoid(logit)``, in (0, 1), so
  ``score >= 0.5`` means the model judges the completion good. A Bradley-Terry model
  trained on preferences only has meaningful differences between its logits; the
  sigmoid keeps their order.
- ``num_labels > 1``: the raw logit of the last label (by convention the "good" class,
  e.g. label 1 of a {0: bad, 1: good} classifier), not a probability.

Padding: GPT-2-style classifiers pool the hidden state of the rightmost token that is
not ``pad_token_id``, and absolute-position models number positions from the first
token unless given ``position_ids``. Sequences are therefore right-padded whatever the
tokenizer's ``padding_side``, ``config.pad_token_id`` is always set (to the tokenizer's
pad token, else its end token), and texts too long for the model are cut from the left so
the end of the completion, where the answer is, is always seen. Batched scores equal
one-at-a-time scores.

Imports torch: only worker processes load this module (the server never does).
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

from .device import pick_device
from .types import PolicyLoadError, check_policy_folder, weights_version


def prepare_for_batches(model, tokenizer, path: Path, what: str) -> int | None:
    """Right-pad and left-truncate (the end of a completion is always seen), make sure a pad
    token exists and the model knows it; return the longest input the model takes (None
    when neither the model nor the tokenizer states one)."""
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise PolicyLoadError(f"the {what}'s tokenizer in {str(path)!r} has neither "
                                  "a pad token nor an end token to pad batches with")
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id
    tokenizer.padding_side = "right"
    tokenizer.truncation_side = "left"
    # tokenizers without a known limit report a huge model_max_length
    limits = [x for x in (getattr(model.config, "max_position_embeddings", None), tokenizer.model_max_length)
              if isinstance(x, int) and 0 < x < 1_000_000]
    return min(limits) if limits else None


class RewardModel:
    """A loaded sequence-classification reward model and its tokenizer."""

    def __init__(self, path: str | Path, device: str | None = None):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.path = Path(path).expanduser().resolve()
        try:
            check_policy_folder(self.path)
        except PolicyLoadError as exc:  # same checks, worded for a reward model
            msg = str(exc)
            if msg.startswith("policy "):
                msg = "reward model " + msg[len("policy "):]
            raise PolicyLoadError(msg) from None
        self.device = device or pick_device()
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.path)
            dtype = torch.float32 if self.device == "cpu" else "auto"
            model, info = AutoModelForSequenceClassification.from_pretrained(
                self.path, dtype=dtype, output_loading_info=True)
        except Exception as exc:  # transformers raises many kinds; the user needs one message
            raise PolicyLoadError(
                f"could not load the reward model in {str(self.path)!r} as a sequence classifier "
                f"(AutoModelForSequenceClassification): {exc}") from exc
        missing = sorted(info.get("missing_keys") or [])
        if missing:  # e.g. a policy (causal LM) folder: transformers would add a random head
            arch = ", ".join(getattr(model.config, "architectures", None) or ["unknown"])
            raise PolicyLoadError(
                f"{str(self.path)!r} is not a trained reward model: its weights lack {', '.join(missing[:4])}"
                f"{' …' if len(missing) > 4 else ''} (saved architecture: {arch}). Give a folder saved from a "
                "*ForSequenceClassification model, not a policy.")
        self.model = model.to(self.device).eval()
        self.num_labels = int(self.model.config.num_labels)
        self.max_length = prepare_for_batches(self.model, self.tokenizer, self.path, "reward model")

    @property
    def name(self) -> str:
        return self.path.name

    @torch.inference_mode()
    def score(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        """One score per text, float32 ``[N]``: see the module docstring for its meaning.

        Texts are scored in batches of similar length (sorted, then put back in order), so
        little compute goes to padding.
        """
        out = np.zeros(len(texts), np.float32)
        if not texts:
            return out
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for lo in range(0, len(order), batch_size):
            idx = order[lo:lo + batch_size]
            enc = self.tokenizer([texts[i] for i in idx], padding=True, return_tensors="pt",
                                 truncation=self.max_length is not None, max_length=self.max_length)
            if enc["input_ids"].shape[1] == 0:
                raise ValueError("every text must encode to at least one token")
            logits = self.model(input_ids=enc["input_ids"].to(self.device),
                                attention_mask=enc["attention_mask"].to(self.device)).logits.float()  # [B, L]
            vals = torch.sigmoid(logits[:, 0]) if self.num_labels == 1 else logits[:, -1]
            out[idx] = vals.cpu().numpy()
        return out

    def score_rollouts(self, prompts: list[str], completions: list[str], batch_size: int = 64) -> np.ndarray:
        """Scores of ``prompt + completion`` pairs (the text the policy produced it from)."""
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        return self.score([p + c for p, c in zip(prompts, completions, strict=False)], batch_size=batch_size)


@functools.lru_cache(maxsize=4)
def _cached(path: str, device: str | None) -> RewardModel:
    return RewardModel(path, device)


def load_reward_model(path: str | Path, device: str | None = None) -> RewardModel:
    """Load a reward-model folder once per process (later calls return the same object)."""
    return _cached(str(Path(path).expanduser().resolve()), device)


def reward_model_version(path: str | Path) -> str:
    """``<folder>@<hash of its weights>``, as for policies."""
    return weights_version(path)


def rm_score_job(path: str, prompts: list[str], completions: list[str]) -> tuple[list[float], str]:
    """Runs in a worker: score rollouts. Returns (one score per rollout, reward model version)."""
    rm = load_reward_model(path)
    scores = rm.score_rollouts(prompts, completions)
    return [float(s) for s in scores], reward_model_version(rm.path)
