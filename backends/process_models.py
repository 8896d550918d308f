"""Process-model backends: score the steps of a rollout (PRM) and its states (value model).

Two kinds of local transformers folders, each loaded once per process and cached per
folder like reward models, on the device :func:`backends.device.pick_device` picks:

- A process reward model (PRM), any ``AutoModelForSequenceClassification`` with one
  output logit (the sample one: ``sample_data/prm``). Its input is the prompt and the
  completion up to the end of step k, ``prompt + completion[:end]`` with no separator and
  no text of the next step; its score is ``sigmoid(logit)``, the model's P(step k is
  correct). As for reward models, sequences are right-padded (GPT-2-style classifiers pool
  the rightmost non-pad token, and absolute positions count from the first token),
  ``config.pad_token_id`` is always set, and a text too long for the model is cut from the
  left, so the step itself is always seen.
- A value model (critic), any ``AutoModelForTokenClassification`` with one output logit
  per position (the sample one: ``sample_data/value_model``), over the policy's token ids
  of ``prompt + completion``. ``sigmoid(logit)`` at position j is the value of the state
  after tokens 0..j, so V(s_t), the value of the state before completion token t is
  generated, is read at position ``len(prompt) + t - 1`` (t = 0: the last prompt token).
  The last completion token is never needed as input. Sequences are right-padded; if
  prompt + completion do not fit the model, the prompt is cut from the left.

Batched scores equal one-at-a-time scores (to float rounding): padding only ever
follows a sequence, and a causal model's outputs at real tokens never see it.

Imports torch: only worker processes load this module (the server never does).
"""
from __future__ import annotations

import functools
from pathlib import Path

import torch

from .device import pick_device
from .reward_model import prepare_for_batches
from .types import PolicyLoadError, check_policy_folder, weights_version

_KINDS = {
    # kind: (what, auto class name, head suffix, what the head is)
    "prm": ("process reward model", "AutoModelForSequenceClassification", "ForSequenceClassification",
            "a sequence classifier: one logit per text"),
    "value": ("value model", "AutoModelForTokenClassification", "ForTokenClassification",
              "a token classifier: one logit per position"),
}


def check_folder(path: str | Path, kind: str) -> list[str]:
    """Raise :class:`PolicyLoadError` unless ``path`` looks like a saved one-logit model of
    ``kind`` (``"prm"`` or ``"value"``), without loading its weights; returns the saved
    architectures (may be empty)."""
    from transformers import AutoConfig

    what, auto_name, suffix, head = _KINDS[kind]
    path = Path(path).expanduser().resolve()
    try:
        check_policy_folder(path)
    except PolicyLoadError as exc:  # same checks, worded for this model
        msg = str(exc)
        if msg.startswith("policy "):
            msg = what + " " + msg[len("policy "):]
        raise PolicyLoadError(msg) from None
    try:
        config = AutoConfig.from_pretrained(path)
    except Exception as exc:
        raise PolicyLoadError(f"could not read the {what}'s config in {str(path)!r}: {exc}") from exc
    archs = list(getattr(config, "architectures", None) or [])
    if archs and not any(a.endswith(suffix) for a in archs):
        raise PolicyLoadError(
            f"{str(path)!r} is not a {what}: it holds a {', '.join(archs)}, and a {what} is {head} "
            f"(a *{suffix} model, loaded with {auto_name}).")
    if int(getattr(config, "num_labels", 0)) != 1:
        raise PolicyLoadError(
            f"the {what} in {str(path)!r} has {getattr(config, 'num_labels', '?')} output labels; "
            f"a {what} has exactly one logit, read as sigmoid(logit)")
    return archs


