"""The arithmetic task: prompt generation, prompt parsing, completion parsing."""
import pytest

from studio.tasks import TaskParseError, get_task, task_names
from studio.tasks.arithmetic import format_solution

task = get_task("arithmetic")


def test_registry_knows_the_sample_task():
    assert "arithmetic" in task_names()
    with pytest.raises(KeyError, match="known tasks: .*arithmetic"):
        get_task("chess")


def test_prompt_generator_is_seeded_and_respects_difficulty():
    a = task.make_prompts(20, seed=3, difficulty="hard")
    assert [p.text for p in a] == [p.text for p in task.make_prompts(20, seed=3, difficulty="hard")]
    assert [p.text for p in a] != [p.text for p in task.make_prompts(20, seed=4, difficulty="hard")]
    assert all(3 <= len(p.meta["operands"]) <= 4 for p in a)
    assert all(len(p.meta["operands"]) == 2 for p in task.make_prompts(20, seed=3, difficulty="easy"))
    with pytest.raises(ValueError, match="difficulty"):
        task.make_prompts(1, difficulty="impossible")


def test_gold_solution_is_left_to_right():
    # 23+48 = 71; 71-7 = 64
    assert format_solution([23, 48, 7], ["+", "-"]) == "23+48=71;71-7=64;A:64"
    # signs: 5-9 = -4; -4+3 = -1
    p = task.parse_prompt("Q: 5-9+3=")
    assert p.gold == {"answer": "-1", "solution": "5-9=-4;-4+3=-1;A:-1"}


@pytest.mark.parametrize("typed", ["Q: 23+48-7=", "23+48-7", " 23 + 48 - 7 = ", "Q:23+48-7"])
def test_typed_prompts_are_normalised(typed):
    assert task.parse_prompt(typed).text == "Q: 23+48-7="


@pytest.mark.parametrize("bad", ["", "hello", "Q: 23*4=", "Q: 12+=", "Q: 1+2+3+4+5+6+7=", "Q: 1000+1="])
def test_unparsable_prompts_raise_a_clear_error(bad):
    with pytest.raises(TaskParseError, match="arithmetic|range"):
        task.parse_prompt(bad)


def test_parse_completion_steps_spans_and_verdicts():
    p = task.parse_prompt("Q: 23+48-7=")
    c = "23+48=71;71-7=65;A:65"
    parsed = task.parse_completion(p, c)
    assert [s.text for s in parsed.steps] == ["23+48=71", "71-7=65"]
    assert [c[s.start:s.end] for s in parsed.steps] == ["23+48=71", "71-7=65"]
    assert [s.correct for s in parsed.steps] == [True, False]  # 71-7 is 64, not 65
    assert parsed.answer == "65" and parsed.well_formed
    assert not task.is_correct(p, parsed.answer)
    assert task.is_correct(p, task.parse_completion(p, p.gold["solution"]).answer)


def test_malformed_completions():
    p = task.parse_prompt("Q: 2+3=")
    truncated = task.parse_completion(p, "2+3=5;A:")
    assert truncated.answer is None and not truncated.well_formed
    garbage = task.parse_completion(p, "xyz")
    assert garbage.answer is None and not garbage.well_formed
    assert [s.correct for s in garbage.steps] == [None]
    assert not task.parse_completion(p, "").well_formed
