"""Chat messages as a trajectory's turns: OpenAI chat (``tool_calls``, ``tool`` messages), rLLM's
chats, and OpenAI Responses items made messages (:func:`responses_messages`).

The messages before the first assistant message are the prompt (:func:`split_prompt`); each later
message is a turn (:func:`message_turns`): an assistant message's calls (one turn per call, its text
on the first), a ``tool`` message the answer to the call its ``tool_call_id`` names (else to the
earliest call not answered yet), failed where the source says so (:func:`tool_error`).
"""
from __future__ import annotations

import ast
import json
from typing import Any

from backends import ROLES, Turn
from studio.ingest.errors import Bad
from studio.tasks.chat import content_text

ROLE_ALIASES = {"developer": "system", "function": "tool", "ipython": "tool"}  # OpenAI / Llama names


def args_text(args: Any) -> str:
    """A call's arguments as JSON text: a string as the policy wrote it (valid JSON or not), else dumped."""
    return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


def _calls(msg: dict) -> list[tuple[str | None, str | None, str | None]]:
    """``(name, arguments JSON text, call id)`` of an assistant message's calls: OpenAI's ``tool_calls``
    (``{id, type, function: {name, arguments}}``), rLLM's ``{name, arguments}``, or a legacy ``function_call``."""
    raw = msg.get("tool_calls") or ([msg["function_call"]] if isinstance(msg.get("function_call"), dict) else [])
    if not isinstance(raw, list):
        raise Bad(f"tool_calls must be a list, got {type(raw).__name__}")
    out = []
    for c in raw:
        if not isinstance(c, dict):
            raise Bad(f"a tool call must be an object, got {type(c).__name__}")
        fn = c.get("function") if isinstance(c.get("function"), dict) else c
        name = fn.get("name")
        args = fn.get("arguments")
        out.append((None if name is None else str(name), None if args is None else args_text(args),
                    None if c.get("id") is None else str(c["id"])))
    return out


def tool_error(msg: dict) -> str | None:
    """Why a tool message's call failed, where the source says so: an ``error`` field (rLLM's ToolOutput),
    or content that is only ``{"error": …}`` (TRL writes a failed call as ``str({'error': message})``).

    >>> tool_error({"role": "tool", "content": "{'error': 'Tool lookup not found.'}"})
    'Tool lookup not found.'
    >>> tool_error({"role": "tool", "content": "888"}) is None
    True
    """
    if msg.get("error"):
        return str(msg["error"])
    c = msg.get("content")
    if isinstance(c, str) and c.lstrip().startswith("{") and "error" in c:
        for read in (json.loads, ast.literal_eval):
            try:
                c = read(c)
                break
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                continue
    if isinstance(c, dict) and set(c) == {"error"}:
        return str(c["error"])
    return None


def _role(msg: Any, i: int) -> str:
    if not isinstance(msg, dict):
        raise Bad(f"message {i} must be an object, got {type(msg).__name__}")
    role = msg.get("role")
    role = ROLE_ALIASES.get(role, role)
    if role not in ROLES:
        raise Bad(f"message {i} has role {role!r}; a message is one of {', '.join(ROLES)} "
                  f"({', '.join(ROLE_ALIASES)} are read as {', '.join(ROLE_ALIASES.values())})")
    return role


def split_prompt(messages: list) -> tuple[list[dict], list[dict]]:
    """``(prompt, rest)``: the messages before the first assistant message, and the others.

    Raises:
        Bad: not a list, a message with an unknown role, or no assistant message.
    """
    if not isinstance(messages, list):
        raise Bad(f"messages must be a list, got {type(messages).__name__}")
    roles = [_role(m, i) for i, m in enumerate(messages)]
    if "assistant" not in roles:
        raise Bad("no assistant message: nothing the policy wrote")
    first = roles.index("assistant")
    return messages[:first], messages[first:]


