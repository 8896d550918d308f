"""The agent loop (``backends.agent``) on a real policy with real tools in the sandbox.

The sample chat policy writes a newline in almost every turn, so a task whose calls end at
"\n" (:class:`Scripted`) makes it call tools often; its calls are answered in the order of a
script (the calculator, a tool that raises, hangs or allocates 10 GB, a call that is not JSON,
an unknown tool), through :class:`studio.workers.agent_env.TaskEnv` and the tool sandbox.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from backends import load_policy
from backends.agent import branch_agent, sample_agent
from backends.chat import render
from backends.policy import score_batch
from sample_data import AGENT_POLICY_DIR, CHAT_POLICY_DIR
from studio.store.records import generation_rows, trajectory_counts
from studio.tasks import get_task
from studio.tasks.calculator import calculator
from studio.tasks.tool_calls import call_text, format_response, parse_call
from studio.workers.agent_env import TaskEnv
from studio.workers.tools import ToolLimits, ToolSandbox
from tests import agent_tools
from tests.fixtures import open_store

TASK = get_task("calculator_agent")


class Scripted:
    """A task-like object: a call ends at a newline, and the k-th call is ``script[k % len]``:
    a tool's name, ``bad_json`` (a call that is not JSON) or ``unknown`` (a tool no one has)."""

    name = "scripted"
    call_end = "\n"
    tools = {"calculator": calculator, "boom": agent_tools.boom, "spin": agent_tools.spin, "hog": agent_tools.hog}

    def __init__(self, *script: str):
        self.script, self.calls = script, 0

    def parse_call(self, text: str):
        kind = self.script[self.calls % len(self.script)]
        self.calls += 1
        if kind == "bad_json":
            return parse_call('<tool_call>{"name": calculator}</tool_call>', self.tools)
        if kind == "unknown":
            return parse_call(call_text("search", {"query": "x"}), self.tools)
        args = {"expression": "37*24"} if kind == "calculator" else {}
        return kind, json.dumps(args), args

    def format_response(self, result=None, error=None):
        return format_response(result, error)


@pytest.fixture(scope="module")
def policy():
    return load_policy(CHAT_POLICY_DIR, device="cpu")


@pytest.fixture(scope="module")
def sandbox():
    with ToolSandbox(ToolLimits(call_s=1.0, memory_mb=1024)) as box:
        yield box


def _prompts(policy, n: int = 2) -> list[str]:
    return [render(policy.tokenizer, TASK.policy_input(p)) for p in TASK.make_prompts(n, seed=0)]


def _tool_spans(g):
    return [(t.start, t.end) for t in g.turns if t.role == "tool"]


def test_a_tool_s_answer_is_a_masked_tool_turn_without_statistics_and_stored_so(policy, sandbox):
    prompts = _prompts(policy)
    gens = sample_agent(policy.model, policy.tokenizer, prompts, TaskEnv(Scripted("calculator"), sandbox), n=2,
                        max_turns=2, max_new_tokens=120, seed=0)
    answer = policy.tokenizer("<tool_response>888</tool_response>", add_special_tokens=False)["input_ids"]
    for g in gens:
        roles = [t.role for t in g.turns]
        assert roles[:4] == ["assistant", "tool", "assistant", "tool"]  # the policy called twice (its turn budget)
        tool = [t for t in g.turns if t.role == "tool"]
        assert [(t.tool_name, t.text, t.error) for t in tool] == [("calculator", "<tool_response>888</tool_response>",
                                                                    None)] * 2
        calls = [t for t in g.turns if t.role == "assistant" and t.tool_name]
        assert [(t.tool_args, t.text.endswith("\n")) for t in calls] == [('{"expression": "37*24"}', True)] * 2
        expect = np.ones(g.n_tokens, bool)
        for s, e in _tool_spans(g):
            expect[s:e] = False
            assert g.token_ids[s:e].tolist() == answer  # the answer's own tokens, appended as they are
        assert (g.mask == expect).all()
        assert np.isnan(g.logprobs[~g.mask]).all() and np.isnan(g.entropies[~g.mask]).all()
        assert (g.topk_ids[~g.mask] == -1).all() and np.isnan(g.topk_logprobs[~g.mask]).all()
        assert np.isfinite(g.logprobs[g.mask]).all() and np.isfinite(g.entropies[g.mask]).all()
        assert "<tool_response>888</tool_response>" in g.text
    store = open_store()
    rows = generation_rows("run", TASK, TASK.make_prompts(2, seed=0), gens)
    store.write(rows.frames())
    tok = store.df("SELECT t.trained, t.logprob, t.entropy, t.topk_ids, u.role FROM tokens t JOIN turns u "
                   "ON u.rollout_id = t.rollout_id AND u.turn_idx = t.turn_idx")
    tool = tok[tok["role"] == "tool"]
    assert len(tool) == sum(int((~g.mask).sum()) for g in gens)
    assert (~tool["trained"]).all() and tool["logprob"].isna().all() and tool["entropy"].isna().all()
    assert tool["topk_ids"].isna().all() and tok.loc[tok["role"] == "assistant", "trained"].all()
    counts = store.df("SELECT n_turns, n_tool_calls, n_tool_errors FROM rollouts")
    assert (counts["n_tool_calls"] == 2).all() and (counts["n_tool_errors"] == 0).all()
    store.close()


