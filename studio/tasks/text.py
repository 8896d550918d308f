r"""Free-text tasks: word problems, chat prompts, imported runs, any data set a person brings.

A completion is read as reasoning steps (its paragraphs, or its lines when it has no blank
line; inside ``<think>`` too), an optional ``<think>…</think>`` block, and a final answer
found by an extractor (:mod:`studio.tasks.answers`) and verified with math-verify::

    >>> t = FreeText()
    >>> p = Prompt("Natalia sold 48 clips, then half as many. How many in all?", {"answer": "72"})
    >>> c = t.parse_completion(p, "<think>\n48 / 2 = 24\n48 + 24 = 72\n</think>\n\\boxed{72}")
    >>> [s.text for s in c.steps], c.answer, c.well_formed, c.think
    (['48 / 2 = 24', '48 + 24 = 72', '\\boxed{72}'], '72', True, (0, 41))
    >>> t.verdict(p, "It is 72 clips."), t.verdict(p, "<think>48+24=62</think>62")
    (('72', True), ('62', False))

Steps carry no ✓/✗ (``correct`` is ``None``): only a task that can check a step (arithmetic)
gives one. ``import`` is the free-text task of imported runs.
"""
from __future__ import annotations

import re
from typing import Any, ClassVar

from .answers import check_extractor, extract, last_boxed
from .answers import equivalent as _equivalent
from .base import ParsedCompletion, Prompt, Step, Task, TaskParseError, register_task

STEP_MODES = ("auto", "paragraph", "line")
_STEP_BODY = re.compile(r"^(\s*(?:<think>)?\s*)(.*?)(\s*(?:</think>)?\s*)$", re.S)  # a think tag is not a step
_TEMPLATE_MARKERS = ("<|im_start|>", "<|start_header_id|>", "[INST]", "<start_of_turn>", "<|user|>",
                     "<｜User｜>", "<|begin_of_text|>")


def is_templated(text: str) -> bool:
    """Whether a prompt already went through a chat template (an imported run's prompt):
    such a prompt is given to the policy as it is, never templated twice.

    >>> is_templated("<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n"), is_templated("Hi")
    (True, False)
    """
    return any(m in text for m in _TEMPLATE_MARKERS)


def think_span(text: str) -> tuple[int, int] | None:
    """Character span of the ``<think>`` block (to the end of the text while unclosed)."""
    start = text.find("<think>")
    close = text.rfind("</think>")
    if close >= 0:
        return (max(start, 0), close + len("</think>"))
    return (start, len(text)) if start >= 0 else None


def segments(text: str, mode: str = "auto") -> list[tuple[int, int]]:
    """Character spans of the reasoning steps: paragraphs (``auto`` when the text has a blank
    line), else lines; a line that is only a think tag is not a step.

    >>> segments("a\\nb\\n\\nc"), segments("a\\nb")
    ([(0, 3), (5, 6)], [(0, 1), (2, 3)])
    """
    if mode not in STEP_MODES:
        raise TaskParseError(f"unknown step mode {mode!r}; known: {', '.join(STEP_MODES)}")
    sep = "\n\n" if mode == "paragraph" or (mode == "auto" and "\n\n" in text.strip()) else "\n"
    spans, pos = [], 0
    for part in text.split(sep):
        start = pos
        pos += len(part) + len(sep)
        m = _STEP_BODY.match(part)
        if m.group(2):
            s = start + len(m.group(1))
            spans.append((s, s + len(m.group(2))))
    return spans


def answer_span(text: str, answer: str | None) -> tuple[int, int] | None:
    """Where the stated final answer sits (the whole ``\\boxed{…}`` when boxed)."""
    if not answer:
        return None
    k = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if k >= 0 and last_boxed(text) == answer:
        end = text.find(answer, k) + len(answer)
        return (k, min(len(text), end + 1))
    k = text.rfind(answer)
    return (k, k + len(answer)) if k >= 0 else None


@register_task
class FreeText(Task):
    """Prompts in words, completions in words: answers extracted and verified, steps by
    paragraph or line. Settings come from :attr:`settings` (a dataset task's are stored)."""

    name = "import"
    description = "Imported runs: free-text prompts and completions, answers read by the default extractor"
    settings: ClassVar[dict[str, Any]] = {"answer": {"extract": "auto", "regex": None}, "steps": "auto"}

    def __init__(self):
        answer = self.settings.get("answer") or {}
        self.extractor = answer.get("extract", "auto")
        self.regex = answer.get("regex")
        check_extractor(self.extractor, self.regex)
        self.step_mode = self.settings.get("steps", "auto")

    @property
    def generates(self) -> bool:
        return False

    def make_prompts(self, n: int, seed: int = 0, difficulty: str = "medium") -> list[Prompt]:
        raise TaskParseError(f"task {self.name!r} makes no prompts: its prompts are stored (draw them from a "
                             "split of the store, or type them)")

    def parse_prompt(self, text: str) -> Prompt:
        if not text.strip():
            raise TaskParseError("an empty prompt")
        return Prompt(text=text, gold={"answer": None}, meta={"templated": True} if is_templated(text) else {})

    def parse_completion(self, prompt: Prompt, completion: str) -> ParsedCompletion:
        answer = extract(completion, self.extractor, self.regex)
        think = think_span(completion)
        steps = tuple(Step(completion[a:b], a, b, None) for a, b in segments(completion, self.step_mode))
        closed = "<think>" not in completion or "</think>" in completion
        return ParsedCompletion(steps=steps, answer=answer, well_formed=answer is not None and closed,
                                think=think, answer_span=answer_span(completion, answer))

    def is_correct(self, prompt: Prompt, answer: str | None) -> bool:
        return _equivalent(answer, prompt.gold.get("answer"))

    def answer_text(self, answer: str) -> str:
        return {"hash": f"#### {answer}", "answer_colon": f"Answer: {answer}"}.get(self.extractor, f"\\boxed{{{answer}}}")
