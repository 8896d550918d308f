"""The sample agent world: the ``calculator_agent`` task, its calculator and tool-call format,
the shipped agent policy (through the real agent loop) and the trajectories a new store is seeded with."""
from __future__ import annotations

import random

import pytest

from sample_data import AGENT_POLICY_DIR, AGENT_ROLLOUTS_DIR, SEED_DIRS
from sample_data.agent_world import NOISE, distinct_heldout, expert, text_of
from studio.tasks import get_task
from studio.tasks.agent import make_problem, solution_turns
from studio.tasks.calculator import calculator
from studio.tasks.tool_calls import MARKERS, ToolCallError, call_text

TASK = get_task("calculator_agent")


def test_the_calculator_computes_exact_integers():
    assert calculator("37*24") == 888
    assert calculator(" (888 - 129) / 3 ") == 253  # spaces, parentheses, exact division
    assert calculator("2+3*4") == 14  # precedence
    assert calculator("-5+2") == -3 and calculator("+7") == 7


@pytest.mark.parametrize("expression, says", [
    ("5/0", "division by zero"),
    ("7/2", "not a whole number"),
    ("1.5+2", "not an integer"),
    ("x+1", "unknown name 'x'"),
    ("2**8", "unsupported operator"),
    ("", "empty"),
    ("3+", "cannot read"),
    ("9" * 300, "longer than"),
])
def test_the_calculator_says_what_it_cannot_compute(expression, says):
    with pytest.raises(ValueError, match=says):
        calculator(expression)


@pytest.mark.parametrize("expression", [
    "__import__('os').system('touch /tmp/pwned')", "open('/etc/passwd').read()", "(1).__class__",
    "().__class__.__bases__[0].__subclasses__()", "exec('1')", "True+1", "[1, 2]", "lambda: 1",
])
def test_the_calculator_evaluates_no_names_calls_or_attributes(expression):
    with pytest.raises(ValueError):
        calculator(expression)


def test_parse_call_reads_the_last_call_of_a_turn():
    text = call_text("calculator", {"expression": "1+1"}) + " then " + call_text("calculator", {"expression": "37*24"})
    assert TASK.parse_call(text) == ("calculator", '{"expression": "37*24"}', {"expression": "37*24"})
    assert TASK.call_end == "</tool_call>" and TASK.tools == {"calculator": calculator}


@pytest.mark.parametrize("call, says", [
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "3*4"}</tool_call>', "not valid JSON"),
    ('<tool_call>{"name": "calculator", "arguments": {"expression": 3*4}}</tool_call>', "not valid JSON"),
    ("<tool_call>[1, 2]</tool_call>", "must be a JSON object"),
    ('<tool_call>{"arguments": {"expression": "1"}}</tool_call>', 'no "name"'),
    ('<tool_call>{"name": "calculator", "arguments": "3*4"}</tool_call>', "must be a JSON object"),
    ('<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>', "unknown tool 'search'"),
    ('<tool_call>{"name": "calculator", "arguments": {"expr": "1"}}</tool_call>', "wrong arguments for calculator"),
    ("no call here", "no tool call"),
    ('{"name": "calculator"}</tool_call>', "without <tool_call>"),
])
def test_parse_call_names_what_is_wrong(call, says):
    with pytest.raises(ToolCallError, match=says):
        TASK.parse_call(call)


def test_format_response_wraps_a_result_or_an_error():
    assert TASK.format_response(888) == "<tool_response>888</tool_response>"
    assert TASK.format_response(error="division by zero in 5/0") == \
        "<tool_response>error: division by zero in 5/0</tool_response>"
    assert TASK.format_response(ValueError("7/2 is not a whole number")) == \
        "<tool_response>error: 7/2 is not a whole number</tool_response>"


def test_the_verdict_reads_the_boxed_answer_after_the_last_tool_response():
    p = TASK.make_prompts(1, seed=5)[0]
    right = "".join(solution_turns(p.gold["steps"]))
    assert TASK.verdict(p, right) == (p.gold["answer"], True)
    wrong = right.replace(f"\\boxed{{{p.gold['answer']}}}", "\\boxed{1}")
    assert TASK.verdict(p, wrong) == ("1", False)
    assert TASK.verdict(p, right[:right.rfind("\\boxed")]) == (None, False)  # never answered
    # a tool response that states a boxed answer is not the policy's answer
    spoof = call_text("calculator", {"expression": "1+1"}) + f"<tool_response>\\boxed{{{p.gold['answer']}}}</tool_response>"
    assert TASK.verdict(p, spoof) == (None, False)
    typed = TASK.parse_prompt("What is 37 times 24?")
    assert TASK.verdict(typed, "\\boxed{888}") == ("888", None)  # no gold answer to check against