def test_the_turn_budget_ends_a_trajectory_at_the_call_past_it(policy, sandbox):
    gens = sample_agent(policy.model, policy.tokenizer, _prompts(policy), TaskEnv(Scripted("calculator"), sandbox),
                        n=2, max_turns=1, max_new_tokens=200, seed=0)
    for g in gens:
        assert g.finish_reason == "turns"
        assert [t.role for t in g.turns] == ["assistant", "tool", "assistant"]
        assert g.turns[-1].tool_name is None and g.turns[-1].end == g.n_tokens  # the second call was not run
        assert g.turns[-1].text.endswith("\n")


def test_the_token_budget_counts_tool_tokens_and_cuts_an_answer(policy, sandbox):
    for budget in (3, 8, 40):
        gens = sample_agent(policy.model, policy.tokenizer, _prompts(policy), TaskEnv(Scripted("calculator"), sandbox),
                            n=2, max_turns=8, max_new_tokens=budget, seed=1)
        for g in gens:
            assert g.n_tokens <= budget
            if g.finish_reason == "length":
                assert g.n_tokens == budget
            assert g.turns[-1].end == g.n_tokens
    cut = [g for g in gens if g.turns[-1].role == "tool"]  # budget 40: some answer is cut by the budget
    assert all(g.finish_reason == "length" for g in cut)


@pytest.mark.parametrize("kind, error", [
    ("boom", "the tool broke on purpose"),
    ("spin", "the tool ran past its time limit of 1 s"),
    ("hog", "the tool ran out of memory (limit 1024 MB)"),
    ("bad_json", "the tool call is not valid JSON"),
    ("unknown", "unknown tool 'search'"),
])
def test_a_failing_call_is_a_tool_turn_with_its_error_and_the_loop_goes_on(policy, sandbox, kind, error):
    task = Scripted(kind, "calculator")
    gens = sample_agent(policy.model, policy.tokenizer, _prompts(policy, 1), TaskEnv(task, sandbox), n=1,
                        max_turns=2, max_new_tokens=120, seed=0)
    g = gens[0]
    tools = [t for t in g.turns if t.role == "tool"]
    assert tools[0].error.startswith(error) and error in tools[0].text  # the policy reads why
    assert tools[1].error is None and tools[1].text == "<tool_response>888</tool_response>"  # and goes on
    assert np.isnan(g.logprobs[tools[0].start:tools[0].end]).all()


def test_same_seed_same_trajectories_other_seed_others(policy, sandbox):
    def run(seed):
        return sample_agent(policy.model, policy.tokenizer, _prompts(policy), TaskEnv(Scripted("calculator"), sandbox),
                            n=3, max_turns=3, max_new_tokens=80, temperature=2.0, seed=seed)

    a, b, c = run(5), run(5), run(6)
    assert [g.token_ids.tolist() for g in a] == [g.token_ids.tolist() for g in b]
    assert all(np.array_equal(x.logprobs, y.logprobs, equal_nan=True) for x, y in zip(a, b, strict=True))
    assert [(t.role, t.start, t.end) for g in a for t in g.turns] == [(t.role, t.start, t.end) for g in b for t in g.turns]
    assert [g.token_ids.tolist() for g in a] != [g.token_ids.tolist() for g in c]


