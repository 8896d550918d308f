"""Tool calls written the Hermes / Qwen way: ``<tool_call>{json}</tool_call>``, answered ``<tool_response>…</tool_response>``.

A policy calls a tool inside its assistant message; :func:`parse_call` reads the last call of
an assistant turn, and :func:`format_response` writes what the environment appends::

    >>> tools = {"calculator": lambda expression: 0}
    >>> parse_call('<tool_call>{"name": "calculator", "arguments": {"expression": "37*24"}}</tool_call>', tools)
    ('calculator', '{"expression": "37*24"}', {'expression': '37*24'})
    >>> format_response(888), format_response(error="division by zero in 5/0")
    ('<tool_response>888</tool_response>', '<tool_response>error: division by zero in 5/0</tool_response>')

A call that cannot be run raises :class:`ToolCallError` naming what is wrong (the agent loop
turns it into a tool turn with that error, which the policy reads).
"""
from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any

from studio.errors import StudioError

CALL_OPEN, CALL_END = "<tool_call>", "</tool_call>"
RESPONSE_OPEN, RESPONSE_END = "<tool_response>", "</tool_response>"
MARKERS = (CALL_OPEN, CALL_END, RESPONSE_OPEN, RESPONSE_END)  # one token each in the sample agent policy


class ToolCallError(StudioError, ValueError):
    """A tool call the environment cannot run: not valid JSON, no name, bad arguments, an unknown tool."""


def call_text(name: str, arguments: dict[str, Any]) -> str:
    """A call as a policy writes it (the format :func:`parse_call` reads).

    >>> call_text("calculator", {"expression": "2+2"})
    '<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>'
    """
    return CALL_OPEN + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + CALL_END


def parse_call(text: str, tools: dict[str, Callable]) -> tuple[str, str, dict[str, Any]]:
    """The last ``<tool_call>{json}</tool_call>`` of an assistant turn's ``text``.

    Returns:
        ``(name, arguments as JSON text, arguments)``.

    Raises:
        ToolCallError: no call, a call that is not a JSON object, without a ``"name"``, with
            ``"arguments"`` that are not an object or do not fit the tool, or naming no tool of ``tools``.
    """
    end = text.rfind(CALL_END)
    if end < 0:
        raise ToolCallError(f"no tool call: a call is {CALL_OPEN}{{\"name\": …, \"arguments\": {{…}}}}{CALL_END}")
    start = text.rfind(CALL_OPEN, 0, end)
    if start < 0:
        raise ToolCallError(f"{CALL_END} without {CALL_OPEN} before it")
    body = text[start + len(CALL_OPEN):end].strip()
    try:
        call = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ToolCallError(f"the tool call is not valid JSON: {exc.msg} at character {exc.pos}") from None
    if not isinstance(call, dict):
        raise ToolCallError(f"the tool call must be a JSON object with \"name\" and \"arguments\", got {_short(body)}")
    name = call.get("name")
    if not isinstance(name, str) or not name:
        raise ToolCallError(f"the tool call has no \"name\": {_short(body)}")
    args = call.get("arguments", {})
    if not isinstance(args, dict):
        raise ToolCallError(f"the arguments of {name} must be a JSON object, got {_short(json.dumps(args))}")
    if name not in tools:
        raise ToolCallError(f"unknown tool {name!r}; known tools: {', '.join(sorted(tools)) or 'none'}")
    try:
        inspect.signature(tools[name]).bind(**args)
    except TypeError as exc:
        raise ToolCallError(f"wrong arguments for {name}: {exc}") from None
    return name, json.dumps(args, ensure_ascii=False), args


def format_response(result: object = None, error: str | BaseException | None = None) -> str:
    """What the environment appends after a call: the tool's ``result``, or ``error: …`` when it failed
    (``error`` given, or ``result`` an exception)."""
    if error is None and isinstance(result, BaseException):
        error = result
    body = f"error: {error}" if error is not None else str(result)
    return RESPONSE_OPEN + body + RESPONSE_END


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "…"
