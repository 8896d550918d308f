"""The built-in reward library that user rules import: ``from studio.rewardlib import *``.

A rule is plain Python with one required function::

    def reward(prompt, completion, gold, steps, **ctx) -> float | dict

``steps`` are the task's parsed steps (text, span, verdict); ``ctx`` carries ``parsed``
(the task's parse: ``answer``, ``well_formed``), ``task`` and ``n_chars``. A float is the
total reward; a dict gives named components, and its ``total`` entry is the reward (the
sum of the other entries when it has none). An optional step rule scores each step::

    def step_reward(prompt, step, gold, **ctx) -> float

and an optional turn rule scores each assistant turn of an agent trajectory (a rollout with
tool calls; its ``ctx["turns"]`` lists every turn, for ``reward`` too)::

    def turn_reward(prompt, turn, gold, **ctx) -> float

``turn`` has ``index`` (its place in the trajectory), ``role``, ``text``, ``tool_name`` and
``tool_args`` (the call it made, JSON text), ``response`` (the tool's answer to that call) and
``error`` (why the call failed; None when it ran), e.g. ``return -1.0 if turn.error else 0.0``.
Its values are stored per turn under the rule's version, the per-turn rewards the token strip
draws and turn advantages normalise (:mod:`studio.signals.turns`).

Everything here is a small pure function with literal doctests, so a rule reads like the
paper it comes from. The built-in rules (:mod:`studio.rewards.builtin`) are weighted sums of
these same functions. Light on imports: it runs in the sandbox's worker processes.
"""
from __future__ import annotations

import math
from fractions import Fraction

__all__ = ["format_ok", "answer_correct", "numeric_match", "math_match", "steps_correct", "length_penalty",
           "repetition_penalty", "clip", "sigmoid", "centered", "bounded", "gated", "weighted"]


def format_ok(parsed) -> float:
    """1.0 when the task reads the completion as well formed (steps, then the answer line).

    >>> from studio.tasks import get_task
    >>> t = get_task("arithmetic"); p = t.parse_prompt("Q: 2+3=")
    >>> format_ok(t.parse_completion(p, "2+3=5;A:5")), format_ok(t.parse_completion(p, "5"))
    (1.0, 0.0)
    """
    return 1.0 if parsed.well_formed else 0.0


def numeric_match(answer, gold, rel_tol: float = 0.0) -> float:
    """1.0 when two answers are the same number (``"3/4"``, ``"0.75"``, ``0.75``), else 0.0.

    >>> numeric_match("3/4", "0.75"), numeric_match("12", 12), numeric_match("x", "1"), numeric_match(None, 1)
    (1.0, 1.0, 0.0, 0.0)
    >>> numeric_match("100", "101", rel_tol=0.02)
    1.0
    """
    try:
        a, b = Fraction(str(answer).strip()), Fraction(str(gold).strip())
    except (ValueError, ZeroDivisionError):
        return 0.0
    if rel_tol:
        return 1.0 if math.isclose(float(a), float(b), rel_tol=rel_tol) else 0.0
    return 1.0 if a == b else 0.0


def math_match(answer, gold) -> float:
    r"""1.0 when ``math-verify`` judges the answer equal to the gold one, else 0.0: the check
    math-reasoning papers use (LaTeX or plain; ``\frac{1}{2}`` = ``1/2`` = ``0.5``,
    ``\boxed{…}`` is read, ``2\sqrt{2}`` = ``\sqrt{8}``).

    math-verify's own signal timeouts are off: the sandbox's per-call limit governs.

    >>> math_match("\\frac{1}{2}", "0.5"), math_match("\\boxed{7}", 7), math_match("2\\sqrt{2}", "\\sqrt{8}")
    (1.0, 1.0, 1.0)
    >>> math_match("41", "42"), math_match(None, "1"), math_match("", "1")
    (0.0, 0.0, 0.0)

    Words around the number are free text, not a product of symbols:

    >>> math_match("72 clips", "72"), math_match("So the total is 72", "72"), math_match("x^2+1", "1+x^2")
    (1.0, 1.0, 1.0)
    """
    from studio.tasks.answers import equivalent

    return 1.0 if equivalent(answer, gold) else 0.0


