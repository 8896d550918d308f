"""Run user reward code away from the server: worker processes with limits.

User rule code never runs in the server process. It runs in a pool of spawn-context
worker processes, each with an address-space limit (``Limits.memory_mb``: a 10 GB
allocation fails with ``MemoryError`` there, not in the server), a per-rollout time
limit (``Limits.call_s``: an endless loop is interrupted by a timer signal) and, for a
whole apply, a total budget (``Limits.budget_s``: past it the workers are killed). A rule
that raises, loops, returns NaN or the wrong type (in ``reward``, ``step_reward`` or
``turn_reward``) yields a per-rollout error with a short traceback; the other rollouts are
still scored.

The per-rollout timer covers the call only. A worker loads the rule first, untimed: it runs
the rule's module-level code (its imports) and pays the first-use cost of the library
functions the rule names (``math_match`` imports math-verify and sympy: seconds in a fresh
worker), so a cold worker's first rollout has the same time as every other.

The source is checked in the server by parsing only (:func:`check_source`: syntax errors
with their line and column, a missing ``reward`` function), never executed there.
"""
from __future__ import annotations

import ast
import hashlib
import math
import multiprocessing
import os
import signal
import threading
import traceback
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from studio.errors import NOT_DONE, StudioError

RULE_FILENAME = "<rule>"


@dataclass(frozen=True)
class Limits:
    """Resource limits of user rule code."""

    call_s: float = 2.0
    """Longest one rollout's scoring may take."""
    memory_mb: int = 2048
    """Address space of each worker process (the rule plus Python itself)."""
    budget_s: float = 600.0
    """Longest a whole apply may take; past it the workers are killed and nothing is stored."""
    workers: int = max(1, min(4, os.cpu_count() or 1))
    """Worker processes scoring in parallel."""


@dataclass(frozen=True)
class SourceProblem:
    """Something wrong with a rule's source, at a 1-based line and 0-based column."""

    line: int
    column: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


class RuleSourceError(StudioError, ValueError):
    """A rule that cannot run as written; ``problems`` says where."""

    def __init__(self, problems: list[SourceProblem]):
        self.problems = problems
        super().__init__("; ".join(map(str, problems)))


class SandboxError(StudioError, RuntimeError):
    """The sandbox itself gave up (budget spent, a worker killed): nothing was stored."""

    exit_code = NOT_DONE


def check_source(source: str) -> list[SourceProblem]:
    """Problems found by parsing ``source`` (never running it): syntax errors, and a
    missing or malformed ``reward`` / ``step_reward`` / ``turn_reward`` function.

    >>> check_source("def reward(prompt, completion, gold, steps, **ctx):\\n    return 1.0")
    []
    >>> [str(p) for p in check_source("def reward(prompt):\\n  return (")]
    ["line 2: '(' was never closed"]
    >>> [str(p) for p in check_source("x = 1")]
    ['line 1: a rule defines `def reward(prompt, completion, gold, steps, **ctx)`']
    >>> [str(p) for p in check_source("def reward(*a, **k):\\n  return 1\\ndef turn_reward(turn):\\n  return 0")]
    ['line 3: turn_reward takes (prompt, turn, gold, **ctx)']
    """
    try:
        tree = ast.parse(source, filename=RULE_FILENAME)
    except SyntaxError as exc:
        return [SourceProblem(exc.lineno or 1, max(0, (exc.offset or 1) - 1), exc.msg)]
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    problems = []
    if "reward" not in funcs:
        problems.append(SourceProblem(1, 0, "a rule defines `def reward(prompt, completion, gold, steps, **ctx)`"))
    else:
        fn = funcs["reward"]
        if len(fn.args.args) + len(fn.args.posonlyargs) < 4 and fn.args.vararg is None:
            problems.append(SourceProblem(fn.lineno, fn.col_offset,
                                          "reward takes (prompt, completion, gold, steps, **ctx)"))
    for name, what in (("step_reward", "step"), ("turn_reward", "turn")):
        fn = funcs.get(name)
        if fn is not None and len(fn.args.args) + len(fn.args.posonlyargs) < 3 and fn.args.vararg is None:
            problems.append(SourceProblem(fn.lineno, fn.col_offset, f"{name} takes (prompt, {what}, gold, **ctx)"))
    return problems


