"""Agent trajectories read from what frameworks dump, in one shape: :class:`Trajectory`.

A trajectory is its prompt, its turns (:class:`backends.Turn`: role, token span, text, the tool
call an assistant turn made, the tool's answer and whether it failed), its tokens where the
source has them (ids, texts, log-probs and the loss mask: ``trained`` False on the tokens the
policy did not write) and its rewards, total and per turn. The readers of each framework
(:mod:`studio.ingest.agent_formats`) build one with the helpers here, and :func:`trajectory_batch`
turns a slice of them into the :class:`~studio.ingest.normalise.Batch` every import writes.

Turns come from one of two things a framework gives:

- a loss mask over the response's tokens (verl, SkyRL, TRL): each run of 1s is an assistant turn,
  each run of 0s a tool turn (:func:`mask_turns`); a call the assistant wrote in the Hermes
  format (``<tool_call>{"name": …, "arguments": …}</tool_call>``) is read back from its text;
- chat messages (OpenAI chat, rLLM, Responses items made messages): the messages before the first
  assistant message are the prompt, each later message a turn (:mod:`studio.ingest.messages`).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from backends import Turn
from studio.ingest.errors import Bad
from studio.ingest.messages import args_text, turn_counts
from studio.ingest.normalise import Batch, chat_prompt, check_logprobs, text_prompt

_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


@dataclass
class Trajectory:
    """One trajectory of a record, in canonical form (what becomes one rollout)."""

    prompt: tuple  # (text, key, messages JSON, templated string), as normalise.text_prompt / chat_prompt give
    turns: list[Turn]
    completion: str | None = None  # the completion's text where the source gives it
    total: float | None = None
    components: dict[str, float | None] = field(default_factory=dict)
    turn_rewards: dict[int, float] = field(default_factory=dict)  # turn index -> reward
    step: int | None = None
    group: str | None = None
    finish_reason: str | None = None
    gold: str | None = None  # JSON text {"answer": …}
    advantage: float | None = None
    token_ids: list[int] | None = None
    token_texts: list[str] | None = None
    logprobs: list[float | None] | None = None  # the behaviour log-probs; None on masked tokens
    train_logprobs: list[float | None] | None = None  # the trainer's recomputed ones; None on masked tokens
    sources: dict[str, str] = field(default_factory=dict)  # log-prob field -> its source field (rollouts.engine)
    trained: list[bool] | None = None

    @property
    def text(self) -> str:
        """The completion as text: the source's, else its tokens' texts, else what its assistant turns said, one
        per line (as a completion given as messages reads: a tool's output is not the policy's answer)."""
        if self.completion is not None:
            return self.completion
        if self.token_texts is not None and all(t is not None for t in self.token_texts):
            return "".join(self.token_texts)
        return "\n".join(t.text for t in self.turns if t.role == "assistant" and t.text)

    def counts(self) -> tuple[int, int, int]:
        """``(n_turns, n_tool_calls, n_tool_errors)`` (:func:`~studio.ingest.messages.turn_counts`)."""
        return turn_counts(self.turns)


# ------------------------------------------------------------------------------------------- from a loss mask

def mask_turns(mask: list[bool]) -> list[tuple[str, int, int]]:
    """``(role, start, end)`` of each run of a loss mask: 1s an assistant turn, 0s a tool turn. A mask
    with no 1 (a response the trainer filtered out whole, e.g. an overlong one) is one assistant turn.

    >>> mask_turns([True, True, False, False, True])
    [('assistant', 0, 2), ('tool', 2, 4), ('assistant', 4, 5)]
    >>> mask_turns([False, False])
    [('assistant', 0, 2)]
    """
    if not any(mask):
        return [("assistant", 0, len(mask))] if mask else []
    runs, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append(("assistant" if mask[start] else "tool", start, i))
            start = i
    return runs


def hermes_calls(text: str) -> list[tuple[str | None, str]]:
    """``(tool name, arguments JSON text)`` of each ``<tool_call>`` in an assistant's text; a call whose
    JSON does not read keeps its text as the arguments, with no name.

    >>> hermes_calls('<tool_call>{"name": "calculator", "arguments": {"expression": "37*24"}}</tool_call>')
    [('calculator', '{"expression": "37*24"}')]
    >>> hermes_calls("<tool_call>{calculator 37*24</tool_call>")
    [(None, '{calculator 37*24')]
    """
    out = []
    for body in _CALL.findall(text):
        try:
            call = json.loads(body)
        except ValueError:
            call = None
        if isinstance(call, dict) and isinstance(call.get("name"), str):
            out.append((call["name"], args_text(call.get("arguments", call.get("parameters", {})))))
        else:
            out.append((None, body))
    return out


def token_turns(mask: list[bool], texts: list[str] | None) -> list[Turn]:
    """Turns of a response given as tokens and a loss mask; with token texts, each turn's text and the
    calls its assistant turns wrote (one turn per call; a second call's turn spans no tokens)."""
    turns: list[Turn] = []
    last_call: tuple[str | None, str] | None = None
    for role, a, z in mask_turns(mask):
        text = "".join(t or "" for t in texts[a:z]) if texts is not None else ""
        if role == "tool":
            turns.append(Turn("tool", a, z, text, tool_name=last_call[0] if last_call else None))
            last_call = None
            continue
        calls = hermes_calls(text) if texts is not None else []
        first = calls[0] if calls else (None, None)
        turns.append(Turn("assistant", a, z, text, tool_name=first[0], tool_args=first[1]))
        turns += [Turn("assistant", z, z, "", tool_name=n, tool_args=args) for n, args in calls[1:]]
        last_call = calls[-1] if calls else None
    return turns


# ------------------------------------------------------------------------------------------- tokens

def masked_stats(logprobs: list | None, mask: list[bool]) -> list[float | None] | None:
    """Log-probs with None on masked tokens (frameworks write 0.0 there: not the policy's)."""
    if logprobs is None:
        return None
    return [float(v) if m and v is not None else None for v, m in zip(logprobs, mask, strict=True)]


def as_mask(values: Any, name: str, n: int, of: str) -> list[bool]:
    """A 0/1 (or boolean) mask of ``n`` entries.

    Raises:
        Bad: not a list of 0/1, or a length that does not match the tokens.
    """
    if not isinstance(values, list) or not all(isinstance(v, (int, float)) and v in (0, 1) for v in values):
        raise Bad(f"{name!r} must be a list of 0/1")
    if len(values) != n:
        raise Bad(f"{name!r} has {len(values)} entries but {of!r} has {n} tokens")
    return [bool(v) for v in values]


def as_ids(values: Any, name: str) -> list[int]:
    """A list of token ids.

    Raises:
        Bad: not a list of non-negative integers.
    """
    if not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31
                                               for v in values):
        raise Bad(f"{name!r} must be a list of token ids")
    return values


