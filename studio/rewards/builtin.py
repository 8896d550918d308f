"""Built-in reward rules: weighted sums of :mod:`~studio.rewards.rewardlib` components, versioned.

A component is a function of :mod:`studio.rewards.rewardlib` (or any plain function) that
names what it reads, from::

    prompt: str, completion: str, gold: dict, steps: list[Step], parsed: ParsedCompletion, task: Task

(``parsed`` is the task's parse of the completion; a ``**ctx`` parameter takes the ones it
does not name). The library's ``format_ok(parsed)``, ``answer_correct(parsed, gold, task,
prompt)`` and ``steps_correct(steps)`` are components as they are; a function whose
parameters are named otherwise is called the documented way, ``fn(prompt, completion, gold,
steps, parsed=..., task=...)``. A :class:`Rule` is a weighted sum of components
(:func:`~studio.rewards.rewardlib.weighted`); scoring returns every component's value plus
``total``, so nothing has to be recomputed to explain a score. Each rule has a version id
derived from its code and weights: rewards are keyed by it and never overwritten.

The sample task's built-in rule, ``arithmetic``::

    >>> from studio.tasks import get_task
    >>> t = get_task("arithmetic"); p = t.parse_prompt("Q: 23+48-7=")
    >>> ARITHMETIC_V1.score(t, p, "23+48=71;71-7=64;A:64")  # 1.0 * 1 + 0.1 * 1 + 0.25 * 1
    {'accuracy': 1.0, 'format': 1.0, 'steps': 1.0, 'total': 1.35}
    >>> ARITHMETIC_V1.score(t, p, "23+48=71;71-7=65;A:65")["steps"]  # one of two steps right
    0.5
    >>> ARITHMETIC_V1.version_id
    'arithmetic@52029205d6'
"""
from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import json
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pandas as pd

from studio.rewards.rewardlib import answer_correct, format_ok, math_match, steps_correct, weighted
from studio.tasks import Prompt, Task

Component = Callable[..., float]

ARGUMENTS = ("prompt", "completion", "gold", "steps", "parsed", "task")
"""What a component may name; it is given those it names."""


@dataclass(frozen=True)
class Rule:
    """A named weighted sum of reward components."""

    name: str
    components: dict[str, Component]
    weights: dict[str, float] = field(default_factory=dict)
    replaces: tuple[str, str] | None = None
    """``(hash of this code, hash of the code it replaced)`` when a rewrite scores every
    completion exactly like the code before it: the rule keeps that code's version id, the one
    stores hold its rewards under. Any later edit no longer matches the first hash: a new
    version, as always."""

    def weight(self, name: str) -> float:
        return self.weights.get(name, 1.0)

    def source(self, code_only: bool = False) -> str:
        """Everything that determines the scores: component sources and weights.

        ``code_only`` drops docstrings, comments and function names, so the version id
        changes when the scoring changes, not when its documentation does.
        """
        weights = json.dumps({k: self.weight(k) for k in self.components}, sort_keys=True)
        parts = [f"# rule {self.name}", f"# weights {weights}"]
        for name, fn in self.components.items():
            src = textwrap.dedent(inspect.getsource(fn))
            parts.append(f"# component {name}\n{_strip_docstrings(src) if code_only else src}")
        return "\n".join(parts)

    @property
    def code_sha256(self) -> str:
        """Hash of :meth:`source` with ``code_only``: what the version id follows."""
        return hashlib.sha256(self.source(code_only=True).encode()).hexdigest()

    @property
    def sha256(self) -> str:
        # the components' sources are read once per set of functions and weights (every store of new
        # rollouts asks for the version: reading and stripping the sources each time held the event loop)
        key = (self.name, tuple(self.components.items()), tuple(sorted(self.weights.items())), self.replaces)
        cached = self.__dict__.get("_sha256")
        if cached is None or cached[0] != key:
            sha = self.code_sha256
            if self.replaces and self.replaces[0] == sha:
                sha = self.replaces[1]
            cached = self.__dict__["_sha256"] = (key, sha)
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
        args = {"prompt": prompt.text, "completion": completion, "gold": prompt.gold, "steps": list(parsed.steps),
                "parsed": parsed, "task": task}
        values: dict[str, float | None] = {}
        errors: dict[str, str] = {}
        for name, fn in self.components.items():
            try:
                values[name] = float(_call(fn, args))
            except Exception as exc:  # user-written components raise anything
                values[name], errors[name] = None, f"{type(exc).__name__}: {exc}"
        if errors:
            values["total"], errors["total"] = None, f"not computed: {', '.join(errors)} failed"
        else:
            values["total"] = weighted(values, self.weights)
        return values, errors


