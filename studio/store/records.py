"""The record contract between producers (backends, importers) and the store.

Backends return :class:`backends.Generation` records; this module validates them and
turns them into the store's rows (Arrow tables, inserted in one transaction).
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import uuid
from datetime import datetime, timezone

import numpy as np
import pandas as pd
import pyarrow as pa

from backends import Generation
from studio.errors import StudioError
from studio.tasks import Prompt, Task


class RecordError(StudioError, ValueError):
    """A producer handed over a record that breaks the contract."""


def now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


# Ids sort in the order they were made: 7 base-62 digits of a per-process counter that never falls behind
# the clock in milliseconds (111 years of them), then random hex. DuckDB keeps each row group's min/max of
# a string column's first 8 bytes, so a lookup of one rollout's tokens among 100M rows skips every row
# group whose id range does not hold it: with random ids every row group would be read.
_B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"  # in ASCII (byte) order
_ORDERED_DIGITS = 7
_counter = [0]
_counter_lock = threading.Lock()


def _ticks(n: int) -> int:
    """Reserve ``n`` consecutive counter values; return the first."""
    with _counter_lock:
        first = max(_counter[0], time.time_ns() // 1_000_000)
        _counter[0] = first + n
        return first


def _b62(v: int) -> str:
    out = []
    for _ in range(_ORDERED_DIGITS):
        v, r = divmod(v, 62)
        out.append(_B62[r])
    return "".join(reversed(out))


def new_id(prefix: str) -> str:
    """A unique id that sorts after every id this process made before it."""
    return f"{prefix}{_b62(_ticks(1))}{uuid.uuid4().hex[:9]}"


def new_ids(prefix: str, n: int) -> np.ndarray:
    """``n`` ids as :func:`new_id` makes them, in order, vectorised (bulk imports)."""
    if n <= 0:
        return np.array([], dtype=object)
    v = _ticks(n) + np.arange(n, dtype=np.int64)
    digits = np.empty((n, _ORDERED_DIGITS), dtype=np.int64)
    for i in range(_ORDERED_DIGITS - 1, -1, -1):
        v, digits[:, i] = np.divmod(v, 62)
    table = np.frombuffer(_B62.encode(), dtype=np.uint8)
    chars = np.empty((n, 1 + _ORDERED_DIGITS + 9), dtype=np.uint8)
    chars[:, 0] = ord(prefix) if len(prefix) == 1 else 0
    chars[:, 1:1 + _ORDERED_DIGITS] = table[digits]
    hexd = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    chars[:, 1 + _ORDERED_DIGITS:] = hexd[np.frombuffer(os.urandom(n * 9), dtype=np.uint8).reshape(n, 9) % 16]
    if len(prefix) != 1:
        body = chars[:, 1:].copy().view(f"S{_ORDERED_DIGITS + 9}").ravel().astype(str)
        return np.char.add(prefix, body).astype(object)
    return chars.view(f"S{chars.shape[1]}").ravel().astype(str).astype(object)


def prompt_id(task: str, text: str) -> str:
    """Stable id of a prompt: the same text of the same task has the same id everywhere."""
    return "p" + hashlib.sha1(f"{task}\x00{text}".encode()).hexdigest()[:15]


def validate(gen: Generation) -> None:
    T = gen.n_tokens
    k = gen.topk_ids.shape[1] if gen.topk_ids.ndim == 2 else -1
    shapes = {"token_texts": len(gen.token_texts), "logprobs": gen.logprobs.shape[0],
              "entropies": gen.entropies.shape[0], "topk_ids": gen.topk_ids.shape[0],
              "topk_logprobs": gen.topk_logprobs.shape[0]}
    bad = {name: n for name, n in shapes.items() if n != T}
    if bad or gen.topk_logprobs.shape[-1:] != (k,) or k < 0:
        raise RecordError(f"generation for {gen.prompt!r}: {T} tokens but field lengths {bad or shapes}")
    if T and not (np.isfinite(gen.entropies).all() and (gen.logprobs <= 1e-4).all()):
        raise RecordError(f"generation for {gen.prompt!r}: entropies must be finite and logprobs <= 0")


def step_index(token_texts: list[str], task: Task, prompt: Prompt, completion: str) -> list[int | None]:
    """The reasoning step each token belongs to, from the task's character spans.

    A step's separator (``;``) belongs to the step it closes; tokens outside every step
    (the final answer, end token) get ``None``.
    """
    steps = task.parse_completion(prompt, completion).steps
    out, pos = [], 0
    for text in token_texts:
        idx = None
        for i, s in enumerate(steps):
            if s.start <= pos <= s.end:
                idx = i
                break
        out.append(idx)
        pos += len(text)
    return out


def prompt_rows(task: Task, prompts: list[Prompt]) -> pd.DataFrame:
    return pd.DataFrame([{
        "prompt_id": prompt_id(task.name, p.text), "task": task.name, "text": p.text,
        "gold": json.dumps(p.gold), "meta": json.dumps(p.meta),
        "messages": json.dumps(list(p.messages)) if p.messages else None,
    } for p in prompts]).drop_duplicates("prompt_id")


def generation_rows(run_id: str, task: Task, prompts: list[Prompt], gens: list[Generation],
                    policy_version: str | None = None, train_step: int | None = None,
                    ) -> tuple[pd.DataFrame, pa.Table]:
    """Rollout and token rows for ``gens``; ``gens[i].prompt_index`` indexes ``prompts``.

    Completions of the same prompt in one call form one group (one GRPO group). Each rollout
    carries its answer and correctness under ``task`` (a fact of the rollout, whatever reward
    version is shown), and the text the policy continued when a chat template made it differ
    from the prompt's text.
    """
    groups: dict[int, str] = {}
    created = now()
    rollouts, tok_cols = [], {k: [] for k in ("rollout_id", "pos", "token_id", "token_text", "logprob",
                                              "entropy", "topk_ids", "topk_logprobs", "step_idx")}
    for gen in gens:
        validate(gen)
        prompt = prompts[gen.prompt_index]
        rid = new_id("r")
        gid = groups.setdefault(gen.prompt_index, new_id("g"))
        answer, correct = task.verdict(prompt, gen.text)
        rollouts.append({
            "rollout_id": rid, "run_id": run_id, "train_step": train_step,
            "prompt_id": prompt_id(task.name, prompt.text), "group_id": gid,
            "sample_idx": gen.sample_idx, "text": gen.text, "n_tokens": gen.n_tokens,
            "finish_reason": gen.finish_reason, "policy_version": policy_version, "created_at": created,
            "prompt_text": gen.prompt if gen.prompt != prompt.text else None, "answer": answer, "correct": correct,
        })
        T = gen.n_tokens
        tok_cols["rollout_id"] += [rid] * T
        tok_cols["pos"] += list(range(T))
        tok_cols["token_id"] += gen.token_ids.tolist()
        tok_cols["token_text"] += gen.token_texts
        tok_cols["logprob"] += gen.logprobs.tolist()
        tok_cols["entropy"] += gen.entropies.tolist()
        tok_cols["topk_ids"] += gen.topk_ids.tolist()
        tok_cols["topk_logprobs"] += gen.topk_logprobs.tolist()
        tok_cols["step_idx"] += step_index(gen.token_texts, task, prompt, gen.text)
    tokens = pa.table({
        "rollout_id": pa.array(tok_cols["rollout_id"], pa.string()),
        "pos": pa.array(tok_cols["pos"], pa.int32()),
        "token_id": pa.array(tok_cols["token_id"], pa.int32()),
        "token_text": pa.array(tok_cols["token_text"], pa.string()),
        "logprob": pa.array(tok_cols["logprob"], pa.float32()),
        "entropy": pa.array(tok_cols["entropy"], pa.float32()),
        "topk_ids": pa.array(tok_cols["topk_ids"], pa.list_(pa.int32())),
        "topk_logprobs": pa.array(tok_cols["topk_logprobs"], pa.list_(pa.float32())),
        "step_idx": pa.array(tok_cols["step_idx"], pa.int32()),
    })
    return pd.DataFrame(rollouts), tokens