def message_turns(messages: list[dict], spans: list[tuple[int, int] | None] | None = None,
                  ) -> tuple[list[Turn], list[int]]:
    """Turns of the messages after a prompt, each message one turn (an assistant message with several
    calls: one turn per call, its text on the first), and the (first) turn of each message. ``spans``
    gives each message's tokens, where known.

    Raises:
        Bad: an unknown role, malformed calls, or a tool message answering a call no earlier message made
            (turns out of order).
    """
    turns: list[Turn] = []
    calls: dict[str, tuple[str | None, str | None]] = {}  # call id -> (name, arguments)
    pending: list[tuple[str | None, str | None, str | None]] = []  # calls not answered yet, in order
    first_turn: list[int] = []
    for i, msg in enumerate(messages):
        role = _role(msg, i)
        first_turn.append(len(turns))
        a, z = spans[i] if spans and spans[i] else (None, None)
        text = content_text(msg)
        if role == "assistant":
            made = _calls(msg)
            first = made[0] if made else (None, None, None)
            turns.append(Turn("assistant", a, z, text, tool_name=first[0], tool_args=first[1], tool_call_id=first[2]))
            turns += [Turn("assistant", z, z, "", tool_name=n, tool_args=args, tool_call_id=cid)
                      for n, args, cid in made[1:]]
            calls.update({cid: (n, args) for n, args, cid in made if cid is not None})
            pending = list(made)
            continue
        name, cid = msg.get("name"), msg.get("tool_call_id")
        if role == "tool":  # answers the call its id names, else the earliest one not answered yet
            if cid is not None:
                if str(cid) not in calls:
                    raise Bad(f"message {i} (tool) answers call {cid!r}, which no earlier assistant message made "
                              "(turns out of order)")
                answered = calls[str(cid)]
                pending = [p for p in pending if p[2] != str(cid)]
            else:
                answered = pending.pop(0)[:2] if pending else None
            name = name or (answered[0] if answered else None)
        turns.append(Turn(role, a, z, text, tool_name=None if name is None else str(name),
                          tool_call_id=None if cid is None else str(cid),
                          error=tool_error(msg) if role == "tool" else None))
    return turns, first_turn



# ------------------------------------------------------------------------------------------- Responses items

def responses_messages(items: list) -> list[dict]:
    """Responses items as chat messages: a ``function_call`` joins the assistant message before it (or makes
    one), its ``function_call_output`` is a ``tool`` message, a ``reasoning`` item's summary opens the next
    assistant message.

    Raises:
        Bad: an item that is not an object, or of a type that is not a message, reasoning or a call.
    """
    out: list[dict] = []
    thinking = ""
    for i, it in enumerate(items):
        if not isinstance(it, dict):
            raise Bad(f"item {i} must be an object, got {type(it).__name__}")
        kind = it.get("type", "message" if "role" in it else None)
        if kind == "message":
            msg = {"role": it.get("role"), "content": content_text({"content": _blocks(it.get("content"))})}
            if msg["role"] == "assistant" and thinking:
                msg["content"], thinking = thinking + msg["content"], ""
            out.append(msg)
        elif kind == "reasoning":
            thinking += "".join(s.get("text", "") for s in it.get("summary") or [] if isinstance(s, dict)) + "\n"
        elif kind in ("function_call", "custom_tool_call"):
            call = {"id": it.get("call_id"), "type": "function",
                    "function": {"name": it.get("name"), "arguments": it.get("arguments", it.get("input"))}}
            if not out or out[-1]["role"] != "assistant" or thinking:
                out.append({"role": "assistant", "content": thinking, "tool_calls": []})
                thinking = ""
            out[-1].setdefault("tool_calls", []).append(call)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = it.get("output")
            out.append({"role": "tool", "tool_call_id": it.get("call_id"),
                        "content": output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)})
        else:
            raise Bad(f"item {i} has type {kind!r}; read are message, reasoning, function_call, custom_tool_call "
                      "and their outputs")
    if thinking:
        out.append({"role": "assistant", "content": thinking})
    return out


def _blocks(content: Any) -> Any:
    """Responses content blocks (``input_text`` / ``output_text``) as chat text blocks."""
    if not isinstance(content, list):
        return content
    return [{"type": "text", "text": b.get("text", "")} if isinstance(b, dict) and b.get("type") in
            ("input_text", "output_text", "text") else b for b in content]


def turn_counts(turns: list[Turn] | None) -> tuple[int, int, int]:
    """``(n_turns, n_tool_calls, n_tool_errors)``: a call is an assistant turn that made one (its JSON
    readable or not), an error a tool turn the source marked failed; no turns: one assistant turn.

    >>> turn_counts([Turn("assistant", None, None, "", tool_args="{"), Turn("tool", None, None, "", error="bad")])
    (2, 1, 1)
    """
    if not turns:
        return 1, 0, 0
    calls = sum(1 for t in turns if t.role == "assistant" and (t.tool_name or t.tool_args) is not None)
    return len(turns), calls, sum(1 for t in turns if t.role == "tool" and t.error)


def completion_turns(messages: list) -> list[Turn] | None:
    """The turns of a completion given as messages when it is a trajectory (it has a tool call or a tool
    message); None for a plain answer (one assistant turn).

    Raises:
        Bad: as :func:`message_turns`.
    """
    agentic = any(isinstance(m, dict) and (m.get("tool_calls") or m.get("function_call")
                                           or ROLE_ALIASES.get(m.get("role"), m.get("role")) == "tool")
                  for m in messages)
    return message_turns(messages)[0] if agentic else None