def test_steps_are_tool_calls_checked_against_the_gold_solution():
    p = TASK.make_prompts(1, seed=8, difficulty="hard")[0]
    turns = solution_turns(p.gold["steps"])
    parsed = TASK.parse_completion(p, "".join(turns))
    assert len(parsed.steps) == len(p.gold["steps"]) and all(s.correct for s in parsed.steps)
    assert parsed.steps[0].text == turns[0] + turns[1]  # the call and its response
    a, op, b, _ = p.gold["steps"][0]
    slipped = call_text("calculator", {"expression": f"{a + 1}{op}{b}"}) + "<tool_response>0</tool_response>"
    assert [s.correct for s in TASK.parse_completion(p, slipped + "\\boxed{0}").steps] == [False]


def test_the_generator_is_deterministic_and_needs_the_calculator():
    assert TASK.make_prompts(20, seed=7) == TASK.make_prompts(20, seed=7)
    assert TASK.make_prompts(20, seed=7) != TASK.make_prompts(20, seed=8)
    for difficulty, (lo, hi) in {"easy": (2, 2), "medium": (2, 3), "hard": (3, 4)}.items():
        for p in TASK.make_prompts(30, seed=1, difficulty=difficulty):
            steps = p.gold["steps"]
            assert lo <= len(steps) <= hi
            assert p.messages == ({"role": "user", "content": p.text},)
            assert all(calculator(f"{a}{op}{b}") == r for a, op, b, r in steps)
            assert str(steps[-1][3]) == p.gold["answer"]
            assert max(r for *_, r in steps) >= 100  # at least one result a tiny model cannot compute by heart
    with pytest.raises(ValueError, match="difficulty"):
        TASK.make_prompts(1, difficulty="impossible")


def test_expert_trajectories_fail_the_ways_they_are_meant_to():
    rng = random.Random(0)
    seen = set()
    for _ in range(300):
        p = make_problem(rng, 2, 4)
        segs, kind = expert(p, rng)
        seen.add(kind)
        ok = TASK.verdict(p, text_of(segs))[1]
        assert ok == (kind in ("clean", "repeat", "bad_json")), (kind, text_of(segs))
        assert [r for r, _ in segs][::2] == ["assistant"] * len(segs[::2])  # assistant and tool turns alternate
    assert seen == set(NOISE)


@pytest.fixture(scope="module")
def agent_policy():
    from backends.policy import load_policy

    policy = load_policy(AGENT_POLICY_DIR)
    return policy.model, policy.tokenizer


def test_the_tool_markers_are_single_tokens(agent_policy):
    tok = agent_policy[1]
    for marker in MARKERS:
        assert len(tok(marker, add_special_tokens=False)["input_ids"]) == 1, marker


def test_the_shipped_policy_succeeds_about_half_the_time_through_the_agent_loop(agent_policy):
    """Success at temperature 1 on held-out problems, sampled through the real agent loop with
    the task's environment: the policy is competent but slips (30%-75%), and it uses the tool."""
    from backends.agent import sample_agent
    from sample_data.build_agent_policy import prompt_text
    from studio.workers.agent_env import TaskEnv

    model, tok = agent_policy
    prompts = distinct_heldout(64)
    gens = sample_agent(model, tok, [prompt_text(tok, p) for p in prompts], TaskEnv(TASK), n=1, max_turns=8,
                        max_new_tokens=256, temperature=1.0, seed=11)
    success = sum(bool(TASK.verdict(p, g.text)[1]) for p, g in zip(prompts, gens)) / len(gens)
    assert 0.30 <= success <= 0.75, success
    calls = [sum(t.role == "tool" for t in g.turns or []) for g in gens]
    assert sum(c >= 1 for c in calls) >= 0.9 * len(gens)
    tool_tokens = [~g.mask for g in gens if g.turns]
    assert any(m.any() for m in tool_tokens)  # tool responses are masked


def test_a_new_store_is_seeded_with_agent_trajectories(tmp_path):
    from studio.store import Store

    assert AGENT_ROLLOUTS_DIR in SEED_DIRS
    store = Store.open(tmp_path / "s.duckdb", seed_dir=SEED_DIRS)
    counts = store.df("SELECT count(*) AS n, sum((n_tool_calls > 0)::INT) AS calling, avg(correct::INT) AS success "
                      "FROM rollouts r JOIN prompts p USING (prompt_id) WHERE p.task = 'calculator_agent'").iloc[0]
    assert counts.n >= 200 and counts.calling >= 0.8 * counts.n and 0.2 <= counts.success <= 0.8
    roles = store.df("SELECT role, count(*) AS n FROM turns GROUP BY role").set_index("role")["n"]
    assert roles["tool"] > 0 and roles["assistant"] > roles["tool"]
    # the tokens of a tool turn are not trained and carry no policy statistics; the assistant's are trained
    tok = store.df("SELECT t.role, k.trained, k.logprob FROM tokens k JOIN turns t ON t.rollout_id = k.rollout_id "
                   "AND t.turn_idx = k.turn_idx WHERE t.role IN ('tool', 'assistant')")
    tool = tok[tok.role == "tool"]
    assert len(tool) and not tool.trained.any() and tool.logprob.isna().all()
    assistant = tok[tok.role == "assistant"]
    assert assistant.trained.all() and assistant.logprob.notna().all()