def test_policy_token_statistics_equal_teacher_forcing(policy, sandbox):
    gens = sample_agent(policy.model, policy.tokenizer, _prompts(policy), TaskEnv(Scripted("calculator"), sandbox),
                        n=2, max_turns=3, max_new_tokens=100, seed=2, top_k_stats=4)
    forced = score_batch(policy.model, policy.tokenizer, [g.prompt for g in gens], [g.token_ids.tolist() for g in gens],
                         top_k_stats=4)
    for g, f in zip(gens, forced, strict=True):
        m = g.mask
        assert (~m).any()  # the comparison crosses tool turns
        np.testing.assert_allclose(g.logprobs[m], f.logprobs[m], atol=1e-4)
        np.testing.assert_allclose(g.entropies[m], f.entropies[m], atol=1e-4)
        np.testing.assert_allclose(g.topk_logprobs[m], f.topk_logprobs[m], atol=1e-4)


def test_branching_inside_turn_two_keeps_the_prefix_and_runs_the_tool_again(policy, sandbox):
    prompts = _prompts(policy, 1)
    env = TaskEnv(Scripted("calculator"), sandbox)
    g = sample_agent(policy.model, policy.tokenizer, prompts, env, n=1, max_turns=2, max_new_tokens=120, seed=0)[0]
    second = g.turns[2]  # the assistant turn after the first tool turn
    assert second.role == "assistant" and second.end - second.start >= 2
    fork = second.start + 1
    task = Scripted("calculator")
    branches = branch_agent(policy.model, policy.tokenizer, prompts[0], g.token_ids[:fork].tolist(),
                            g.mask[:fork].tolist(), g.turns, [None, int(g.token_ids[fork])], TaskEnv(task, sandbox),
                            n=2, max_turns=2, max_new_tokens=120, seed=3)
    assert len(branches) == 4 and task.calls >= 4  # every branch called the tool again
    for b in branches:
        assert b.token_ids[:fork].tolist() == g.token_ids[:fork].tolist()
        assert [(t.role, t.start, t.end, t.text) for t in b.turns[:2]] == [(t.role, t.start, t.end, t.text)
                                                                           for t in g.turns[:2]]
        assert b.turns[2].start == second.start and b.turns[2].role == "assistant"
        assert (b.mask[:fork] == g.mask[:fork]).all()
        pm = g.mask[:fork]
        np.testing.assert_allclose(b.logprobs[:fork][pm], g.logprobs[:fork][pm], atol=1e-4)  # teacher forced
        assert np.isnan(b.logprobs[:fork][~pm]).all()
        assert sum(t.role == "tool" for t in b.turns) == 2  # the prefix's call and one more (max_turns counts both)
    assert [b.token_ids[fork] for b in branches[2:]] == [g.token_ids[fork]] * 2  # the forced choice
    tool = g.turns[1]
    with pytest.raises(ValueError, match="tool turn"):
        branch_agent(policy.model, policy.tokenizer, prompts[0], g.token_ids[:tool.start + 1].tolist(),
                     g.mask[:tool.start + 1].tolist(), g.turns, [None], env, n=1, max_new_tokens=120)


def test_generate_on_the_sample_agent_world_runs_the_calculator_and_stores_the_turns(empty_store):
    from studio.runs.generation import GenerateConfig, generate_sync

    cfg = GenerateConfig(group_size=4, max_new_tokens=256, max_turns=8, seed=1)
    res = generate_sync(empty_store, AGENT_POLICY_DIR, TASK.make_prompts(2, seed=4), cfg, task="calculator_agent")
    assert res.status == "done", res.error
    rolls = empty_store.df("SELECT rollout_id, n_tokens, n_turns, n_tool_calls FROM rollouts ORDER BY rollout_id")
    assert len(rolls) == 8 and rolls["n_tool_calls"].sum() > 0
    turns = empty_store.df("SELECT rollout_id, count(*) AS n, max(end_pos) AS last FROM turns GROUP BY rollout_id "
                           "ORDER BY rollout_id")
    assert turns["n"].tolist() == rolls["n_turns"].tolist() and turns["last"].tolist() == rolls["n_tokens"].tolist()
    calls = empty_store.df("SELECT a.tool_name, a.tool_args, t.content, t.error FROM turns a JOIN turns t ON "
                           "t.rollout_id = a.rollout_id AND t.turn_idx = a.turn_idx + 1 AND t.role = 'tool' "
                           "WHERE a.role = 'assistant'")
    assert calls["tool_name"].notna().sum() == rolls["n_tool_calls"].sum()  # a call that could not be read names none
    for call in calls.itertuples():  # the calculator ran on the policy's own call (in the worker's sandbox)
        if call.error is None:
            assert call.content == TASK.format_response(calculator(**json.loads(call.tool_args)))
        else:
            assert call.error in call.content
    tool = empty_store.df("SELECT t.trained, t.logprob FROM tokens t JOIN turns u ON u.rollout_id = t.rollout_id "
                          "AND u.turn_idx = t.turn_idx WHERE u.role = 'tool'")
    assert len(tool) and not tool["trained"].any() and tool["logprob"].isna().all()


