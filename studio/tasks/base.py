"""The task interface: what the studio needs to know about a family of prompts.

A task turns a seed into prompts with gold answers, and turns a completion back into
steps and a final answer so that rewards and step views can be computed. Adding a task
means subclassing :class:`Task` and registering it with :func:`register_task`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from studio.errors import StudioError


class TaskParseError(StudioError, ValueError):
    """A prompt or completion the task cannot read; the message says what was expected."""


@dataclass(frozen=True)
class Prompt:
    """One prompt of a task, with the gold answer the rewards check against."""

    text: str
    gold: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    """One reasoning step of a completion: its text, its character span, and a verdict.

    ``correct`` is ``None`` when the task cannot verify the step.
    """

    text: str
    start: int
    end: int
    correct: bool | None


@dataclass(frozen=True)
class ParsedCompletion:
    """A completion read by its task."""

    steps: tuple[Step, ...]
    answer: str | None
    well_formed: bool


class Task:
    """Base class of a task. Subclasses set ``name`` and implement the four methods."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""

    def make_prompts(self, n: int, seed: int = 0, difficulty: str = "medium") -> list[Prompt]:
        """Return ``n`` prompts drawn deterministically from ``seed``."""
        raise NotImplementedError

    def parse_prompt(self, text: str) -> Prompt:
        """Read a prompt typed by a person; raise :class:`TaskParseError` if it is not one."""
        raise NotImplementedError

    def parse_completion(self, prompt: Prompt, completion: str) -> ParsedCompletion:
        """Split a completion into verified steps and a final answer."""
        raise NotImplementedError

    def is_correct(self, prompt: Prompt, answer: str | None) -> bool:
        """Whether a final answer matches the prompt's gold answer."""
        raise NotImplementedError


_TASKS: dict[str, type[Task]] = {}


def register_task(cls: type[Task]) -> type[Task]:
    """Class decorator that makes a task available by its ``name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} needs a non-empty `name`")
    _TASKS[cls.name] = cls
    return cls


class UnknownTaskError(StudioError, KeyError):
    """No task is registered under the given name."""

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return str(self.args[0])


def get_task(name: str) -> Task:
    """Return a new instance of the registered task ``name``."""
    try:
        return _TASKS[name]()
    except KeyError:
        known = ", ".join(sorted(_TASKS)) or "none"
        raise UnknownTaskError(f"unknown task {name!r}; registered tasks: {known}") from None


def task_names() -> list[str]:
    return sorted(_TASKS)
