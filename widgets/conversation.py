"""The conversation around a completion, as the token strip and the static export show it: the
system and user turns (the stored chat, else a templated prompt read back, else the task's
messages; never a template's special tokens), the answer the task extracted beside the gold
one, and where the reasoning block and the stated answer sit among the tokens."""
from __future__ import annotations

import json
import re

from studio.tasks import Prompt, TaskParseError, UnknownTaskError, get_task
from studio.tasks.chat import END_OF_TURN, content_text, parse_templated
from studio.tasks.text import answer_span as find_answer_span

from .base.style import esc

STOP_TOKENS = frozenset(END_OF_TURN) | {"<eos>"}  # a completion's stop token: not part of what the task reads


def char_spans_to_tokens(texts: list[str], *spans: tuple[int, int] | None) -> list[tuple[int, int] | None]:
    """Each character span of the tokens' joined text as ``(first, last)`` token index (inclusive),
    the tokens it touches; None for a span that is None or touches none.

    >>> char_spans_to_tokens(["<think>", "4", "</think>", "A:", "4"], (0, 16), (16, 19))
    [(0, 2), (3, 4)]
    """
    bounds, pos = [], 0
    for t in texts:
        bounds.append((pos, pos + len(t)))
        pos += len(t)
    out = []
    for span in spans:
        hit = [] if span is None else [i for i, (a, b) in enumerate(bounds) if a < span[1] and b > span[0]]
        out.append((hit[0], hit[-1]) if hit else None)
    return out


def completion_marks(task, prompt: Prompt, texts: list[str]) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """Token ranges of the ``<think>`` block and of the stated answer: the task reads the tokens'
    joined text (so character offsets are the tokens'); a task that gives no answer span has the
    last place its answer is written outlined."""
    n = len(texts)
    while n and texts[n - 1] in STOP_TOKENS:  # the stop token is not part of the completion the task reads
        n -= 1
    texts = texts[:n]
    joined = "".join(texts)
    try:
        parsed = task.parse_completion(prompt, joined)
    except (TaskParseError, ValueError):
        return None, None
    answer = parsed.answer_span
    if answer is None and parsed.answer:
        answer = find_answer_span(joined, parsed.answer)
    think, answer = char_spans_to_tokens(texts, parsed.think, answer)
    return think, answer


TEMPLATE_MARK = re.compile(r"<\|[^|>\s]*\|>|<｜[^｜>]*｜>|\[/?INST\]|<(?:start|end)_of_turn>|</?s>")


ROLES = ("system", "user", "assistant", "tool")


def conversation(facts: dict | None, task=None) -> list[dict[str, str]]:
    """The turns before the assistant's: the stored chat messages, else the chat read back out of
    a templated prompt, else the task's messages of the prompt text (its system prompt first);
    a chat template's special tokens are never shown."""
    if not facts:
        return []
    if facts.get("messages"):
        try:
            msgs = json.loads(facts["messages"])
        except ValueError:
            msgs = None
        if isinstance(msgs, list) and msgs:
            return [{"role": str(m.get("role") or "user"), "content": content_text(m)} for m in msgs if isinstance(m, dict)]
    prompt = facts.get("prompt") or ""
    for text in (prompt, facts.get("prompt_text") or ""):
        if text and (parsed := parse_templated(text)):
            return parsed
    if task is not None and not TEMPLATE_MARK.search(prompt):
        return task.messages(Prompt(prompt, {}))
    return [{"role": "user", "content": TEMPLATE_MARK.sub("", prompt).strip()}]


def conversation_html(turns: list[dict[str, str]], assistant: str) -> str:
    """The turns as labelled rows, then the assistant's turn holding ``assistant`` (the strip's HTML)."""
    return (f'<div class="convo">{turn_rows_html(turns)}<div class="turn assistant"><span class="role">assistant</span>'
            f'<div class="say-strip">{assistant}</div></div></div>')


def turn_rows_html(turns: list[dict[str, str]]) -> str:
    """The turns before the assistant's as labelled rows (an agent trajectory's follow, :mod:`widgets.turn_blocks`)."""
    return "".join(f'<div class="turn {m["role"] if m["role"] in ROLES else "other"}"><span class="role">'
                   f'{esc(m["role"])}</span><div class="say">{esc(m["content"])}</div></div>' for m in turns)


def gold_of(value) -> dict:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


def clipped(text: str, n: int = 80) -> str:
    t = " ".join(str(text).split())
    return t if len(t) <= n else t[:n - 1] + "…"


def answer_html(facts: dict, task, prompt: Prompt, completion: str) -> str:
    """The extracted answer beside the gold one, ✓/✗ from the rollout's stored correctness (the
    task's verdict for a rollout stored before correctness was), or "no gold answer"."""
    answer, correct = facts.get("answer"), facts.get("correct")
    gold = prompt.gold.get("answer")
    if (answer is None or correct is None) and task is not None and completion:
        try:
            found, verdict = task.verdict(prompt, completion)
        except (TaskParseError, ValueError, TypeError):
            found, verdict = None, None
        answer = answer if answer is not None else found
        correct = correct if correct is not None else verdict
    said = f'answer <b class="answer-val">{esc(clipped(answer, 40))}</b>' if answer not in (None, "") else \
        '<span class="muted">no answer found</span>'
    if gold in (None, ""):
        return f'<span class="answer-line">{said} · <span class="muted">no gold answer</span></span>'
    mark = "" if correct is None else ('<b class="ok">✓ correct</b>' if correct else '<b class="bad">✗ incorrect</b>')
    return f'<span class="answer-line">{said} · gold <b class="gold-val">{esc(clipped(gold, 40))}</b> {mark}</span>'


def task_named(name):
    try:
        return get_task(name) if name else None
    except (UnknownTaskError, TaskParseError):
        return None


MARKS_KEY = ('<div class="legend marks-key"><span class="think-swatch"></span><span>reasoning '
             '(&lt;think&gt; block)</span><span class="answer-swatch"></span><span>stated answer</span></div>')