def source_sha(source: str) -> str:
    """Hash of what decides the scores: the source with comments, docstrings and layout
    normalised away (by the AST), so re-formatting a rule keeps its version."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return hashlib.sha256(source.encode()).hexdigest()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.unparse(tree).encode()).hexdigest()


# ---------------------------------------------------------------------------- the pool

_lock = threading.Lock()
_pools: dict[tuple, ProcessPoolExecutor] = {}


def pool(limits: Limits) -> ProcessPoolExecutor:
    """The rule pool for these limits (started on first use, reused after)."""
    key = (limits.memory_mb, limits.workers)
    with _lock:
        if key not in _pools:
            _pools[key] = ProcessPoolExecutor(max_workers=limits.workers,
                                              mp_context=multiprocessing.get_context("spawn"),
                                              initializer=_init_worker, initargs=(limits.memory_mb,))
        return _pools[key]


def kill_pool(limits: Limits) -> None:
    """Kill the pool's workers now (budget spent, or a cancel that must not wait)."""
    key = (limits.memory_mb, limits.workers)
    with _lock:
        ex = _pools.pop(key, None)
    if ex is None:
        return
    for proc in list(getattr(ex, "_processes", {}).values()):
        proc.kill()
    ex.shutdown(wait=False, cancel_futures=True)


def kill_pools() -> None:
    """Kill every rule pool of this process (a mini-run worker ending: a spawned process
    joins its non-daemon children at exit, and an idle pool worker would never return)."""
    with _lock:
        keys = list(_pools)
    for memory_mb, workers in keys:
        kill_pool(Limits(memory_mb=memory_mb, workers=workers))


def _init_worker(memory_mb: int) -> None:
    import resource

    from backends.device import yield_to_server
    from studio.workers.processes import exit_with_parent, ignore_interrupts

    ignore_interrupts()  # its owner stops it (kill_pool): no KeyboardInterrupt traceback per rule worker
    limit = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    yield_to_server()
    exit_with_parent()


# ---------------------------------------------------------------------------- in the worker

@dataclass(frozen=True)
class RuleTurn:
    """A turn of an agent trajectory as a rule's ``turn_reward`` (and ``ctx["turns"]``) sees it."""

    index: int
    """Its place in the trajectory (``turns.turn_idx``)."""
    role: str
    """assistant | tool | user | system."""
    text: str
    """What it says (a tool turn: the tool's response as the policy saw it)."""
    tool_name: str | None = None
    """The tool an assistant turn called / that answered."""
    tool_args: str | None = None
    """The call's arguments, JSON text as the policy wrote it."""
    error: str | None = None
    """Why the call failed: on the tool turn, and on the assistant turn that made the call."""
    response: str | None = None
    """An assistant turn's call: the tool's response (None: no call, or no answer)."""


def rule_turns(rows: list[tuple]) -> list[RuleTurn]:
    """A trajectory's turns for a rule, from ``(turn_idx, role, content, tool_name, tool_args, error)``
    rows in order: an assistant turn carries the response (and error) of the tool turn after it."""
    out = []
    for i, (idx, role, text, name, args, err) in enumerate(rows):
        nxt = rows[i + 1] if i + 1 < len(rows) and role == "assistant" and rows[i + 1][1] == "tool" else None
        out.append(RuleTurn(int(idx), role, text or "", name, args,
                            err if nxt is None else nxt[5], None if nxt is None else (nxt[2] or "")))
    return out


class RuleTimeout(Exception):
    """Raised inside a rule call that ran past its time limit."""


_compiled: dict[str, dict] = {}


def _compile(source: str, sha: str) -> dict:
    """The rule's namespace, loaded once per worker and warmed up (both before any timed call)."""
    if sha not in _compiled:
        namespace: dict = {"__name__": "rule"}
        exec(compile(source, RULE_FILENAME, "exec"), namespace)  # noqa: S102  (the point of the sandbox)
        _compiled.clear()
        _compiled[sha] = namespace
        _warm_up(source)
    return _compiled[sha]


def _warm_up(source: str) -> None:
    """Pay the first-use cost of the library functions ``source`` names: math-verify and sympy
    load on ``math_match``'s first call, which must not count against a rollout's time."""
    if "math_match" not in source:
        return
    from studio.rewards.rewardlib import math_match

    try:
        math_match("1", "1")
    except Exception:  # math-verify missing or broken: the rule's own calls say so, rollout by rollout
        pass


def _on_alarm(signum, frame):
    raise RuleTimeout


def _short_tb(exc: BaseException) -> str:
    """The traceback frames inside the rule's own code, and the error."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == RULE_FILENAME]
    lines = [f"  line {f.lineno}, in {f.name}: {f.line or ''}".rstrip() for f in frames[-3:]]
    return "\n".join([*lines, f"{type(exc).__name__}: {exc}"])


def _as_components(value) -> dict[str, float]:
    """A rule's return value as ``{component: value}`` with ``total``; raises TypeError/ValueError."""
    if isinstance(value, bool) or isinstance(value, (int, float)):
        parts = {"total": float(value)}
    elif isinstance(value, dict):
        if not value:
            raise ValueError("returned an empty dict; give at least one component")
        parts = {}
        for k, v in value.items():
            if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, (int, float)):
                raise TypeError(f"component {k!r} is {type(v).__name__}; components are numbers")
            parts[k] = float(v)
        if "total" not in parts:
            parts["total"] = sum(parts.values())
    else:
        raise TypeError(f"returned {type(value).__name__}; a rule returns a float or a dict of floats")
    bad = [k for k, v in parts.items() if not math.isfinite(v)]
    if bad:
        raise ValueError(f"returned a non-finite value ({', '.join(f'{k}={parts[k]}' for k in bad)})")
    return parts


