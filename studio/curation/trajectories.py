"""Agent trajectories in conversational exports: turns as the messages TRL's trainers template.

A trajectory's turns (``turns`` rows; a rollout without them is one assistant turn) become
TRL's conversational tool-calling messages (its "Dataset formats", tool calling): an assistant
turn that called a tool is an assistant message with its text before the call and
``tool_calls: [{type: "function", function: {name, arguments}}]`` (the arguments as an object,
as chat templates expect them), the tool turn after it is ``{role: "tool", name, content}`` with
the tool's output (the ``<tool_response>`` wrapper the policy saw is the template's to add).
A call the policy wrote that could not be read (no tool name, arguments not a JSON object)
stays text in its assistant message; a failed call's tool message holds the error the policy
was shown.

:func:`trajectory_texts` shapes the selected pairs (``_sel``) of an export that holds
trajectories: the prompt is the prompt's messages plus the turns both sides share (none for a
completion pair; up to the first turn where they differ for a step or turn pair), each side its
turns from there on.
"""
from __future__ import annotations

import json
import re

import pyarrow as pa

from studio.curation.formats import _TURN_END

CALL_OPEN = "<tool_call>"  # where an assistant turn's call starts in its text (Hermes / Qwen tool format)
RESPONSE = ("<tool_response>", "</tool_response>")  # what a tool turn's text is wrapped in, as the policy saw it

_TURN_COLUMNS = "rollout_id, turn_idx, role, content, tool_name, tool_args, error"


def _arguments(tool_args: str | None) -> dict | None:
    """A call's arguments as an object, or None when they are not a JSON object."""
    try:
        args = json.loads(tool_args) if tool_args else {}
    except ValueError:
        return None
    return args if isinstance(args, dict) else None


def turn_messages(turns: list[dict]) -> list[dict]:
    """TRL's conversational messages of a trajectory's turns (dicts with the ``turns`` columns).

    >>> turn_messages([
    ...     {"role": "assistant", "content": 'Add.<tool_call>{"name": "calculator"}</tool_call>',
    ...      "tool_name": "calculator", "tool_args": '{"expression": "2+2"}'},
    ...     {"role": "tool", "content": "<tool_response>4</tool_response>", "tool_name": "calculator"},
    ...     {"role": "assistant", "content": "\\\\boxed{4}<|im_end|>"}])  # doctest: +NORMALIZE_WHITESPACE
    [{'role': 'assistant', 'content': 'Add.',
      'tool_calls': [{'type': 'function', 'function': {'name': 'calculator', 'arguments': {'expression': '2+2'}}}]},
     {'role': 'tool', 'name': 'calculator', 'content': '4'},
     {'role': 'assistant', 'content': '\\\\boxed{4}'}]
    """
    out: list[dict] = []
    for i, t in enumerate(turns):
        text = t.get("content") or ""
        if i == len(turns) - 1:
            text = re.sub(_TURN_END, "", text)  # the trainer closes the last turn (as for a single answer)
        role = t["role"]
        args = _arguments(t.get("tool_args")) if role == "assistant" and t.get("tool_name") else None
        if args is not None:
            cut = text.rfind(CALL_OPEN)
            call = {"type": "function", "function": {"name": t["tool_name"], "arguments": args}}
            out.append({"role": "assistant", "content": text[:cut] if cut >= 0 else text, "tool_calls": [call]})
        elif role == "tool":
            opened, closed = RESPONSE
            if text.startswith(opened) and text.endswith(closed):
                text = text[len(opened):len(text) - len(closed)]
            out.append({"role": "tool", "name": t.get("tool_name"), "content": text})
        else:
            out.append({"role": role, "content": text})
    return out


