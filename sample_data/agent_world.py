r"""The sample agent world's training data: expert trajectories on ``calculator_agent``, with realistic slips.

A trajectory is the assistant's message as segments, in order: an assistant segment (a tool
call), the tool's response (the environment's text: masked in training, as in the agent
loop), …, and the last assistant segment, ``\boxed{n}``. The expert solves a problem one
operation per call, copying numbers from the question and from earlier responses (the gold
steps of :func:`studio.tasks.agent.make_problem`). A share of them slip the way small agents do,
so the policy trained on them (``sample_data.build_agent_policy``) fails in those ways too:

- ``misread``: a wrong argument, one operand copied with a digit changed, swapped or dropped;
  the later calls carry the wrong value on (answer wrong);
- ``wrong_op``: a call with the wrong operation (answer wrong);
- ``ignore``: the final answer ignores the last result (an earlier result, or a miscopy of it);
- ``repeat``: one call made twice (too many calls; the answer is still right);
- ``bad_json``: a call that is not valid JSON, answered with an error, then made right.

    >>> import random
    >>> from studio.tasks.agent import make_problem
    >>> p = make_problem(random.Random(0), 2, 2)
    >>> segs, kind = expert(p, random.Random(1), noise={"clean": 1.0})
    >>> kind, [role for role, _ in segs]
    ('clean', ['assistant', 'tool', 'assistant', 'tool', 'assistant'])
"""
from __future__ import annotations

import random

from studio.tasks.agent import CalculatorAgent, expression, make_problem
from studio.tasks.base import Prompt
from studio.tasks.calculator import calculator
from studio.tasks.tool_calls import CALL_END, call_text
from studio.workers.agent_env import TaskEnv

# kind of trajectory -> its share of the training data
NOISE: dict[str, float] = {"clean": 0.66, "misread": 0.10, "wrong_op": 0.04, "ignore": 0.06, "repeat": 0.08,
                           "bad_json": 0.06}
TEST_SEED = 2  # held-out prompts: CalculatorAgent().make_prompts(n, seed=TEST_SEED, difficulty="medium" / "hard")
POOL = 1000  # held-out prompts kept out of training (:func:`heldout` of this size)
TASK = CalculatorAgent()
ENV = TaskEnv(TASK)  # tools run in this process: the calculator is trusted
Segment = tuple[str, str]  # (role, text): "assistant" (trained) or "tool" (masked)


def misread(n: int, rng: random.Random) -> int:
    """``n`` with one slip of copying: a digit changed, two neighbours swapped, one dropped or doubled.

    >>> misread(888, random.Random(0)) != 888
    True
    """
    s = str(n)
    while True:
        i = rng.randrange(len(s))
        how = rng.choice(["change", "swap", "drop", "double"])
        if how == "change":
            t = s[:i] + rng.choice([d for d in "0123456789" if d != s[i]]) + s[i + 1:]
        elif how == "swap" and i + 1 < len(s):
            t = s[:i] + s[i + 1] + s[i] + s[i + 2:]
        elif how == "drop" and len(s) > 2:
            t = s[:i] + s[i + 1:]
        else:
            t = s[:i] + s[i] + s[i:]
        if t != s and t[0] != "0":
            return int(t)


def _bad_json(expr: str, rng: random.Random) -> str:
    """A calculator call a small model gets wrong: the closing brace lost, or the expression unquoted."""
    good = call_text("calculator", {"expression": expr})
    if rng.random() < 0.5:
        return good.replace("}}" + CALL_END, "}" + CALL_END)
    return good.replace(f'"{expr}"', expr)


