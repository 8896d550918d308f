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
from typing import NamedTuple

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
    mask = gen.mask
    if mask.shape != (T,):
        raise RecordError(f"generation for {gen.prompt!r}: a loss mask of {mask.shape[0]} entries for {T} tokens")
    # the policy's own tokens carry statistics; a tool response's tokens (masked) carry none
    if T and not (np.isfinite(gen.entropies[mask]).all() and (gen.logprobs[mask] <= 1e-4).all()):
        raise RecordError(f"generation for {gen.prompt!r}: entropies must be finite and logprobs <= 0")
    if gen.turns is not None:
        check_turns(gen.turns, T, f"generation for {gen.prompt!r}")
    if gen.train_logprobs is not None:
        check_logprobs(gen.train_logprobs, T, mask, f"generation for {gen.prompt!r}: recomputed log-probs")
    if gen.ranks is not None and gen.ranks.shape != (T,):
        raise RecordError(f"generation for {gen.prompt!r}: {gen.ranks.shape[0]} ranks for {T} tokens")


def check_logprobs(values: np.ndarray, n_tokens: int, mask: np.ndarray, where: str) -> None:
    """Refuse a per-token log-prob list of another length than the tokens, or one that is NaN, infinite or
    positive on a trained token (a masked token's value is not read)."""
    values = np.asarray(values, dtype=np.float64)
    if values.shape != (n_tokens,):
        raise RecordError(f"{where}: {values.shape[0] if values.ndim else 0} values for {n_tokens} tokens")
    own = values[mask]
    if not np.isfinite(own).all():
        raise RecordError(f"{where}: NaN or infinite at token {int(np.flatnonzero(mask)[~np.isfinite(own)][0])}")
    if (own > 1e-4).any():
        raise RecordError(f"{where}: positive log-probability at token {int(np.flatnonzero(mask)[own > 1e-4][0])}")


def check_turns(turns, n_tokens: int, where: str) -> None:
    """Refuse turns out of order, overlapping, past the tokens, or of an unknown role."""
    from backends import ROLES

    end = 0
    for i, t in enumerate(turns):
        if t.role not in ROLES:
            raise RecordError(f"{where}: turn {i} has role {t.role!r}; a turn is one of {', '.join(ROLES)}")
        if t.start is None:
            continue
        if t.end is None or not end <= t.start <= t.end <= n_tokens:
            raise RecordError(f"{where}: turn {i} ({t.role}) spans tokens {t.start}..{t.end}, out of order or past "
                              f"the {n_tokens} tokens (turns must follow each other: the previous one ended at {end})")
        end = t.end


def turn_of_tokens(turns, n_tokens: int) -> np.ndarray:
    """The turn index of each of ``n_tokens`` tokens ([T] int32; -1 where no turn covers it)."""
    out = np.full(n_tokens, -1, dtype=np.int32)
    for i, t in enumerate(turns or []):
        if t.start is not None:
            out[t.start:t.end] = i
    return out


def trajectory_counts(turns) -> tuple[int, int, int]:
    """``(n_turns, n_tool_calls, n_tool_errors)`` of a completion's turns (None: one assistant turn)."""
    if not turns:
        return 1, 0, 0
    calls = sum(1 for t in turns if t.role == "assistant" and t.tool_name is not None)
    errors = sum(1 for t in turns if t.role == "tool" and t.error)
    return len(turns), calls, errors


def turn_frame(rollout_ids: list[str], turns_per_rollout: list) -> pd.DataFrame:
    """``turns`` rows of each rollout's turns (rollouts whose turns are None have none)."""
    rows = [{"rollout_id": rid, "turn_idx": i, "role": t.role, "start_pos": t.start, "end_pos": t.end,
             "content": t.text, "tool_name": t.tool_name, "tool_args": t.tool_args,
             "tool_call_id": t.tool_call_id, "error": t.error}
            for rid, turns in zip(rollout_ids, turns_per_rollout, strict=True) for i, t in enumerate(turns or [])]
    cols = ["rollout_id", "turn_idx", "role", "start_pos", "end_pos", "content", "tool_name", "tool_args",
            "tool_call_id", "error"]
    frame = pd.DataFrame(rows, columns=cols)
    return frame.astype({"turn_idx": "int32", "start_pos": "Int32", "end_pos": "Int32"})


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


class GenerationRows(NamedTuple):
    """What :func:`generation_rows` makes: a store write's ``rollouts``, ``tokens`` and ``turns``."""

    rollouts: pd.DataFrame
    tokens: pa.Table
    turns: pd.DataFrame

    def frames(self) -> dict:
        """The three as :meth:`studio.store.Store.write` takes them."""
        return {"rollouts": self.rollouts, "tokens": self.tokens, "turns": self.turns}