def first_difference(a: list[dict], b: list[dict]) -> int:
    """The index of the first turn where two trajectories differ (the shorter's length when one
    continues the other).

    >>> first_difference([{"role": "assistant", "content": "x"}, {"role": "tool", "content": "1"}],
    ...                  [{"role": "assistant", "content": "x"}, {"role": "tool", "content": "2"}])
    1
    """
    keys = ("role", "content", "tool_name", "tool_args", "error")
    for k, (x, y) in enumerate(zip(a, b, strict=False)):
        if any(x.get(c) != y.get(c) for c in keys):
            return k
    return min(len(a), len(b))


def has_trajectories(cur) -> bool:
    """Whether a side of the selected pairs (``_sel``) is a trajectory (has stored turns)."""
    return bool(cur.execute("""
        SELECT count(*) FROM turns WHERE rollout_id IN (SELECT chosen_id FROM _sel UNION SELECT rejected_id FROM _sel)
        LIMIT 1""").fetchall()[0][0])


def _turns_by_rollout(cur) -> dict[str, list[dict]]:
    """The turns of every side of ``_sel``, in order (a rollout without turns: one assistant turn)."""
    rows = cur.execute(f"""
        WITH ids AS (SELECT chosen_id AS rid FROM _sel UNION SELECT rejected_id FROM _sel)
        SELECT {_TURN_COLUMNS} FROM turns WHERE rollout_id IN (SELECT rid FROM ids)
        UNION ALL
        SELECT r.rollout_id, 0, 'assistant', r.text, NULL, NULL, NULL FROM rollouts r
        WHERE r.rollout_id IN (SELECT rid FROM ids) AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.rollout_id = r.rollout_id)
        ORDER BY rollout_id, turn_idx""").fetchall()
    names = [c.strip() for c in _TURN_COLUMNS.split(",")]
    out: dict[str, list[dict]] = {}
    for row in rows:
        t = dict(zip(names, row, strict=True))
        out.setdefault(t["rollout_id"], []).append(t)
    return out


def _message_columns(columns: list[list[list[dict]]], arguments_as_text: bool) -> list[pa.Array]:
    """Message-list columns of one Arrow type (the union of every message's keys, missing ones null)."""
    if arguments_as_text:
        columns = [[[_with_text_arguments(m) for m in msgs] for msgs in col] for col in columns]
    message = pa.array([m for col in columns for msgs in col for m in msgs]).type
    return [pa.array(col, pa.list_(message)) for col in columns]


def _with_text_arguments(message: dict) -> dict:
    if not message.get("tool_calls"):
        return message
    return {**message, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.dumps(
        c["function"]["arguments"])}} for c in message["tool_calls"]]}


def trajectory_texts(cur) -> tuple[pa.Table, bool]:
    """``pair_id, prompt, chosen, rejected`` (message lists) of the registered ``_sel`` pairs and
    ``_prompts``, and whether the calls' arguments had to be written as JSON text: an Arrow column
    holds one type, so arguments whose values differ in type between calls (a number here, text
    there) cannot all be objects."""
    turns = _turns_by_rollout(cur)
    prompts = dict(cur.execute("SELECT prompt_id, messages FROM _prompts").fetchall())
    ids: list[str] = []
    sides: list[list[list[dict]]] = [[], [], []]  # prompt, chosen, rejected
    for pair_id, kind, prompt_id, chosen_id, rejected_id in cur.execute(
            "SELECT pair_id, kind, prompt_id, chosen_id, rejected_id FROM _sel ORDER BY pair_id").fetchall():
        a, b = turns.get(chosen_id, []), turns.get(rejected_id, [])
        k = 0 if kind == "completion" else first_difference(a, b)
        ids.append(pair_id)
        sides[0].append([dict(m) for m in prompts.get(prompt_id) or []] + turn_messages(a[:k]))
        sides[1].append(turn_messages(a[k:]))
        sides[2].append(turn_messages(b[k:]))
    as_text = False
    try:
        columns = _message_columns(sides, as_text)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        as_text = True
        columns = _message_columns(sides, as_text)
    return pa.table({"pair_id": pa.array(ids, pa.string()), "prompt": columns[0], "chosen": columns[1],
                     "rejected": columns[2]}), as_text