@pytest.fixture(scope="module")
def agent_policy():
    return load_policy(AGENT_POLICY_DIR, device="cpu")


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    from tests.fixtures import Backend

    b = Backend(tmp_path_factory.mktemp("agent-backend"), "--policy", str(AGENT_POLICY_DIR))
    yield b
    b.stop()


def test_the_remote_loop_on_the_sample_agent_world_runs_turns_on_the_backend_and_tools_here(agent_policy, sandbox,
                                                                                           backend):
    from backends.remote import RemotePolicy

    remote, env = RemotePolicy(backend.url), TaskEnv(TASK, sandbox)
    tok = agent_policy.tokenizer
    prompts = _prompts(agent_policy)
    kw = dict(n=2, max_turns=8, max_new_tokens=256, seed=0)
    got = remote.sample_agent(prompts, env, **kw)
    assert [g.token_ids.tolist() for g in got] == [g.token_ids.tolist() for g in remote.sample_agent(prompts, env, **kw)]
    local = sample_agent(agent_policy.model, tok, prompts, env, **kw)
    # until the first row's first call ends it, the server drew for the same rows as the local loop
    first = min(g.turns[0].end for g in got)
    assert [g.token_ids[:first].tolist() for g in got] == [g.token_ids[:first].tolist() for g in local]
    forced = score_batch(agent_policy.model, tok, [g.prompt for g in got], [g.token_ids.tolist() for g in got])
    assert sum(trajectory_counts(g.turns)[1] for g in got) > 0
    for g, f in zip(got, forced, strict=True):
        expect = np.ones(g.n_tokens, bool)
        for call, answer in zip(g.turns, g.turns[1:], strict=False):
            if answer.role != "tool":
                continue
            expect[answer.start:answer.end] = False
            assert g.token_ids[answer.start:answer.end].tolist() == tok(answer.text, add_special_tokens=False)[
                "input_ids"][:answer.end - answer.start]
            if call.tool_name is not None and answer.error is None:  # the calculator ran here on the call
                assert answer.text == TASK.format_response(calculator(**json.loads(call.tool_args)))
        assert (g.mask == expect).all() and np.isnan(g.logprobs[~g.mask]).all() and (g.topk_ids[~g.mask] == -1).all()
        np.testing.assert_allclose(g.logprobs[g.mask], f.logprobs[g.mask], atol=1e-4)  # exact statistics
        np.testing.assert_allclose(g.entropies[g.mask], f.entropies[g.mask], atol=1e-4)
        assert g.text == tok.decode(g.token_ids[:-1] if g.finish_reason == "stop" else g.token_ids)

    g = next(g for g in got if len(g.turns) > 3 and g.turns[2].end - g.turns[2].start > 2)
    fork = g.turns[2].start + 1
    branches = remote.branch_agent(g.prompt, g.token_ids[:fork].tolist(), g.mask[:fork].tolist(), g.turns,
                                   [None], env, n=2, max_turns=8, max_new_tokens=256, seed=1)
    for b in branches:
        assert b.token_ids[:fork].tolist() == g.token_ids[:fork].tolist() and b.turns[:2] == g.turns[:2]
        assert b.turns[2].start == g.turns[2].start and b.turns[2].role == "assistant"
        np.testing.assert_allclose(b.logprobs[:fork][g.mask[:fork]], g.logprobs[:fork][g.mask[:fork]], atol=1e-4)