def as_numbers(values: Any, name: str, n: int, of: str) -> list[float | None]:
    """A per-token list of ``n`` numbers (None kept).

    Raises:
        Bad: not numbers, or a length that does not match the tokens.
    """
    if not isinstance(values, list) or not all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))
                                               for v in values):
        raise Bad(f"{name!r} must be a list of numbers")
    if len(values) != n:
        raise Bad(f"{name!r} has {len(values)} values but {of!r} has {n} tokens")
    return [None if v is None else float(v) for v in values]


def as_logprobs(values: Any, name: str, n: int, of: str) -> list[float | None]:
    """A per-token list of ``n`` log-probs (None kept).

    Raises:
        Bad: not numbers, another length than the tokens, NaN / inf or a positive value (naming ``name``).
    """
    out = as_numbers(values, name, n, of)
    check_logprobs(out, name)
    return out


def number(v: Any, name: str) -> float | None:
    """A score (None, or a number; a bool is 0/1).

    Raises:
        Bad: anything else.
    """
    if v is None or isinstance(v, (bool, int, float)):
        return None if v is None or v != v else float(v)
    raise Bad(f"{name!r} must be a number, got {type(v).__name__}")


def prompt_of(messages: list | None, templated: str | None) -> tuple:
    """A trajectory's prompt: its messages where the source keeps them (with the templated string the
    policy read, when decoded), else the templated string read back (``normalise.text_prompt``)."""
    if messages:
        text, key, msgs, _ = chat_prompt(messages)
        return text, key, msgs, templated
    return text_prompt(templated or "")