def answer_correct(parsed, gold: dict, task=None, prompt: str = "") -> float:
    """Final-answer accuracy: the task's own check when given (of the answer to ``prompt``,
    for a task whose check reads the prompt's text), else a numeric match of
    ``parsed.answer`` against ``gold["answer"]``.

    >>> from studio.tasks import get_task
    >>> t = get_task("arithmetic"); p = t.parse_prompt("Q: 2+3=")
    >>> answer_correct(t.parse_completion(p, "2+3=5;A:5"), p.gold, t)
    1.0
    >>> answer_correct(t.parse_completion(p, "2+3=6;A:6"), p.gold)
    0.0
    """
    if task is not None:
        from studio.tasks import Prompt

        return 1.0 if task.is_correct(Prompt(prompt, gold), parsed.answer) else 0.0
    return numeric_match(parsed.answer, gold.get("answer"))


def steps_correct(steps) -> float:
    """Share of steps verified correct (unverifiable steps count as wrong); 0.0 without steps.

    >>> from studio.tasks import Step
    >>> steps_correct([Step("2+3=5", 0, 5, True), Step("5-1=3", 6, 11, False)]), steps_correct([])
    (0.5, 0.0)
    """
    return sum(1 for s in steps if s.correct) / len(steps) if steps else 0.0


def length_penalty(length: int, target: int, per_unit: float = 0.01, cap: float | None = None) -> float:
    """``-per_unit`` for every unit (character or token) beyond ``target``, at most ``cap``.

    >>> length_penalty(30, 20, 0.01), length_penalty(10, 20), length_penalty(500, 20, 0.01, cap=1.0)
    (-0.1, 0.0, -1.0)
    """
    pen = -per_unit * max(0, length - target) + 0.0  # + 0.0: no "-0.0" within the target
    return max(pen, -cap) if cap is not None else pen


def repetition_penalty(text: str, n: int = 3) -> float:
    """Minus the share of character n-grams that repeat an earlier one (0.0: no repeats).

    >>> repetition_penalty("abcdef"), repetition_penalty("abababab", n=2)
    (0.0, -0.7142857142857143)
    """
    grams = [text[i:i + n] for i in range(max(0, len(text) - n + 1))]
    if not grams:
        return 0.0
    return -(len(grams) - len(set(grams))) / len(grams)


def clip(x: float, lo: float, hi: float) -> float:
    """``x`` limited to ``[lo, hi]``.

    >>> clip(2.5, 0, 1), clip(-3, -1, 1), clip(0.5, 0, 1)
    (1, -1, 0.5)
    """
    return min(max(x, lo), hi)


def sigmoid(x: float, scale: float = 1.0) -> float:
    """Logistic shaping ``1 / (1 + exp(-x / scale))``: any real number into (0, 1).

    >>> sigmoid(0.0), round(sigmoid(2.0), 4), round(sigmoid(-2.0, scale=2.0), 4)
    (0.5, 0.8808, 0.2689)
    """
    return 1.0 / (1.0 + math.exp(-x / scale))


def centered(x: float, reference: float) -> float:
    """``x`` relative to a reference value (e.g. a baseline policy's mean reward).

    >>> centered(1.25, 1.0)
    0.25
    """
    return x - reference


def bounded(x: float, bound: float = 1.0) -> float:
    """Smoothly squash into ``(-bound, bound)`` with ``tanh``: large rewards cannot dominate.

    >>> bounded(0.0), round(bounded(10.0), 4), round(bounded(-0.5, bound=2.0), 4)
    (0.0, 1.0, -0.4898)
    """
    return bound * math.tanh(x / bound)


def gated(outcome: float, step_values, tau: float = 1.0) -> float:
    """Gated accumulation: the step rewards count (summed) only when the outcome reaches ``tau``.

    >>> gated(1.0, [0.5, 0.25]), gated(0.0, [0.5, 0.25]), gated(0.6, [1, 1], tau=0.5)
    (0.75, 0.0, 2)
    """
    return sum(step_values) if outcome >= tau else 0.0


def weighted(parts: dict, weights: dict) -> float:
    """Weighted sum of named components; a component without a weight counts once.

    >>> weighted({"accuracy": 1.0, "format": 1.0, "steps": 0.5}, {"format": 0.1, "steps": 0.25})
    1.225
    """
    return sum(weights.get(k, 1.0) * v for k, v in parts.items())
