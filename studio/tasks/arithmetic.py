"""Step-by-step arithmetic: the sample task that makes every signal visible on a CPU.

``Q: 23+48-7=`` is answered ``23+48=71;71-7=64;A:64``: one step per operator, evaluated
left to right, then the final answer. Every step is checkable (step rewards) and so is the
answer (outcome reward); a tiny policy errs at carries and signs (entropy forks).
"""
from __future__ import annotations

import random
import re

from .base import ParsedCompletion, Prompt, Step, Task, TaskParseError, register_task

# difficulty -> (min operands, max operands, max digits per operand)
DIFFICULTIES: dict[str, tuple[int, int, int]] = {
    "easy": (2, 2, 2),
    "medium": (2, 3, 2),
    "hard": (3, 4, 2),
}

_PROMPT_RE = re.compile(r"^\s*(?:Q:\s*)?(\d+(?:\s*[+\-]\s*\d+)+)\s*=?\s*$")
_STEP_RE = re.compile(r"^(-?\d+)([+\-])(\d+)=(-?\d+)$")
_ANSWER_RE = re.compile(r"^A:(-?\d+)$")


def solve(operands: list[int], ops: list[str]) -> list[tuple[int, str, int, int]]:
    """Left-to-right evaluation as a list of ``(a, op, b, result)`` steps.

    >>> solve([23, 48, 7], ["+", "-"])
    [(23, '+', 48, 71), (71, '-', 7, 64)]
    """
    steps, acc = [], operands[0]
    for op, b in zip(ops, operands[1:]):
        res = acc + b if op == "+" else acc - b
        steps.append((acc, op, b, res))
        acc = res
    return steps


def format_solution(operands: list[int], ops: list[str]) -> str:
    """The reference completion for a prompt.

    >>> format_solution([23, 48, 7], ["+", "-"])
    '23+48=71;71-7=64;A:64'
    """
    steps = solve(operands, ops)
    body = ";".join(f"{a}{op}{b}={r}" for a, op, b, r in steps)
    return f"{body};A:{steps[-1][3]}"


def _prompt(operands: list[int], ops: list[str]) -> Prompt:
    expr = str(operands[0]) + "".join(f"{op}{b}" for op, b in zip(ops, operands[1:]))
    answer = solve(operands, ops)[-1][3]
    return Prompt(
        text=f"Q: {expr}=",
        gold={"answer": str(answer), "solution": format_solution(operands, ops)},
        meta={"operands": operands, "ops": ops, "n_steps": len(ops)},
    )


@register_task
class Arithmetic(Task):
    """Multi-step addition and subtraction of small integers, answered step by step."""

    name = "arithmetic"
    description = "Step-by-step arithmetic: `Q: 23+48-7=` -> `23+48=71;71-7=64;A:64`"

    def make_prompts(self, n: int, seed: int = 0, difficulty: str = "medium") -> list[Prompt]:
        if difficulty not in DIFFICULTIES:
            raise ValueError(f"difficulty must be one of {sorted(DIFFICULTIES)}, got {difficulty!r}")
        lo, hi, digits = DIFFICULTIES[difficulty]
        rng = random.Random(seed)
        out = []
        for _ in range(n):
            k = rng.randint(lo, hi)
            operands = [rng.randint(0, 10**digits - 1) for _ in range(k)]
            ops = [rng.choice("+-") for _ in range(k - 1)]
            out.append(_prompt(operands, ops))
        return out

    def parse_prompt(self, text: str) -> Prompt:
        m = _PROMPT_RE.match(text)
        if not m:
            raise TaskParseError(
                f"cannot read {text!r} as an arithmetic prompt: expected integers joined by "
                "+ or -, like 'Q: 23+48-7=' or '23+48-7'"
            )
        expr = re.sub(r"\s+", "", m.group(1))
        operands = [int(x) for x in re.findall(r"\d+", expr)]
        ops = re.findall(r"[+\-]", expr)
        if any(x > 999 for x in operands) or len(operands) > 6:
            raise TaskParseError(
                f"{text!r} is outside the sample task's range: at most 6 operands of at most 3 digits"
            )
        return _prompt(operands, ops)

    def parse_completion(self, prompt: Prompt, completion: str) -> ParsedCompletion:
        steps: list[Step] = []
        answer = None
        well_formed = True
        pos = 0
        parts = completion.split(";")
        for i, part in enumerate(parts):
            start, end = pos, pos + len(part)
            pos = end + 1
            if i == len(parts) - 1:
                m = _ANSWER_RE.match(part)
                if m:
                    answer = m.group(1)
                else:
                    well_formed = False
                    if part:
                        steps.append(Step(part, start, end, _check_step(part)))
                continue
            correct = _check_step(part)
            if correct is None:
                well_formed = False
            steps.append(Step(part, start, end, correct))
        if not steps:
            well_formed = False
        return ParsedCompletion(steps=tuple(steps), answer=answer, well_formed=well_formed)

    def answer_text(self, answer: str) -> str:
        return f"A:{answer}"

    def is_correct(self, prompt: Prompt, answer: str | None) -> bool:
        """Integer equality, so ``A:064`` and ``A:-0`` are read as 64 and 0."""
        try:
            return answer is not None and int(answer) == int(prompt.gold["answer"])
        except ValueError:
            return False


def _check_step(text: str) -> bool | None:
    """``True``/``False`` for a well-formed ``a op b = c`` step, ``None`` otherwise.

    >>> _check_step("23+48=71"), _check_step("71-7=65"), _check_step("7=")
    (True, False, None)
    """
    m = _STEP_RE.match(text)
    if not m:
        return None
    a, op, b, c = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
    return (a + b if op == "+" else a - b) == c
