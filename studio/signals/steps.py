"""Reasoning steps and step credit, as pure functions: segmentation, aggregation, gating, step advantages.

- :class:`Segmenter`: steps by delimiter, regex, newline or tag, as character spans;
  :func:`token_spans` maps them onto tokens (the task's own steps come from the store:
  :func:`studio.queries.credit.steps_of`).
- :func:`aggregate` and :func:`gated` turn step rewards into an outcome;
  :func:`step_advantages` normalises them within a group (process supervision).
- :func:`band`: a prompt's difficulty band from its pass rate.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from studio.signals.advantages import EQUAL_TOL

SEGMENTERS = ("task", "delimiter", "regex", "newline", "tag")
AGGREGATES = ("min", "mean", "sum", "last")


@dataclass(frozen=True)
class Segmenter:
    """How a completion splits into steps.

    - ``task`` (default): the task's own steps, as stored with the tokens (the sample
      task: each ``a op b = c`` before a ``;``; the final ``A:`` answer is not a step).
    - ``delimiter``: split at every occurrence of ``pattern`` (default ``;``, the sample
      task's); the delimiter closes its step and is not part of it.
    - ``regex``: split at every match of the regular expression ``pattern``.
    - ``newline``: split at line breaks.
    - ``tag``: each ``<pattern>…</pattern>`` is a step (text outside tags is not).

    Empty or blank steps are dropped; a completion with no delimiter is one step.
    """

    kind: str = "task"
    pattern: str = ";"

    def validate(self) -> None:
        if self.kind not in SEGMENTERS:
            raise ValueError(f"unknown segmentation {self.kind!r}; choose from {', '.join(SEGMENTERS)}")
        if self.kind in ("delimiter", "tag") and not self.pattern:
            raise ValueError(f"a {self.kind} segmentation needs a non-empty pattern")
        if self.kind == "regex":
            try:
                if re.compile(self.pattern).match(""):
                    raise ValueError(f"regex {self.pattern!r} matches the empty string: it would split everywhere")
            except re.error as exc:
                raise ValueError(f"regex {self.pattern!r} does not compile: {exc}") from None

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Character spans ``[start, end)`` of the steps of ``text``.

        >>> Segmenter("delimiter").spans("2+3=5;5*2=10;A:10")
        [(0, 5), (6, 12), (13, 17)]
        >>> Segmenter("delimiter").spans(";;2+3=5;")  # empty steps are dropped
        [(2, 7)]
        >>> Segmenter("tag", "step").spans("<step>a</step> x <step>bc</step>")
        [(6, 7), (23, 25)]
        >>> Segmenter("newline").spans("no line break")  # missing delimiter: one step
        [(0, 13)]
        """
        self.validate()
        if self.kind == "task":
            raise ValueError("task steps come from the store: use steps_of()")
        if self.kind == "tag":
            tag = re.escape(self.pattern)
            raw = [(m.start(1), m.end(1)) for m in re.finditer(f"<{tag}>(.*?)</{tag}>", text, flags=re.S)]
        else:
            sep = {"delimiter": re.escape(self.pattern), "regex": self.pattern, "newline": r"\r?\n"}[self.kind]
            raw, start = [], 0
            for m in re.finditer(sep, text):
                raw.append((start, m.start()))
                start = m.end()
            raw.append((start, len(text)))
        return [(a, b) for a, b in raw if text[a:b].strip()]


def token_spans(token_texts: list[str], char_spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Token index ranges ``(first, last)`` (inclusive) covering each character span.

    Each token belongs to the first step whose characters it overlaps, so a step split
    mid-token (a token holding the end of one step and the start of the next) starts at the
    next token; a step that lies wholly inside one token gets that token. Offsets come from
    the tokens' texts, whose concatenation is the completion.

    >>> token_spans(["2+", "3=5", ";5", "*2"], [(0, 5), (6, 10)])  # ";5" opens step 2
    [(0, 1), (2, 3)]
    >>> token_spans(["2+3", "=5;5", "*2"], [(0, 5), (6, 10)])  # "=5;5" ends step 1: step 2 starts after it
    [(0, 1), (2, 2)]
    >>> token_spans(["ab;cd"], [(0, 2), (3, 5)])  # both steps inside one token
    [(0, 0), (0, 0)]
    """
    starts = np.cumsum([0] + [len(t) for t in token_texts])
    owner: list[int | None] = []
    for i in range(len(token_texts)):
        s, e = starts[i], starts[i + 1]
        owner.append(next((k for k, (a, b) in enumerate(char_spans) if s < b and a < e), None))
    out = []
    for k, (a, b) in enumerate(char_spans):
        mine = [i for i, o in enumerate(owner) if o == k]
        if not mine:  # wholly inside a token that an earlier step owns
            mine = [next((i for i in range(len(token_texts)) if starts[i] < b and a < starts[i + 1]),
                         max(len(token_texts) - 1, 0))]
        out.append((int(mine[0]), int(mine[-1])))
    return out


def aggregate(values: np.ndarray, how: str = "min") -> float | None:
    """Step rewards to one outcome: ``min`` (a chain is as good as its worst step, the PRM
    convention), ``mean``, ``sum`` or ``last``. None for no steps.

    >>> aggregate([1.0, 0.0, 1.0], "min"), aggregate([1.0, 0.0, 1.0], "mean"), aggregate([1, 0, 1], "last")
    (0.0, 0.6666666666666666, 1.0)
    """
    v = np.asarray(values, dtype=np.float64)
    if how not in AGGREGATES:
        raise ValueError(f"unknown aggregation {how!r}; choose from {', '.join(AGGREGATES)}")
    if v.size == 0:
        return None
    return float({"min": v.min, "mean": v.mean, "sum": v.sum, "last": lambda: v[-1]}[how]())


def gated(outcome: float, step_values, tau: float) -> float:
    """Gated reward accumulation (G-RA): R = R_out + 1[R_out >= τ]·Σ_k r_k — step rewards
    count only when the outcome reaches τ, so they cannot be farmed by a failing chain.

    >>> gated(1.0, [0.2, 0.3], tau=1.0), gated(0.0, [0.2, 0.3], tau=1.0)
    (1.5, 0.0)
    """
    return float(outcome) + (float(np.sum(step_values)) if outcome >= tau else 0.0)


def step_advantages(step_values: list[np.ndarray], eps: float = 1e-4) -> list[np.ndarray]:
    """Step-level advantages normalised within a group (DeepSeekMath process supervision):
    every step reward of the group's completions is normalised by the mean and std of all of
    them, r̃ = (r - mean) / (std + eps); a token's advantage is the sum of r̃ over its step
    and the steps after it. Returns each completion's per-step advantage (that suffix sum).
    All-equal step rewards give 0.

    >>> # all four: mean 0.75, std 0.5, so r̃ = 0.5 for a 1 and -1.5 for a 0; then suffix sums
    >>> [a.round(3).tolist() for a in step_advantages([np.array([1.0, 0.0]), np.array([1.0, 1.0])])]
    [[-1.0, -1.5], [1.0, 0.5]]
    """
    allv = np.concatenate([np.asarray(v, dtype=np.float64) for v in step_values]) if step_values else np.array([])
    if allv.size < 2 or np.ptp(allv) <= EQUAL_TOL:
        return [np.zeros(len(v)) for v in step_values]
    mu, sd = allv.mean(), allv.std(ddof=1)
    return [np.cumsum(((np.asarray(v, dtype=np.float64) - mu) / (sd + eps))[::-1])[::-1] for v in step_values]


def band(pass_rate: float) -> str:
    """Difficulty band of a prompt by its pass rate.

    >>> band(0.0), band(0.2), band(0.5), band(0.9), band(1.0)
    ('never solved', 'hard', 'medium', 'easy', 'always solved')
    """
    if pass_rate <= 0.0:
        return "never solved"
    if pass_rate >= 1.0:
        return "always solved"
    return "hard" if pass_rate < 0.35 else "medium" if pass_rate < 0.65 else "easy"
