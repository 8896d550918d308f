r"""Final answers: where a completion states one, and whether it equals the gold one.

Extractors read the answer the way the data sets and papers write it::

    >>> extract("<think>48/2=24</think>\n\\boxed{72}")
    '72'
    >>> extract("She sold 48 + 24 = 72 clips.\n#### 72"), extract("Answer: 3/4")
    ('72', '3/4')
    >>> extract("so x = \\boxed{\\frac{1}{2}} and not \\boxed{2}", "boxed")
    '2'
    >>> extract("The total is 12 apples, then 3 more: 15", "last_number")
    '15'
    >>> extract("<think>maybe 4</think> It is 5.", "after_think"), extract("no number here")
    ('It is 5.', None)
    >>> extract("result=[17]", "regex", r"\[(\d+)\]")
    '17'

:func:`equivalent` verifies with math-verify, as math-reasoning papers do:

    >>> equivalent("\\frac{1}{2}", "0.5"), equivalent("72 clips", "72"), equivalent("71", "72")
    (True, True, False)

Light on imports: the sandbox's and mini-run's workers call these.
"""
from __future__ import annotations

import re

# how -> what it reads; "auto" tries them in this order
EXTRACTORS = {
    "auto": "the last \\boxed{…}, else '#### n', else 'Answer: …', else the last number after </think>",
    "boxed": "the last \\boxed{…} (nested braces read whole)",
    "hash": "the text after the last '####' (GSM8K's reference format)",
    "answer_colon": "the text after the last 'Answer:' or 'A:' on its line",
    "last_number": "the last number in the completion",
    "after_think": "everything after the last </think> (the whole text when there is none)",
    "regex": "the first group of a custom regular expression (its last match)",
}

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")
_HASH = re.compile(r"####\s*([^\n]+)")
_ANSWER = re.compile(r"(?:^|\n|\s)(?:Answer|ANSWER|answer|A)\s*:\s*([^\n]+)")


class AnswerSettingError(ValueError):
    """An extractor name or a custom regular expression that cannot be used."""


def check_extractor(how: str, regex: str | None = None) -> None:
    """Raise :class:`AnswerSettingError` for an unknown extractor or a bad regular expression."""
    if how not in EXTRACTORS:
        raise AnswerSettingError(f"unknown answer extractor {how!r}; known: {', '.join(EXTRACTORS)}")
    if how == "regex":
        if not regex:
            raise AnswerSettingError("the 'regex' answer extractor needs a regular expression")
        try:
            pattern = re.compile(regex)
        except re.error as exc:
            raise AnswerSettingError(f"answer regex {regex!r} does not compile: {exc}") from None
        if pattern.groups < 1:
            raise AnswerSettingError(f"answer regex {regex!r} needs a group around the answer, like '(\\d+)'")


def last_boxed(text: str) -> str | None:
    r"""The content of the last ``\boxed{…}`` (or ``\fbox{…}``), nested braces included.

    >>> last_boxed("\\boxed{1} then \\boxed{\\frac{3}{4}}"), last_boxed("\\boxed{unclosed")
    ('\\frac{3}{4}', None)
    """
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return None


def after_think(text: str) -> str:
    """The part of a completion after its reasoning block (all of it when there is none)."""
    k = text.rfind("</think>")
    return text[k + len("</think>"):].strip() if k >= 0 else text.strip()


def last_number(text: str) -> str | None:
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


def extract(text: str | None, how: str = "auto", regex: str | None = None) -> str | None:
    """The final answer ``text`` states, read by extractor ``how`` (see :data:`EXTRACTORS`);
    ``None`` when it states none."""
    if not text:
        return None
    if how == "boxed":
        return last_boxed(text)
    if how == "hash":
        found = _HASH.findall(text)
        return found[-1].strip() if found else None
    if how == "answer_colon":
        found = _ANSWER.findall(text)
        return found[-1].strip() if found else None
    if how == "last_number":
        return last_number(text)
    if how == "after_think":
        return after_think(text) or None
    if how == "regex":
        check_extractor(how, regex)
        found = list(re.finditer(regex, text))
        return found[-1].group(1).strip() if found else None
    if how != "auto":
        check_extractor(how)
    for way in ("boxed", "hash", "answer_colon"):
        found = extract(text, way)
        if found:
            return found
    return last_number(after_think(text))


def gold_answer(reference: str, how: str = "auto") -> str | None:
    r"""The gold answer of a reference solution: GSM8K's ``#### 72`` or MATH's last ``\boxed{}``,
    else the reference itself when it is short (a bare answer column).

    >>> gold_answer("48/2 = <<48/2=24>>24\n#### 72"), gold_answer("so $\\boxed{\\frac12}$"), gold_answer("7")
    ('72', '\\frac12', '7')
    """
    if reference is None:
        return None
    text = str(reference).strip()
    found = extract(text, how) if how != "auto" else (extract(text, "hash") or last_boxed(text))
    if found:
        return found
    return text if text and len(text) <= 64 and "\n" not in text else None


def _latex(x) -> str:
    s = str(x).strip()
    if "$" in s or "\\boxed" in s:
        return s
    if "\\" not in s and re.search(r"[A-Za-z]{2,}", s):
        return s  # free text ("72 clips"): math-verify finds the answer in it, as it is
    return f"${s}$"  # plain math ("x^2+1", "2\\sqrt{2}") is read as LaTeX


def equivalent(answer, gold) -> bool:
    r"""Whether math-verify judges ``answer`` equal to ``gold`` (``\frac{1}{2}`` = ``0.5``,
    ``72 clips`` = ``72``, ``2\sqrt{2}`` = ``\sqrt{8}``). math-verify's own signal timeouts
    are off: the caller's limits govern (the sandbox's per-call timer)."""
    if answer is None or gold is None or not str(answer).strip() or not str(gold).strip():
        return False
    a, g = str(answer).strip(), str(gold).strip()
    if a.replace(",", "") == g.replace(",", ""):
        return True
    import logging

    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout disabled" is on purpose
    pg, pa = parse(_latex(g), parsing_timeout=None), parse(_latex(a), parsing_timeout=None)
    return bool(pg and pa and verify(pg, pa, timeout_seconds=None))
