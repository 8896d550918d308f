r"""The sample agent world's task: word problems with numbers too big to do in one's head, and a calculator.

``calculator_agent`` asks a word problem that takes two to four exact integer operations on
two- and three-digit numbers (37 crates of 24 pens, 888 - 129, 759 / 3). A policy calls the
calculator inside its assistant message, reads the response the environment appends, and ends
with ``\boxed{n}``::

    <tool_call>{"name": "calculator", "arguments": {"expression": "37*24"}}</tool_call>
    <tool_response>888</tool_response>
    <tool_call>{"name": "calculator", "arguments": {"expression": "888-129"}}</tool_call>
    <tool_response>759</tool_response>\boxed{759}

Everything the studio needs to know about the format is here: :attr:`CalculatorAgent.call_end`,
:meth:`~CalculatorAgent.parse_call`, :attr:`~CalculatorAgent.tools` and
:meth:`~CalculatorAgent.format_response` (``studio.workers.agent_env`` only calls them). A step
(the step view) is one tool call with its response, right when the call's value is one of the
gold solution's intermediate results::

    >>> t = CalculatorAgent()
    >>> p = t.make_prompts(1, seed=3)[0]
    >>> len(p.messages), p.messages[0]["role"], 2 <= len(p.gold["steps"]) <= 3
    (1, 'user', True)
    >>> c = "".join(solution_turns(p.gold["steps"]))
    >>> t.verdict(p, c) == (p.gold["answer"], True), [s.correct for s in t.parse_completion(p, c).steps][:1]
    (True, [True])
"""
from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any, ClassVar

from .answers import last_boxed
from .base import ParsedCompletion, Prompt, Step, Task, TaskParseError, register_task
from .calculator import calculator
from .text import answer_span
from .tool_calls import CALL_END, CALL_OPEN, RESPONSE_END, RESPONSE_OPEN, call_text, format_response, parse_call

# difficulty -> (fewest, most) operations of a problem
DIFFICULTIES: dict[str, tuple[int, int]] = {"easy": (2, 2), "medium": (2, 3), "hard": (3, 4)}
NAMES = ["Natalia", "Tom", "Aisha", "Carlos", "Mei", "Omar", "Priya", "Liam", "Sofia", "Kenji", "Grace",
         "Mateo", "Fatima", "Ben", "Chloe", "Yusuf", "Hannah", "Diego", "Lena", "Noah", "Rosa", "Ivan"]
_CALL = re.compile(re.escape(CALL_OPEN) + r"(.*?)" + re.escape(CALL_END) + r"(?:" + re.escape(RESPONSE_OPEN)
                   + r"(.*?)" + re.escape(RESPONSE_END) + r")?", re.S)

Op = tuple[int, str, int]  # a op b, evaluated exactly
Story = tuple[list[str], str, list[Op]]  # the facts, the question, the operations in solution order


def apply(a: int, op: str, b: int) -> int:
    """``a op b`` exactly (a division leaves no remainder in a generated problem)."""
    return {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]


def _more(rng: random.Random) -> bool:
    return rng.random() < 0.5