def _calls(steps: list[list], kind: str, rng: random.Random) -> list[tuple[int, str, int]] | None:
    """The operations the expert actually makes for ``kind``: gold operands, the results it got
    carried on; ``None`` when the slip would make a call fail (the draw is made again)."""
    at = rng.randrange(len(steps))
    gold_results = [s[3] for s in steps]
    got: dict[int, int] = {}  # gold result -> the result the expert got for it
    out = []
    for i, (a, op, b, _) in enumerate(steps):
        a, b = got.get(a, a), got.get(b, b)
        if i == at and kind == "misread":
            if rng.random() < 0.5:
                a = misread(a, rng)
            else:
                b = misread(b, rng)
        if i == at and kind == "wrong_op":
            if op == "/":
                return None
            op = {"+": "-", "-": "+", "*": "+"}[op]
        try:
            got[gold_results[i]] = calculator(expression(a, op, b))
        except ValueError:
            return None
        out.append((a, op, b))
    return out


def expert(prompt: Prompt, rng: random.Random, noise: dict[str, float] = NOISE) -> tuple[list[Segment], str]:
    """One trajectory of the expert on ``prompt`` (``gold["steps"]``) and its kind (a key of ``noise``)."""
    steps = prompt.gold["steps"]
    while True:
        kind = rng.choices(list(noise), weights=list(noise.values()))[0]
        calls = _calls(steps, kind, rng)
        if calls is not None:
            break
    at = rng.randrange(len(calls))
    segs: list[Segment] = []
    results = []
    for i, (a, op, b) in enumerate(calls):
        expr = expression(a, op, b)
        if i == at and kind == "bad_json":
            bad = _bad_json(expr, rng)
            segs += [("assistant", bad), ("tool", reply(bad))]
        call = call_text("calculator", {"expression": expr})
        for _ in range(2 if (i == at and kind == "repeat") else 1):
            segs += [("assistant", call), ("tool", reply(call))]
        results.append(calculator(expr))
    answer = results[-1]
    if kind == "ignore":
        answer = results[-2] if len(results) > 1 and rng.random() < 0.5 else misread(results[-1], rng)
    segs.append(("assistant", f"\\boxed{{{answer}}}"))
    return _merged(segs), kind


def reply(call: str) -> str:
    """What the agent loop's environment appends after ``call``: the calculator's result, or the error."""
    return ENV.reply(0, call).text


def _merged(segs: list[Segment]) -> list[Segment]:
    """Neighbouring segments of one role joined (an assistant's calls with no response between)."""
    out: list[Segment] = []
    for role, text in segs:
        if out and out[-1][0] == role:
            out[-1] = (role, out[-1][1] + text)
        else:
            out.append((role, text))
    return out


def text_of(segs: list[Segment]) -> str:
    """The whole assistant message (what the studio stores as the completion, tool responses included)."""
    return "".join(t for _, t in segs)


def heldout(n: int) -> list[Prompt]:
    """Held-out prompts (never trained on), as the policy's build evaluates on them: the first
    ``n - n // 2`` medium problems (2-3 operations) of seed :data:`TEST_SEED`, then its first
    ``n // 2`` hard ones (3-4); both streams share the seed, so a 3-operation problem can be in both."""
    return TASK.make_prompts(n - n // 2, seed=TEST_SEED, difficulty="medium") + \
        TASK.make_prompts(n // 2, seed=TEST_SEED, difficulty="hard")


def distinct_heldout(n: int) -> list[Prompt]:
    """``n`` different held-out problems, half medium and half hard, from :func:`heldout`'s pool
    (the sample trajectories and the tests ask each once)."""
    pool = heldout(POOL)
    medium, hard = pool[:POOL - POOL // 2], pool[POOL - POOL // 2:]
    out = medium[:n - n // 2]
    seen = {p.text for p in out}
    out += [p for p in hard if p.text not in seen][:n // 2]
    if len(out) < n:
        raise ValueError(f"the held-out pool has fewer than {n} different problems")
    return out


def training_problems(rng: random.Random, exclude: set[str]):
    """An endless stream of training problems (2 to 4 operations), none of them held out."""
    while True:
        p = make_problem(rng, 2, 4)
        if p.text not in exclude:
            yield p


def corpus(n: int, seed: int = 0) -> list[str]:
    """Questions and trajectories the tokenizer is trained on."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p = make_problem(rng, 2, 4)
        out += [p.text] + [t for _, t in expert(p, rng)[0]]
    return out

