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

import hashlib
import inspect
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable

import pandas as pd

from .tasks import ParsedCompletion, Prompt, Step, Task

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

    def source(self) -> str:
        """Everything that determines the scores: component sources and weights."""
        parts = [f"# rule {self.name}", f"# weights {json.dumps({k: self.weight(k) for k in self.components}, sort_keys=True)}"]
        for name, fn in self.components.items():
            parts.append(f"# component {name}\n{inspect.getsource(fn)}")
        return "\n".join(parts)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.source().encode()).hexdigest()

    @property
    def version_id(self) -> str:
        return f"{self.name}@{self.sha256[:10]}"

    def score(self, task: Task, prompt: Prompt, completion: str) -> dict[str, float]:
        """Component values and their weighted ``total`` for one completion."""
        parsed = task.parse_completion(prompt, completion)
        values = {
            name: float(fn(prompt.text, completion, prompt.gold, list(parsed.steps), parsed=parsed, task=task))
            for name, fn in self.components.items()
        }
        values["total"] = sum(self.weight(k) * v for k, v in values.items())
        return values


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

    A component that raises is recorded with ``value`` NULL and the error message, so one
    bad completion never loses the others' scores.
    """
    rows = []
    for rollout_id, prompt, completion in items:
        try:
            values = rule.score(task, prompt, completion)
        except Exception as exc:  # a rule bug must not abort a whole batch
            rows.append((rollout_id, rule.version_id, "total", None, f"{type(exc).__name__}: {exc}"))
            continue
        rows.extend((rollout_id, rule.version_id, k, v, None) for k, v in values.items())
    return pd.DataFrame(rows, columns=["rollout_id", "rule_version_id", "component", "value", "error"])