def _crates(rng: random.Random) -> Story:
    item = rng.choice(["pens", "bottles", "light bulbs", "jars of jam", "tennis balls"])
    crates, per = rng.randint(12, 89), rng.randint(12, 48)
    have = crates * per
    ops: list[Op] = [(crates, "*", per)]
    facts = [f"A warehouse has {crates} crates with {per} {item} in each crate."]
    if _more(rng):
        size = rng.randint(6, 24)
        left = rng.randint(have // (2 * size), have // size - 1) * size
        facts.append(f"It ships {have - left} {item} to shops and packs the rest into boxes of {size}.")
        return facts, "How many boxes does it fill?", ops + [(have, "-", have - left), (left, "/", size)]
    shipped = rng.randint(101, have - 1)
    facts.append(f"It ships {shipped} {item} to shops.")
    return facts, f"How many {item} are left in the warehouse?", ops + [(have, "-", shipped)]


def _shopping(rng: random.Random) -> Story:
    name = rng.choice(NAMES)
    (x, y) = rng.sample(["notebooks", "chairs", "lamps", "backpacks", "jackets", "helmets", "clocks"], 2)
    na, pa, nb, pb = rng.randint(12, 60), rng.randint(11, 99), rng.randint(12, 60), rng.randint(11, 99)
    a, b = na * pa, nb * pb
    facts = [f"A school buys {na} {x} at ${pa} each and {nb} {y} at ${pb} each."]
    ops: list[Op] = [(na, "*", pa), (nb, "*", pb), (a, "+", b)]
    if _more(rng):
        budget = (a + b) // 1000 * 1000 + 1000
        facts.append(f"{name} pays from a budget of ${budget}.")
        return facts, "How many dollars of the budget are left?", ops + [(budget, "-", a + b)]
    return facts, "How many dollars does the school spend?", ops


def _travel(rng: random.Random) -> Story:
    vehicle = rng.choice(["A train", "A truck", "A ferry", "A bus"])
    speed, hours, extra = rng.randint(41, 95), rng.randint(3, 14), rng.randint(102, 480)
    gone = speed * hours + extra
    facts = [f"{vehicle} travels at {speed} km per hour for {hours} hours, then {extra} km more."]
    ops: list[Op] = [(speed, "*", hours), (speed * hours, "+", extra)]
    if _more(rng):
        trip = gone + rng.randint(105, 950)
        facts.insert(0, f"{vehicle} is on a {trip} km journey.")
        return facts, "How many km of the journey are left?", ops + [(trip, "-", gone)]
    return facts, "How many km does it travel in all?", ops


def _school(rng: random.Random) -> Story:
    classes, size = rng.randint(12, 48), rng.randint(21, 39)
    students = classes * size
    facts = [f"A school has {classes} classes with {size} students in each class."]
    ops: list[Op] = [(classes, "*", size)]
    if _more(rng):
        row = rng.randint(12, 30)
        stay = rng.randint(students // (2 * row), students // row - 1) * row
        facts.append(f"{students - stay} students go on a trip; the others sit in the hall in rows of {row}.")
        return facts, "How many rows do they fill?", ops + [(students, "-", students - stay), (stay, "/", row)]
    absent = rng.randint(12, 99)
    facts.append(f"On Monday {absent} students are absent.")
    return facts, "How many students are at school on Monday?", ops + [(students, "-", absent)]


def _orchard(rng: random.Random) -> Story:
    name = rng.choice(NAMES)
    rows, per, fruit = rng.randint(12, 40), rng.randint(12, 30), rng.randint(14, 60)
    trees = rows * per
    facts = [f"{name}'s orchard has {rows} rows of apple trees with {per} trees in each row.",
             f"Each tree gives {fruit} apples."]
    ops: list[Op] = [(rows, "*", per), (trees, "*", fruit)]
    if _more(rng):
        sold = rng.randint(1000, trees * fruit - 1)
        facts.append(f"{name} sells {sold} apples at the market.")
        return facts, f"How many apples does {name} have left?", ops + [(trees * fruit, "-", sold)]
    return facts, f"How many apples does {name} pick in all?", ops


def _factory(rng: random.Random) -> Story:
    item = rng.choice(["toys", "phone cases", "bricks", "mugs", "shoes"])
    rate, hours = rng.randint(25, 99), rng.randint(6, 24)
    made = rate * hours
    carton = rng.randint(8, 24)
    good = rng.randint(made // (2 * carton), made // carton - 1) * carton
    faulty = made - good
    facts = [f"A factory makes {rate} {item} an hour for {hours} hours.", f"{faulty} of the {item} are faulty."]
    ops: list[Op] = [(rate, "*", hours), (made, "-", faulty)]
    if _more(rng):
        facts.append(f"The good {item} are packed in cartons of {carton}.")
        return facts, "How many cartons are packed?", ops + [(good, "/", carton)]
    return facts, f"How many good {item} does the factory make?", ops


def _savings(rng: random.Random) -> Story:
    name = rng.choice(NAMES)
    weekly, weeks, start = rng.randint(15, 95), rng.randint(12, 52), rng.randint(105, 900)
    total = weekly * weeks + start
    facts = [f"{name} has ${start} in the bank and saves ${weekly} every week for {weeks} weeks."]
    ops: list[Op] = [(weekly, "*", weeks), (weekly * weeks, "+", start)]
    if _more(rng):
        cost = rng.randint(total // 3, total - 1)
        facts.append(f"Then {name} buys a bike for ${cost}.")
        return facts, f"How many dollars does {name} have left?", ops + [(total, "-", cost)]
    return facts, f"How many dollars does {name} have after {weeks} weeks?", ops


def _concert(rng: random.Random) -> Story:
    adults, pa, kids, pk = rng.randint(120, 900), rng.randint(12, 45), rng.randint(105, 600), rng.randint(5, 19)
    a, b = adults * pa, kids * pk
    facts = [f"A concert sells {adults} adult tickets at ${pa} and {kids} child tickets at ${pk}."]
    ops: list[Op] = [(adults, "*", pa), (kids, "*", pk), (a, "+", b)]
    if _more(rng):
        costs = rng.randint(1000, a + b - 1)
        facts.append(f"The band's costs are ${costs}.")
        return facts, "How many dollars of profit does the concert make?", ops + [(a + b, "-", costs)]
    return facts, "How many dollars do the tickets bring in?", ops


def _library(rng: random.Random) -> Story:
    shelves, per, new = rng.randint(14, 60), rng.randint(25, 80), rng.randint(105, 700)
    books = shelves * per + new
    facts = [f"A library has {shelves} shelves with {per} books on each shelf.", f"It gets {new} new books."]
    ops: list[Op] = [(shelves, "*", per), (shelves * per, "+", new)]
    if _more(rng):
        carts = next((k for k in rng.sample(range(12, 40), 28) if books % k == 0), None)
        if carts:
            facts.append(f"All the books are moved onto {carts} carts with the same number on each cart.")
            return facts, "How many books are on each cart?", ops + [(books, "/", carts)]
    return facts, "How many books does the library have now?", ops


def _bakery(rng: random.Random) -> Story:
    name = rng.choice(NAMES)
    trays, per, boxes, box = rng.randint(12, 40), rng.randint(12, 36), rng.randint(12, 30), rng.randint(6, 12)
    made, sold = trays * per, boxes * box
    if sold >= made:
        return _bakery(rng)
    facts = [f"{name}'s bakery makes {trays} trays of {per} cookies.", f"It sells {boxes} boxes of {box} cookies."]
    ops: list[Op] = [(trays, "*", per), (boxes, "*", box), (made, "-", sold)]
    if _more(rng):
        jar = next((k for k in rng.sample(range(3, 13), 10) if (made - sold) % k == 0), None)
        if jar:
            facts.append(f"The rest go into jars of {jar}.")
            return facts, "How many jars are filled?", ops + [(made - sold, "/", jar)]
    return facts, "How many cookies are left?", ops


SCENARIOS: list[Callable[[random.Random], Story]] = [
    _crates, _shopping, _travel, _school, _orchard, _factory, _savings, _concert, _library, _bakery]


def make_problem(rng: random.Random, fewest: int = 2, most: int = 4) -> Prompt:
    """One problem of ``fewest`` to ``most`` operations (drawn again until it fits)."""
    while True:
        facts, question, ops = rng.choice(SCENARIOS)(rng)
        if fewest <= len(ops) <= most:
            break
    steps = [[a, op, b, apply(a, op, b)] for a, op, b in ops]
    text = " ".join(facts + [question])
    return Prompt(text=text, gold={"answer": str(steps[-1][3]), "steps": steps},
                  meta={"n_steps": len(steps)}, messages=({"role": "user", "content": text},))


def expression(a: int, op: str, b: int) -> str:
    """How the expert writes one operation for the calculator.

    >>> expression(37, "*", 24)
    '37*24'
    """
    return f"{a}{op}{b}"


def solution_turns(steps: list[list]) -> list[str]:
    """The texts of a correct trajectory, in order: call, response, …, the boxed answer."""
    out = []
    for a, op, b, r in steps:
        out += [call_text("calculator", {"expression": expression(a, op, b)}), format_response(r)]
    return out + [f"\\boxed{{{steps[-1][3]}}}"]


@register_task
class CalculatorAgent(Task):
    """Word problems solved by calling a calculator tool, answered ``\\boxed{n}``."""

    name = "calculator_agent"
    description = ("Agent word problems with a calculator tool: <tool_call>{\"name\": \"calculator\", …}</tool_call>, "
                   "<tool_response>…</tool_response>, then \\boxed{n}")
    call_end: ClassVar[str] = CALL_END  # sampling pauses after it and the environment answers
    tools: ClassVar[dict[str, Callable]] = {"calculator": calculator}

    def make_prompts(self, n: int, seed: int = 0, difficulty: str = "medium") -> list[Prompt]:
        if difficulty not in DIFFICULTIES:
            raise ValueError(f"difficulty must be one of {sorted(DIFFICULTIES)}, got {difficulty!r}")
        rng = random.Random(seed)
        return [make_problem(rng, *DIFFICULTIES[difficulty]) for _ in range(n)]

    def parse_prompt(self, text: str) -> Prompt:
        """A typed word problem: asked as it is, with no gold answer to check."""
        if not text.strip():
            raise TaskParseError("an empty prompt: type a word problem")
        return Prompt(text=text, gold={"answer": None}, messages=({"role": "user", "content": text},))

    def parse_call(self, text: str) -> tuple[str, str, dict[str, Any]]:
        """The last tool call of an assistant turn: ``(name, arguments JSON, arguments)``;
        :class:`~studio.tasks.tool_calls.ToolCallError` names what is wrong with it."""
        return parse_call(text, self.tools)

    def format_response(self, result: object = None, error: str | BaseException | None = None) -> str:
        """The tool turn's text the policy reads: ``<tool_response>888</tool_response>``, or ``error: …``."""
        return format_response(result, error)

    def parse_completion(self, prompt: Prompt, completion: str) -> ParsedCompletion:
        """Steps by tool call (a call and its response); the answer is the last ``\\boxed{}``
        after the last tool response (a tool's text never states it)."""
        results = {s[3] for s in prompt.gold.get("steps") or []}
        steps, tail = [], 0
        for m in _CALL.finditer(completion):
            steps.append(Step(m.group(0), m.start(), m.end(), _step_correct(m.group(1), results)))
            tail = m.end()
        answer = last_boxed(completion[tail:])
        return ParsedCompletion(steps=tuple(steps), answer=answer, well_formed=answer is not None,
                                answer_span=answer_span(completion, answer))

    def is_correct(self, prompt: Prompt, answer: str | None) -> bool:
        """Integer equality with the gold answer (``0759`` reads as 759)."""
        try:
            return answer is not None and int(answer.replace(",", "")) == int(prompt.gold["answer"])
        except ValueError:
            return False

    def answer_text(self, answer: str) -> str:
        return f"\\boxed{{{answer}}}"


def _step_correct(call: str, results: set[int]) -> bool | None:
    """A call is right when the calculator gives one of the gold intermediate results; ``None``
    when the problem has no gold solution (a typed prompt)."""
    if not results:
        return None
    try:
        _, _, args = parse_call(CALL_OPEN + call + CALL_END, CalculatorAgent.tools)
        return calculator(**args) in results
    except ValueError:
        return False
