"""One agent trajectory as the agent loop builds it: its tokens, loss mask, turns and budget.

Torch-free, so the local loop (``backends.agent``) and the remote one (``backends.remote.agent``)
share what a trajectory is: the policy samples an assistant turn until it writes the call's end
(``AgentEnv.call_end``) or the end token; a closed call is answered by the environment and the
answer's tokens are appended as a tool turn (masked: not trained, no statistics); the trajectory
ends at the end token (``stop``), at the token budget (``length``: policy and tool tokens count)
or at a call past the turn budget (``turns``: that call is not run).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .types import Generation, ToolReply, Turn


class Trajectory:
    """The state of one row of the agent loop.

    Args:
        prompt_index, sample_idx, prompt: what the finished :class:`Generation` carries.
        ids, mask, turns: a prefix to continue (branching): its tokens, their loss mask, and the
            turns that ended before the current assistant turn, which starts at ``turn_start``.
    """

    def __init__(self, prompt_index: int, sample_idx: int, prompt: str, ids: list[int] | None = None,
                 mask: list[bool] | None = None, turns: list[Turn] | None = None, turn_start: int = 0):
        self.prompt_index, self.sample_idx, self.prompt = prompt_index, sample_idx, prompt
        self.ids: list[int] = list(ids or [])
        self.mask: list[bool] = list(mask) if mask is not None else [True] * len(self.ids)
        self.turns: list[Turn] = list(turns or [])
        self.turn_start = turn_start
        self.calls = sum(1 for t in self.turns if t.role == "tool")
        self.finish: str | None = None  # stop | length | turns, once ended

    @property
    def done(self) -> bool:
        return self.finish is not None

    def add(self, token: int, stop: bool, call_ids: list[int], max_turns: int, budget: int) -> bool:
        """Append a policy token; True when it closed a tool call the environment must answer now.

        ``stop``: the token is an end token. A call closed past ``max_turns`` calls ends the
        trajectory (``turns``); one closed at the ``budget`` ends it (``length``): no room for an answer.
        """
        self.ids.append(int(token))
        self.mask.append(True)
        m = len(call_ids)
        if stop:
            self.end("stop")
        elif m and len(self.ids) - self.turn_start >= m and self.ids[-m:] == call_ids:
            if self.calls >= max_turns:
                self.end("turns")
            elif len(self.ids) >= budget:
                self.end("length")
            else:
                return True
        elif len(self.ids) >= budget:
            self.end("length")
        return False

    def call_ids(self) -> list[int]:
        """The tokens of the assistant turn that closed the call (what the environment reads)."""
        return self.ids[self.turn_start:]

    def answer(self, reply: ToolReply, reply_ids: list[int], budget: int) -> list[int]:
        """Close the call's assistant turn and append the reply as a tool turn (cut at the
        ``budget``; a trajectory that reaches it ends, ``length``). Returns the appended tokens."""
        call_id = f"call_{self.calls}"
        self.turns.append(Turn("assistant", self.turn_start, len(self.ids), tool_name=reply.tool_name,
                               tool_args=reply.tool_args, tool_call_id=call_id))
        appended = list(reply_ids[:max(0, budget - len(self.ids))])
        start = len(self.ids)
        self.ids += appended
        self.mask += [False] * len(appended)
        self.turns.append(Turn("tool", start, len(self.ids), text=reply.text, tool_name=reply.tool_name,
                               tool_call_id=call_id, error=reply.error))
        self.calls += 1
        self.turn_start = len(self.ids)
        if len(self.ids) >= budget:
            self.finish = "length"
        return appended

    def end(self, reason: str) -> None:
        """End the trajectory, closing its current assistant turn (when it has tokens)."""
        if len(self.ids) > self.turn_start:
            self.turns.append(Turn("assistant", self.turn_start, len(self.ids)))
        self.turn_start = len(self.ids)
        self.finish = reason

    def generation(self, token_texts: list[str], decode: Callable[[list[int]], str], logprobs, entropies,
                   topk_ids, topk_logprobs, entropy_estimate: bool = False) -> Generation:
        """The finished trajectory as a :class:`Generation`; the statistics arrays cover its tokens
        (a masked token's are NaN, its top-k ids -1). ``decode`` gives a token span's text: the
        assistant turns' texts, and the whole text, without the end token that stopped it."""
        ids = self.ids
        T = len(ids)
        mask = np.asarray(self.mask, bool)
        for t in self.turns:  # an assistant turn's text, as the whole text, leaves out the end token
            if t.role == "assistant" and t.start is not None and not t.text:
                t.text = decode(ids[t.start:t.end - (self.finish == "stop" and t.end == T)])
        tki = np.asarray(topk_ids, np.int64).reshape(T, -1)
        return Generation(
            prompt_index=self.prompt_index, sample_idx=self.sample_idx, prompt=self.prompt,
            text=decode(ids[:-1] if self.finish == "stop" else ids), token_ids=np.asarray(ids, np.int64),
            token_texts=token_texts, logprobs=np.asarray(logprobs, np.float32).reshape(T),
            entropies=np.asarray(entropies, np.float32).reshape(T), topk_ids=tki,
            topk_logprobs=np.asarray(topk_logprobs, np.float32).reshape(T, tki.shape[1]),
            finish_reason=self.finish or "length", entropy_estimate=entropy_estimate,
            turns=self.turns, loss_mask=mask)


def kept_turns(turns: list[Turn] | None, fork: int) -> tuple[list[Turn], int]:
    """The turns a branch at completion position ``fork`` keeps, and where its assistant turn starts.

    Turns that end before the fork are kept as they were; the assistant turn the fork falls in is
    continued (it starts where it started). A fork inside a tool turn is refused: those tokens are
    the environment's, not the policy's.

    >>> turns = [Turn("assistant", 0, 5), Turn("tool", 5, 8), Turn("assistant", 8, 12)]
    >>> [(t.role, t.start) for t in kept_turns(turns, 10)[0]], kept_turns(turns, 10)[1]
    ([('assistant', 0), ('tool', 5)], 8)
    >>> kept_turns(turns, 6)
    Traceback (most recent call last):
    ...
    ValueError: position 6 is in a tool turn: its tokens are the environment's, not the policy's, so a branch cannot start there; fork at a token of an assistant turn
    """
    kept, start = [], 0
    for t in turns or []:
        if t.start is None or (t.end <= fork and (t.start < fork or t.role != "assistant")):
            kept.append(t)  # a message without tokens, or a turn wholly before the fork
            start = start if t.start is None else t.end
            continue
        if t.start <= fork:
            if t.role != "assistant":
                raise ValueError(f"position {fork} is in a {t.role} turn: its tokens are the environment's, not "
                                 "the policy's, so a branch cannot start there; fork at a token of an assistant turn")
            start = t.start
        break
    return kept, start