# ------------------------------------------------------------------------------------------- to a Batch

def trajectory_batch(trajs: list[Trajectory]) -> Batch:
    """One :class:`Batch` of trajectories: the columns every import writes, plus their turns, per-turn
    rewards, the loss mask and each token's turn. Where some trajectories name their group, the others
    are grouped by their prompt."""
    n = len(trajs)
    has_group = any(t.group is not None for t in trajs)
    names = list(dict.fromkeys(c for t in trajs for c in t.components))
    with_tokens = [t.token_ids is not None for t in trajs]
    n_tok = np.array([len(t.token_ids) if t.token_ids is not None else -1 for t in trajs], np.int64)
    tokens: dict[str, pa.Array] = {}
    if any(with_tokens):
        tokens["token_ids"] = pa.array([t.token_ids for t in trajs], pa.list_(pa.int64()))
        if any(t.token_texts is not None for t in trajs):
            tokens["token_texts"] = pa.array([t.token_texts for t in trajs], pa.list_(pa.string()))
        if any(t.logprobs is not None for t in trajs):
            tokens["logprobs"] = pa.array([t.logprobs for t in trajs], pa.list_(pa.float64()))
        if any(t.train_logprobs is not None for t in trajs):
            tokens["train_logprobs"] = pa.array([t.train_logprobs for t in trajs], pa.list_(pa.float64()))
    text, key, messages, templated = zip(*(t.prompt for t in trajs), strict=True)
    chat = any(m is not None for m in messages)
    gold = [t.gold for t in trajs]

    def col(values, typ):
        return pa.array(values, typ) if any(v is not None for v in values) else None

    def turn_idx(t: Trajectory) -> list[int] | None:
        if t.token_ids is None:
            return None
        out = [0] * len(t.token_ids)
        for i, turn in enumerate(t.turns):
            if turn.start is not None:
                out[turn.start:turn.end] = [i] * (turn.end - turn.start)
        return out

    return Batch(
        n=n, prompt=pa.array(text, pa.string()), completion=pa.array([t.text for t in trajs], pa.string()),
        step=pa.array([t.step for t in trajs], pa.int32()),
        group=pa.array([t.group if t.group is not None else t.prompt[1] for t in trajs], pa.string())
        if has_group else None,
        total=col([t.total for t in trajs], pa.float64()),
        components={c: pa.array([t.components.get(c) for t in trajs], pa.float64()) for c in names},
        advantage=col([t.advantage for t in trajs], pa.float64()),
        finish_reason=col([t.finish_reason for t in trajs], pa.string()),
        tokens=tokens, n_tokens=n_tok if tokens else None,
        sources={k: v for t in trajs for k, v in t.sources.items() if k in tokens},
        gold=(lambda idx: [gold[i] for i in idx]) if any(g is not None for g in gold) else None,
        key=pa.array(key, pa.string()) if chat else None,
        messages=(lambda idx: [messages[i] for i in idx]) if chat else None,
        prompt_text=col(list(templated), pa.string()),
        turns=[t.turns for t in trajs], turn_rewards=[t.turn_rewards for t in trajs],
        counts=np.array([t.counts() for t in trajs], np.int64).reshape(n, 3),
        trained=pa.array([t.trained for t in trajs], pa.list_(pa.bool_())) if tokens else None,
        turn_idx=pa.array([turn_idx(t) for t in trajs], pa.list_(pa.int32())) if tokens else None)