def score_chunk(source: str, sha: str, task: str | dict, rows: list[tuple], call_s: float,
                turns: dict[str, list[tuple]] | None = None
                ) -> tuple[list[tuple], list[tuple], list[tuple], list[tuple]]:
    """Runs in a worker: score ``rows`` of ``(rollout_id, prompt, gold_json, completion)``.

    ``task`` is a task's name or its spec (``studio.tasks.Task.spec``: a task the store
    defines is rebuilt from it here). ``turns``: the turns of the rows that are agent
    trajectories (rows of :func:`rule_turns`, by rollout id): the rule sees them as
    ``ctx["turns"]`` and its ``turn_reward`` scores each assistant turn. Returns ``(rewards,
    step_rewards, errors, turn_rewards)``: reward rows ``(rollout_id, component, value,
    error)``, step rows ``(rollout_id, step_idx, value)``, ``(rollout_id, message)`` for every
    rollout the rule failed on (its ``total`` is stored as NULL with the message, so a failure
    is visible, not silently missing) and turn rows ``(rollout_id, turn_idx, value)``.
    """
    import json

    from studio.tasks import Prompt, get_task

    task = get_task(task)
    try:
        ns = _compile(source, sha)
    except BaseException as exc:  # a rule that fails at import fails every rollout, plainly
        msg = f"the rule failed to load:\n{_short_tb(exc)}"
        return [(r[0], "total", None, msg) for r in rows], [], [(r[0], msg) for r in rows], []
    reward, step_reward, turn_reward = ns.get("reward"), ns.get("step_reward"), ns.get("turn_reward")
    old = signal.signal(signal.SIGALRM, _on_alarm)
    out, steps_out, errors, turns_out = [], [], [], []
    try:
        for rollout_id, prompt_text, gold_json, completion, *extra in rows:
            gold = json.loads(gold_json) if isinstance(gold_json, str) else (gold_json or {})
            prompt = Prompt(prompt_text, gold)
            try:
                signal.setitimer(signal.ITIMER_REAL, call_s)
                try:
                    parsed = task.parse_completion(prompt, completion)
                    ctx = {"parsed": parsed, "task": task, "n_chars": len(completion), **(extra[0] if extra else {})}
                    trajectory = rule_turns(turns[rollout_id]) if turns and rollout_id in turns else None
                    if trajectory is not None:
                        ctx["turns"] = trajectory
                    parts = _as_components(reward(prompt_text, completion, gold, list(parsed.steps), **ctx))
                    step_vals = []
                    if step_reward is not None:
                        for i, st in enumerate(parsed.steps):
                            v = step_reward(prompt_text, st, gold, **ctx)
                            _check_number(v, "step_reward", f"step {i + 1}")
                            step_vals.append((rollout_id, i, float(v)))
                    turn_vals = []
                    if turn_reward is not None and trajectory is not None:
                        for turn in trajectory:
                            if turn.role == "assistant":
                                v = turn_reward(prompt_text, turn, gold, **ctx)
                                _check_number(v, "turn_reward", f"turn {turn.index}")
                                turn_vals.append((rollout_id, turn.index, float(v)))
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            except RuleTimeout:
                msg = f"timed out: scoring one rollout took over {call_s:g} s (an endless loop?)"
            except MemoryError:
                msg = "MemoryError: the rule ran out of the worker's memory limit"
            except Exception as exc:  # user code raises anything
                in_rule = any(f.filename == RULE_FILENAME for f in traceback.extract_tb(exc.__traceback__))
                msg = _short_tb(exc) if in_rule else f"{type(exc).__name__}: {exc}"
            else:
                out.extend((rollout_id, k, v, None) for k, v in parts.items())
                steps_out.extend(step_vals)
                turns_out.extend(turn_vals)
                continue
            out.append((rollout_id, "total", None, msg))
            errors.append((rollout_id, msg))
    finally:
        signal.signal(signal.SIGALRM, old)
    return out, steps_out, errors, turns_out


def _check_number(v, fn: str, where: str) -> None:
    """Refuse what a step or turn rule returns unless it is a finite number."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise TypeError(f"{fn} returned {v!r} for {where}; it returns a finite number")
