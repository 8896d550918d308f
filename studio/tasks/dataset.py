"""A task a person brought as a prompt set: its settings are stored with the store.

Its prompts (text or chat messages, gold answers, split, level) are rows of the store's
``prompts`` table, written once when the task is added (``studio.ingest.prompt_sets``); its
``spec`` (name, source file and hash, column mapping, answer, step and template settings)
is a row of the ``tasks`` table, so every process that opens the store, and every worker
handed the spec, rebuilds the same task::

    >>> spec = {"kind": "dataset", "name": "wp", "splits": ["train", "test"],
    ...         "answer": {"extract": "boxed"}, "template": {"system": "Reason, then box the answer."}}
    >>> t = DatasetTask(spec)
    >>> t.messages(Prompt("2+2?", {"answer": "4"}))[0]["role"], t.answer_text("4"), t.splits
    ('system', '\\\\boxed{4}', ('train', 'test'))
"""
from __future__ import annotations

from typing import Any

from .base import Prompt, TaskParseError
from .text import STEP_MODES, FreeText

__all__ = ["DatasetTask", "Prompt", "check_spec"]


def check_spec(spec: dict[str, Any]) -> None:
    """Raise :class:`TaskParseError` naming what in a dataset task's settings is unusable."""
    from .answers import AnswerSettingError, check_extractor

    name = spec.get("name")
    if not name or not isinstance(name, str) or not name.replace("-", "_").replace(".", "_").isidentifier():
        raise TaskParseError(f"a task name is letters, digits, '_', '-' or '.', starting with a letter: got {name!r}")
    answer = spec.get("answer") or {}
    try:
        check_extractor(answer.get("extract", "auto"), answer.get("regex"))
    except AnswerSettingError as exc:
        raise TaskParseError(str(exc)) from None
    if spec.get("steps", "auto") not in STEP_MODES:
        raise TaskParseError(f"unknown step mode {spec.get('steps')!r}; known: {', '.join(STEP_MODES)}")
    thinking = (spec.get("template") or {}).get("thinking")
    if thinking not in (None, True, False):
        raise TaskParseError(f"the template's thinking switch is true, false or unset: got {thinking!r}")


class DatasetTask(FreeText):
    """A free-text task described by a stored spec."""

    def __init__(self, spec: dict[str, Any]):
        check_spec(spec)
        self._spec = dict(spec)
        self.name = spec["name"]  # instance attributes shadow the class's ClassVars
        self.description = spec.get("description") or f"prompt set {spec['name']}"
        self.splits = tuple(spec.get("splits") or ())
        self.template = dict(spec.get("template") or {})
        self.settings = {"answer": dict(spec.get("answer") or {}), "steps": spec.get("steps", "auto")}
        super().__init__()

    @property
    def spec(self) -> dict[str, Any]:
        return dict(self._spec)