class ProcessModel:
    """A loaded one-logit PRM (``kind="prm"``) or value model (``kind="value"``) and its tokenizer."""

    def __init__(self, path: str | Path, kind: str, device: str | None = None):
        import transformers
        from transformers import AutoTokenizer

        what, auto_name, suffix, head = _KINDS[kind]
        self.kind = kind
        self.path = Path(path).expanduser().resolve()
        archs = check_folder(self.path, kind)
        self.device = device or pick_device()
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.path)
            dtype = torch.float32 if self.device == "cpu" else "auto"
            model, info = getattr(transformers, auto_name).from_pretrained(
                self.path, dtype=dtype, output_loading_info=True)
        except Exception as exc:  # transformers raises many kinds; the user needs one message
            raise PolicyLoadError(
                f"could not load the {what} in {str(self.path)!r} as {head} ({auto_name}): {exc}") from exc
        missing = sorted(info.get("missing_keys") or [])
        if missing:  # e.g. a policy or the other head: transformers would add a random head
            arch = ", ".join(archs or ["unknown"])
            raise PolicyLoadError(
                f"{str(self.path)!r} is not a trained {what}: its weights lack {', '.join(missing[:4])}"
                f"{' …' if len(missing) > 4 else ''} (saved architecture: {arch}). Give a folder saved from a "
                f"*{suffix} model.")
        self.model = model.to(self.device).eval()
        self.max_length = prepare_for_batches(self.model, self.tokenizer, self.path, what)

    @property
    def name(self) -> str:
        return self.path.name

    @torch.inference_mode()
    def score_texts(self, texts: list[str], batch_size: int = 256) -> list[float]:
        """PRM: ``sigmoid(logit)`` per text, in batches of similar length (put back in order)."""
        out = [0.0] * len(texts)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for lo in range(0, len(order), batch_size):
            idx = order[lo:lo + batch_size]
            enc = self.tokenizer([texts[i] for i in idx], padding=True, return_tensors="pt",
                                 truncation=self.max_length is not None, max_length=self.max_length)
            if enc["input_ids"].shape[1] == 0 or bool((enc["attention_mask"].sum(1) == 0).any()):
                raise ValueError("every step prefix must encode to at least one token")
            logits = self.model(input_ids=enc["input_ids"].to(self.device),
                                attention_mask=enc["attention_mask"].to(self.device)).logits.float()  # [B, 1]
            for i, v in zip(idx, torch.sigmoid(logits[:, 0]).tolist(), strict=False):
                out[i] = v
        return out

    @torch.inference_mode()
    def values(self, prompt_ids: list[list[int]], completion_ids: list[list[int]],
               batch_size: int = 64) -> list[list[float]]:
        """Value model: V(s_t) for every completion token t (see the module docstring)."""
        seqs, starts = [], []  # input ids, and the position of V(s_0) in them
        for p, c in zip(prompt_ids, completion_ids, strict=False):
            p, c = [int(x) for x in p], [int(x) for x in c]
            if not p:
                raise ValueError("every prompt must have at least one token: V(s_0) is read at the last one")
            seq = p + c[:-1]  # the last completion token is never read past
            cut = max(0, len(seq) - self.max_length) if self.max_length else 0
            if cut >= len(p):
                raise ValueError(f"a completion of {len(c)} tokens does not fit the value model's "
                                 f"{self.max_length} positions")
            seqs.append(seq[cut:])
            starts.append(len(p) - cut - 1)
        out: list[list[float]] = [[] for _ in seqs]
        pad = self.tokenizer.pad_token_id
        order = sorted((i for i in range(len(seqs)) if completion_ids[i]), key=lambda i: len(seqs[i]))
        for lo in range(0, len(order), batch_size):
            idx = order[lo:lo + batch_size]
            width = max(len(seqs[i]) for i in idx)
            ids = torch.tensor([seqs[i] + [pad] * (width - len(seqs[i])) for i in idx], device=self.device)
            attn = torch.tensor([[1] * len(seqs[i]) + [0] * (width - len(seqs[i])) for i in idx], device=self.device)
            v = torch.sigmoid(self.model(input_ids=ids, attention_mask=attn).logits[..., 0].float()).cpu()  # [B, T]
            for b, i in enumerate(idx):
                out[i] = v[b, starts[i]:starts[i] + len(completion_ids[i])].tolist()
        return out


@functools.lru_cache(maxsize=8)
def _cached(path: str, kind: str, device: str | None) -> ProcessModel:
    return ProcessModel(path, kind, device)


def load_prm(folder: str | Path, device: str | None = None) -> ProcessModel:
    """Load a PRM folder once per process (later calls return the same object)."""
    return _cached(str(Path(folder).expanduser().resolve()), "prm", device)


def load_value_model(folder: str | Path, device: str | None = None) -> ProcessModel:
    """Load a value-model folder once per process (later calls return the same object)."""
    return _cached(str(Path(folder).expanduser().resolve()), "value", device)


def prm_step_scores(folder: str | Path, prompts: list[str], completions: list[str], step_ends: list[list[int]],
                    batch: int = 256) -> list[list[float]]:
    """P(step correct) for each step of each rollout.

    ``step_ends[i]`` lists the character offsets in ``completions[i]`` where its steps end
    (exclusive, e.g. ``Step.end`` from the task's ``parse_completion``); the score of a step
    is the PRM's ``sigmoid(logit)`` on ``prompts[i] + completions[i][:end]``. Returns one
    list per rollout, one score per end.
    """
    if not len(prompts) == len(completions) == len(step_ends):
        raise ValueError(f"{len(prompts)} prompts, {len(completions)} completions and "
                         f"{len(step_ends)} step-end lists: give one of each per rollout")
    texts = []
    for p, c, ends in zip(prompts, completions, step_ends, strict=False):
        for e in ends:
            if not 0 <= int(e) <= len(c):
                raise ValueError(f"step end {e} is outside the completion {c!r} (0..{len(c)})")
            texts.append(p + c[:int(e)])
    scores = load_prm(folder).score_texts(texts, batch_size=batch) if texts else []
    out, k = [], 0
    for ends in step_ends:
        out.append(scores[k:k + len(ends)])
        k += len(ends)
    return out


def value_scores(folder: str | Path, prompt_ids: list[list[int]], completion_ids: list[list[int]],
                 batch: int = 64) -> list[list[float]]:
    """V(s_t) for each completion token t of each rollout: the value model's
    ``sigmoid(logit)`` at position ``len(prompt_ids[i]) + t - 1`` of ``prompt_ids[i] +
    completion_ids[i]``, the state before token t is generated. One list per rollout, as
    long as its completion."""
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(completion_ids)} completions")
    return load_value_model(folder).values(prompt_ids, completion_ids, batch_size=batch)


def prm_version(folder: str | Path) -> str:
    """``<folder>@<hash of its weights>``, as for policies and reward models (after the
    folder checks of :func:`check_folder`)."""
    check_folder(folder, "prm")
    return weights_version(folder)


def value_model_version(folder: str | Path) -> str:
    """``<folder>@<hash of its weights>``, as for policies and reward models (after the
    folder checks of :func:`check_folder`)."""
    check_folder(folder, "value")
    return weights_version(folder)
