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
    messages: tuple[dict[str, str], ...] | None = None  # a chat prompt: [{"role", "content"}, ...]; text is its
                                                        #   last user message (or the whole, already templated)

    def to_json(self) -> dict[str, Any]:
        """Plain data a worker process rebuilds the prompt from (:meth:`from_json`)."""
        return {"text": self.text, "gold": self.gold, "meta": self.meta,
                "messages": list(self.messages) if self.messages else None}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Prompt:
        return cls(d["text"], d.get("gold") or {}, d.get("meta") or {},
                   tuple(d["messages"]) if d.get("messages") else None)


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
    think: tuple[int, int] | None = None   # character span of the <think>…</think> block
    answer_span: tuple[int, int] | None = None  # character span of the stated final answer


class Task:
    """Base class of a task. Subclasses set ``name`` and implement the four methods."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    splits: ClassVar[tuple[str, ...]] = ()  # named subsets prompts are drawn from (dataset tasks)
    template: ClassVar[dict[str, Any]] = {}  # chat template settings: system prompt, thinking switch

    @property
    def spec(self) -> dict[str, Any]:
        """What rebuilds this task in another process (:func:`get_task` takes it)."""
        return {"kind": "builtin", "name": self.name}

    @property
    def generates(self) -> bool:
        """Whether :meth:`make_prompts` makes prompts (a dataset task's prompts are stored)."""
        return True

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

    def verdict(self, prompt: Prompt, completion: str) -> tuple[str | None, bool | None]:
        """The answer a completion states and whether it is right; ``None`` when the prompt
        has no gold answer to check against (a typed prompt of a dataset task)."""
        answer = self.parse_completion(prompt, completion).answer
        if prompt.gold.get("answer") in (None, ""):
            return answer, None
        return answer, bool(self.is_correct(prompt, answer))

    def answer_text(self, answer: str) -> str:
        """``answer`` written the way this task's completions state it (information gain
        teacher-forces it)."""
        return str(answer)

    def policy_input(self, prompt: Prompt) -> str | dict[str, Any]:
        """What a policy is given for ``prompt`` (``backends.chat.render``): an already-templated
        prompt as it is, else its chat, which the policy's own chat template renders (a policy
        without one reads the text)."""
        if prompt.meta.get("templated"):
            return prompt.text
        return {"messages": self.messages(prompt), "thinking": self.template.get("thinking")}

    def messages(self, prompt: Prompt) -> list[dict[str, str]]:
        """The chat messages of a prompt (system prompt of the task first, when it has one)."""
        if prompt.messages:
            return [dict(m) for m in prompt.messages]
        system = self.template.get("system")
        return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt.text}]


_TASKS: dict[str, type[Task]] = {}
_DEFINED: dict[str, dict[str, Any]] = {}  # name -> spec of the tasks a store defines (rebuilt per process)


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


def seen_prompt(prompt_text: str | None, text: str, messages: Any = None) -> str | dict[str, Any]:
    """What a policy reads for a stored rollout: the exact text it was given (a template's
    output), else the stored chat (rendered by the policy's template in the worker), else the text."""
    if prompt_text:
        return prompt_text
    if isinstance(messages, str):
        import json

        messages = json.loads(messages)
    return {"messages": list(messages), "thinking": None} if messages else text


def define(spec: dict[str, Any]) -> Task:
    """Make a task described by ``spec`` (a stored task's ``spec``) known in this process."""
    task = from_spec(spec)
    if spec.get("kind") != "builtin":
        _DEFINED[task.name] = dict(spec)
    return task


def from_spec(spec: dict[str, Any]) -> Task:
    """The task ``spec`` describes (:attr:`Task.spec`), without registering it."""
    kind = spec.get("kind")
    if kind == "builtin":
        return get_task(spec["name"])
    if kind == "dataset":
        from .dataset import DatasetTask

        return DatasetTask(spec)
    raise UnknownTaskError(f"cannot rebuild a task of kind {kind!r} (known kinds: builtin, dataset)")


def get_task(name: str | dict[str, Any]) -> Task:
    """Return the task ``name`` (a registered class or a task a store defined), or the task a
    spec describes."""
    if isinstance(name, dict):
        return from_spec(name)
    if name in _TASKS:
        return _TASKS[name]()
    if name in _DEFINED:
        return from_spec(_DEFINED[name])
    raise UnknownTaskError(f"unknown task {name!r}; known tasks: {', '.join(task_names()) or 'none'}")


def task_names() -> list[str]:
    return sorted(set(_TASKS) | set(_DEFINED))
