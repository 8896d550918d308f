"""Final answers: every extractor on literal cases, math-verify equivalence, free-text parsing."""
from __future__ import annotations

import pytest

from studio.tasks import Prompt, get_task
from studio.tasks.answers import AnswerSettingError, check_extractor, equivalent, extract, gold_answer
from studio.tasks.text import is_templated, segments


@pytest.mark.parametrize(("text", "how", "expected"), [
    ("<think>\n48 / 2 = 24\n</think>\n\\boxed{72}", "auto", "72"),
    ("so \\boxed{\\frac{1}{2}}", "auto", "\\frac{1}{2}"),
    ("first \\boxed{3}, then \\boxed{4}", "boxed", "4"),
    ("\\boxed{{nested} braces}", "boxed", "{nested} braces"),
    ("\\boxed{never closed", "boxed", None),
    ("Natalia sold 48 + 24 = 72 clips.\n#### 72", "auto", "72"),
    ("#### 1,234", "hash", "1,234"),
    ("no hash here", "hash", None),
    ("Answer: 3/4", "auto", "3/4"),
    ("The answer is below.\nA: -5", "answer_colon", "-5"),
    ("12 apples, then 3 more: 15 in all", "last_number", "15"),
    ("It costs $1,250.50 in total", "last_number", "1250.50"),
    ("<think>maybe 4</think> It is 5.", "after_think", "It is 5."),
    ("<think>12 + 3 = 15</think>\nSo 15 eggs.", "auto", "15"),
    ("no answer at all", "auto", None),
    ("", "auto", None),
    ("result=[17] and [18]", "regex", "18"),
])
def test_every_extractor_reads_its_literal_case(text, how, expected):
    regex = r"\[(\d+)\]" if how == "regex" else None
    assert extract(text, how, regex) == expected


def test_extractor_settings_are_checked_with_a_clear_message():
    with pytest.raises(AnswerSettingError, match="unknown answer extractor 'boxes'"):
        check_extractor("boxes")
    with pytest.raises(AnswerSettingError, match="needs a regular expression"):
        check_extractor("regex")
    with pytest.raises(AnswerSettingError, match="does not compile"):
        check_extractor("regex", "([0-9]")
    with pytest.raises(AnswerSettingError, match="needs a group"):
        check_extractor("regex", r"\d+")


@pytest.mark.parametrize(("reference", "expected"), [
    ("She sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72", "72"),
    ("Thus the answer is $\\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}"),
    ("7", "7"),
    ("a long reference solution without any marked answer\nspanning lines", None),
])
def test_gold_answers_come_from_gsm8k_and_math_references(reference, expected):
    assert gold_answer(reference) == expected


@pytest.mark.parametrize(("answer", "gold", "same"), [
    ("\\frac{1}{2}", "0.5", True), ("72 clips", "72", True), ("So the total is 72", "72", True),
    ("1,000", "1000", True), ("2\\sqrt{2}", "\\sqrt{8}", True), ("71", "72", False), (None, "1", False),
    ("", "1", False), ("5", "", False),
])
def test_equivalence_is_math_verify_s(answer, gold, same):
    assert equivalent(answer, gold) is same


def test_a_free_text_completion_is_read_as_steps_a_think_block_and_a_verified_answer():
    task = get_task("import")
    p = Prompt("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
               "How many clips did Natalia sell altogether?", {"answer": "72"})
    text = "<think>\n48 / 2 = 24\n48 + 24 = 72\n</think>\n\\boxed{72}"
    parsed = task.parse_completion(p, text)
    assert [s.text for s in parsed.steps] == ["48 / 2 = 24", "48 + 24 = 72", "\\boxed{72}"]
    assert all(s.correct is None for s in parsed.steps)  # free text: no step verdicts
    assert text[slice(*parsed.think)].startswith("<think>") and text[slice(*parsed.think)].endswith("</think>")
    assert text[slice(*parsed.answer_span)] == "\\boxed{72}"
    assert task.verdict(p, text) == ("72", True)
    assert task.verdict(p, text.replace("{72}", "{62}")) == ("62", False)
    assert task.verdict(Prompt("a typed prompt", {"answer": None}), text) == ("72", None)  # no gold: unknown
    assert not task.parse_completion(p, "<think>\n48 / 2 = 24").well_formed  # unclosed, no answer


def test_steps_are_paragraphs_when_there_are_blank_lines_else_lines():
    assert segments("one\ntwo\n\nthree") == [(0, 7), (9, 14)]
    assert segments("one\ntwo") == [(0, 3), (4, 7)]
    assert segments("<think>\n</think>") == []


def test_templated_prompts_are_recognised():
    assert is_templated("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert is_templated("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>")
    assert not is_templated("Q: 23+48-7=")