def generation_rows(run_id: str, task: Task, prompts: list[Prompt], gens: list[Generation],
                    policy_version: str | None = None, train_step: int | None = None,
                    train_policy_version: str | None = None, train_engine: str | None = None,
                    ) -> GenerationRows:
    """Rollout, token and turn rows for ``gens``; ``gens[i].prompt_index`` indexes ``prompts``.

    Completions of the same prompt in one call form one group (one GRPO group). Each rollout
    carries its answer and correctness under ``task`` (a fact of the rollout, whatever reward
    version is shown), and the text the policy continued when a chat template made it differ
    from the prompt's text. An agent trajectory's tokens carry their turn and the loss mask
    (a tool response's tokens: not trained, no statistics), its turns become ``turns`` rows.

    Each rollout records the engine that sampled it (``Generation.engine``: who reported the behaviour
    log-probs). A generation that carries ``train_logprobs`` (the same tokens' log-probs recomputed by a
    training side, e.g. a mini-run's trainer) stores them in ``tokens.train_logprob``, and its rollout names
    who recomputed them: ``train_policy_version`` and ``train_engine``.
    """
    groups: dict[int, str] = {}
    created = now()
    rollouts, tok_cols = [], {k: [] for k in ("rollout_id", "pos", "token_id", "token_text", "logprob",
                                              "entropy", "topk_ids", "topk_logprobs", "step_idx",
                                              "turn_idx", "trained", "train_logprob", "train_rank")}
    rids, turn_lists = [], []
    for gen in gens:
        validate(gen)
        prompt = prompts[gen.prompt_index]
        rid = new_id("r")
        gid = groups.setdefault(gen.prompt_index, new_id("g"))
        answer, correct = task.verdict(prompt, gen.text)
        n_turns, n_calls, n_errors = trajectory_counts(gen.turns)
        rids.append(rid)
        turn_lists.append(gen.turns)
        rollouts.append({
            "rollout_id": rid, "run_id": run_id, "train_step": train_step,
            "prompt_id": prompt_id(task.name, prompt.text), "group_id": gid,
            "sample_idx": gen.sample_idx, "text": gen.text, "n_tokens": gen.n_tokens,
            "finish_reason": gen.finish_reason, "policy_version": policy_version, "created_at": created,
            "prompt_text": gen.prompt if gen.prompt != prompt.text else None, "answer": answer, "correct": correct,
            "n_turns": n_turns, "n_tool_calls": n_calls, "n_tool_errors": n_errors,
            "engine": gen.engine or None,
            "train_policy_version": train_policy_version if gen.train_logprobs is not None else None,
            "train_engine": train_engine if gen.train_logprobs is not None else None,
        })
        T = gen.n_tokens
        mask = gen.mask
        tok_cols["rollout_id"] += [rid] * T
        tok_cols["pos"] += list(range(T))
        tok_cols["token_id"] += gen.token_ids.tolist()
        tok_cols["token_text"] += gen.token_texts
        # a masked token's statistics are not the policy's: stored as NULL
        tok_cols["logprob"] += [float(v) if m else None for v, m in zip(gen.logprobs.tolist(), mask, strict=True)]
        tok_cols["entropy"] += [float(v) if m else None for v, m in zip(gen.entropies.tolist(), mask, strict=True)]
        tok_cols["topk_ids"] += [v if m else None for v, m in zip(gen.topk_ids.tolist(), mask, strict=True)]
        tok_cols["topk_logprobs"] += [v if m else None for v, m in zip(gen.topk_logprobs.tolist(), mask, strict=True)]
        tok_cols["step_idx"] += step_index(gen.token_texts, task, prompt, gen.text)
        tok_cols["turn_idx"] += (turn_of_tokens(gen.turns, T).tolist() if gen.turns else [0] * T)
        tok_cols["trained"] += mask.tolist()
        tok_cols["train_logprob"] += ([None] * T if gen.train_logprobs is None else
                                      [float(v) if m else None for v, m in zip(gen.train_logprobs.tolist(), mask,
                                                                                strict=True)])
        tok_cols["train_rank"] += ([None] * T if gen.ranks is None or gen.train_logprobs is None else
                                   [int(v) if m else None for v, m in zip(gen.ranks.tolist(), mask, strict=True)])
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
        "turn_idx": pa.array(tok_cols["turn_idx"], pa.int32()),
        "trained": pa.array(tok_cols["trained"], pa.bool_()),
        "train_logprob": pa.array(tok_cols["train_logprob"], pa.float32()),
        "train_rank": pa.array(tok_cols["train_rank"], pa.int32()),
    })
    return GenerationRows(pd.DataFrame(rollouts), tokens, turn_frame(rids, turn_lists))
