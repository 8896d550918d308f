"""Reward rules: small pure component functions composed into a total, stored by version.

A component is a plain function with the documented signature::

    def component(prompt: str, completion: str, gold: dict, steps: list[Step], **ctx) -> float

``ctx`` carries ``parsed`` (the task's :class:`~studio.tasks.ParsedCompletion`) and
``task``. A :class:`Rule` is a weighted sum of components; scoring returns every
component's value plus ``total``, so nothing has to be recomputed to explain a score.
Each rule has a version id derived from its source and weights: rewards are keyed by it
and never overwritten.
"""
from __future__ import annotations

import ast
import hashlib
import inspect
import json
import textwrap
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable

import pandas as pd

from studio.tasks import ParsedCompletion, Prompt, Step, Task

Component = Callable[..., float]


def format_ok(prompt: str, completion: str, gold: dict, steps: list[Step], *, parsed: ParsedCompletion, **ctx) -> float:
    """1.0 when the completion is steps separated by ``;`` then ``A:<int>``, else 0.0.

    >>> from studio.tasks import get_task
    >>> t = get_task("arithmetic"); p = t.parse_prompt("Q: 2+3=")
    >>> format_ok(p.text, "2+3=6;A:6", p.gold, [], parsed=t.parse_completion(p, "2+3=6;A:6"))
    1.0
    >>> format_ok(p.text, "2+3=5;5", p.gold, [], parsed=t.parse_completion(p, "2+3=5;5"))
    0.0
    """
    return 1.0 if parsed.well_formed else 0.0


def answer_correct(prompt: str, completion: str, gold: dict, steps: list[Step], *, parsed: ParsedCompletion,
                   task: Task, **ctx) -> float:
    """1.0 when the final answer equals the gold answer (exact integer match), else 0.0.

    >>> from studio.tasks import get_task
    >>> t = get_task("arithmetic"); p = t.parse_prompt("Q: 2+3=")
    >>> answer_correct(p.text, "2+3=5;A:5", p.gold, [], parsed=t.parse_completion(p, "2+3=5;A:5"), task=t)
    1.0
    """
    return 1.0 if task.is_correct(Prompt(prompt, gold), parsed.answer) else 0.0


def steps_correct(prompt: str, completion: str, gold: dict, steps: list[Step], **ctx) -> float:
    """Share of steps whose arithmetic is right (unverifiable steps count as wrong); 0 if none.

    >>> from studio.tasks import Step
    >>> steps_correct("", "", {}, [Step("2+3=5", 0, 5, True), Step("5-1=3", 6, 11, False)])
    0.5
    """
    if not steps:
        return 0.0
    return sum(1 for s in steps if s.correct) / len(steps)


@dataclass(frozen=True)
class Rule:
    """A named weighted sum of reward components."""

    name: str
    components: dict[str, Component]
    weights: dict[str, float] = field(default_factory=dict)

    def weight(self, name: str) -> float:
        return self.weights.get(name, 1.0)

    def source(self, code_only: bool = False) -> str:
        """Everything that determines the scores: component sources and weights.

        ``code_only`` drops docstrings, comments and function names, so the version id
        changes when the scoring changes, not when its documentation does.
        """
        parts = [f"# rule {self.name}", f"# weights {json.dumps({k: self.weight(k) for k in self.components}, sort_keys=True)}"]
        for name, fn in self.components.items():
            src = textwrap.dedent(inspect.getsource(fn))
            parts.append(f"# component {name}\n{_strip_docstrings(src) if code_only else src}")
        return "\n".join(parts)

    @property
    def sha256(self) -> str:
        # the components' sources are read once per set of functions and weights (every store of new
        # rollouts asks for the version: reading and stripping the sources each time held the event loop)
        key = (self.name, tuple(self.components.items()), tuple(sorted(self.weights.items())))
        cached = self.__dict__.get("_sha256")
        if cached is None or cached[0] != key:
            cached = self.__dict__["_sha256"] = (key, hashlib.sha256(self.source(code_only=True).encode()).hexdigest())
        return cached[1]

    @property
    def version_id(self) -> str:
        return f"{self.name}@{self.sha256[:10]}"

    def score(self, task: Task, prompt: Prompt, completion: str) -> dict[str, float]:
        """Component values and their weighted ``total``; raises if a component does."""
        values, errors = self.score_detailed(task, prompt, completion)
        if errors:
            name, msg = next(iter(errors.items()))
            raise RuntimeError(f"component {name!r} failed: {msg}")
        return values

    def score_detailed(self, task: Task, prompt: Prompt, completion: str
                       ) -> tuple[dict[str, float | None], dict[str, str]]:
        """``(values, errors)``: a failing component gets value None and its error message;
        ``total`` is None when any component failed (a partial sum would mislead)."""
        try:
            parsed = task.parse_completion(prompt, completion)
        except Exception as exc:  # a task parser bug must not lose the batch either
            err = f"parse_completion: {type(exc).__name__}: {exc}"
            return dict.fromkeys([*self.components, "total"]), dict.fromkeys([*self.components, "total"], err)
        values: dict[str, float | None] = {}
        errors: dict[str, str] = {}
        for name, fn in self.components.items():
            try:
                values[name] = float(fn(prompt.text, completion, prompt.gold, list(parsed.steps), parsed=parsed, task=task))
            except Exception as exc:  # user-written components raise anything
                values[name], errors[name] = None, f"{type(exc).__name__}: {exc}"
        if errors:
            values["total"], errors["total"] = None, f"not computed: {', '.join(errors)} failed"
        else:
            values["total"] = sum(self.weight(k) * v for k, v in values.items())
        return values, errors


ARITHMETIC_V1 = Rule(
    name="arithmetic",
    components={"accuracy": answer_correct, "format": format_ok, "steps": steps_correct},
    weights={"accuracy": 1.0, "format": 0.1, "steps": 0.25},
)

DEFAULT_RULES: dict[str, Rule] = {"arithmetic": ARITHMETIC_V1}


def rule_version_frame(rule: Rule, note: str = "built-in rule") -> pd.DataFrame:
    return pd.DataFrame([{
        "rule_version_id": rule.version_id, "name": rule.name, "source": rule.source(),
        "sha256": rule.sha256, "created_at": datetime.now(timezone.utc).replace(tzinfo=None), "note": note,
    }])


def score_frame(rule: Rule, task: Task, items: list[tuple[str, Prompt, str]]) -> pd.DataFrame:
    """Long-format reward rows for ``(rollout_id, prompt, completion)`` items.

    A component that raises is recorded with ``value`` NULL and its error message (and
    ``total`` NULL), so one bad completion or component never loses the other scores.
    """
    rows = []
    vid = rule.version_id  # hashes the components' source: once per call, not per row
    for rollout_id, prompt, completion in items:
        values, errors = rule.score_detailed(task, prompt, completion)
        rows.extend((rollout_id, vid, k, v, errors.get(k)) for k, v in values.items())
    return pd.DataFrame(rows, columns=["rollout_id", "rule_version_id", "component", "value", "error"])


def _strip_docstrings(src: str) -> str:
    """Source code with docstrings, comments and the function's own name removed
    (normalised by the AST): what decides the score, and nothing else."""
    tree = ast.parse(src)
    if tree.body and isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)):
        tree.body[0].name = "component"
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
    return ast.unparse(tree)