ARITHMETIC_V1 = Rule(
    name="arithmetic",
    components={"accuracy": answer_correct, "format": format_ok, "steps": steps_correct},
    weights={"accuracy": 1.0, "format": 0.1, "steps": 0.25},
    # rebuilt on rewardlib from its own component functions, which scored exactly the same
    # (tests/test_rewards.py keeps them and checks both on every sample rollout)
    replaces=("91e1168dc5cb3fdd3de8ce9dcedd57e9b00eb50f2b85bdbc243cf80186860bd8",
              "52029205d672862f8231224a5d8f99cbe852802dec06e6c8c1c37f6cbbc33dc9"),
)

def answer_verified(parsed, gold) -> float:
    """1.0 when the stated answer equals the gold one under math-verify (``math_match``)."""
    return math_match(parsed.answer, gold.get("answer"))


MATH_V1 = Rule(
    name="math",
    components={"accuracy": answer_verified, "format": format_ok},
    weights={"accuracy": 1.0, "format": 0.1},
)
"""The built-in rule of free-text tasks (word problems, a prompt set, imports): the final
answer verified with math-verify, and the format (an answer stated, the think block closed)."""

DEFAULT_RULES: dict[str, Rule] = {"arithmetic": ARITHMETIC_V1, "math": MATH_V1}


def default_rule(task: Task | str) -> Rule:
    """The built-in rule new rollouts of ``task`` are scored with: its own (arithmetic), or
    :data:`MATH_V1` for every free-text task."""
    return DEFAULT_RULES.get(task if isinstance(task, str) else task.name, MATH_V1)


def rule_version_frame(rule: Rule, note: str = "built-in rule") -> pd.DataFrame:
    """The ``rule_versions`` row of a built-in rule."""
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


def _call(fn: Component, args: dict):
    """``fn`` given the :data:`ARGUMENTS` it names (all of them through a ``**ctx``), or
    called the documented positional way when it names a required one that is not there."""
    names = _names(fn)
    if names is None:
        return fn(args["prompt"], args["completion"], args["gold"], args["steps"], parsed=args["parsed"],
                  task=args["task"])
    return fn(**{k: args[k] for k in names})


def _names(fn: Component) -> tuple[str, ...] | None:
    try:
        return _names_cached(fn)
    except TypeError:  # an unhashable callable
        return _names_of(fn)


@functools.lru_cache(maxsize=256)
def _names_cached(fn: Component) -> tuple[str, ...] | None:
    return _names_of(fn)


def _names_of(fn: Component) -> tuple[str, ...] | None:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no signature to read (a builtin): the documented call
        return None
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if any(p.kind not in named and p.kind is not inspect.Parameter.VAR_KEYWORD for p in params):
        return None  # positional-only or *args: the documented call
    if any(p.kind in named and p.default is p.empty and p.name not in ARGUMENTS for p in params):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return ARGUMENTS
    return tuple(p.name for p in params if p.name in ARGUMENTS)


def _strip_docstrings(src: str) -> str:
    """Source code with docstrings, comments and the function's own name removed
    (normalised by the AST): what decides the score, and nothing else."""
    tree = ast.parse(src)
    if tree.body and isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)):
        tree.body[0].name = "component"
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
    return ast.unparse(tree)
