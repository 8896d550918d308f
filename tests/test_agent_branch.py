"""Branching inside an agent trajectory, end to end on the sample agent world: the studio plans the
fork from the stored turns and loss mask, the worker continues the agent loop (the tool runs again
in the sandbox), the children are stored with their turns, the rollout tree's values read them,
and a fork on a tool response's token is refused saying why."""
from __future__ import annotations

import json

import pytest

from sample_data import AGENT_POLICY_DIR
from studio import curation
from studio.curation import PairRule, build_pairs
from studio.queries import forks
from studio.queries.turns import turns_of
from studio.runs.branch import BranchConfig, BranchError, branch_sync, masked_fork, plan_branch
from studio.runs.generation import GenerateConfig, generate_sync
from studio.store import Store
from studio.tasks import get_task

pytestmark = pytest.mark.skipif(not (AGENT_POLICY_DIR / "config.json").exists(),
                                reason="the sample agent policy is not built")
TASK = get_task("calculator_agent")
TURN_COLUMNS = ["role", "start_pos", "end_pos", "content", "tool_name", "tool_args", "error"]


@pytest.fixture(scope="module")
def trajectory(tmp_path_factory):
    """A store with sample-agent trajectories, and one with two tool calls or more (turn 2: its second call)."""
    store = Store.open(tmp_path_factory.mktemp("branch") / "agent.duckdb")
    res = generate_sync(store, AGENT_POLICY_DIR, TASK.make_prompts(4, seed=7),
                        GenerateConfig(group_size=4, max_new_tokens=256, max_turns=8, seed=0), task=TASK.name)
    assert res.status == "done", res.error
    rid = store.scalar("SELECT rollout_id FROM rollouts r WHERE n_tool_calls >= 2 AND EXISTS (SELECT 1 FROM turns t "
                       "WHERE t.rollout_id = r.rollout_id AND t.turn_idx = 2 AND t.role = 'assistant' "
                       "AND t.tool_name IS NOT NULL) ORDER BY rollout_id LIMIT 1")
    assert rid is not None, "no sample trajectory with a second tool call"
    yield store, rid
    store.close()


def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(AGENT_POLICY_DIR)


def turn(store: Store, rollout_id: str, idx: int) -> dict:
    t = turns_of(store, rollout_id)
    row = t[t["turn_idx"] == idx][TURN_COLUMNS].iloc[0].to_dict()
    return {k: None if v is None or v != v else v for k, v in row.items()}  # a missing value reads as None


def test_branching_inside_turn_2_runs_the_tool_again_and_keeps_turns_0_and_1(trajectory):
    store, parent = trajectory
    second = turn(store, parent, 2)
    # the first digit of the second call's arguments: drawn again, and forced to another digit
    toks = store.df("SELECT pos, token_id, token_text FROM tokens WHERE rollout_id = ? AND pos >= ? AND pos < ? "
                    "ORDER BY pos", [parent, int(second["start_pos"]), int(second["end_pos"])])
    digit = toks[toks["token_text"].str.fullmatch(r"\d")].iloc[0]
    fork = int(digit["pos"])
    other = tokenizer().convert_tokens_to_ids(str((int(digit["token_text"]) + 1) % 10))
    res = branch_sync(store, parent, fork, [None, other], BranchConfig(n=2, seed=3, temperature=1.0))
    assert res.status == "done", res.error
    assert res.rollouts == 4
    parent_tokens = store.df("SELECT token_id FROM tokens WHERE rollout_id = ? AND pos < ? ORDER BY pos",
                             [parent, fork])["token_id"].tolist()
    new_calls = 0
    for child in res.rollout_ids:
        assert [turn(store, child, i) for i in (0, 1)] == [turn(store, parent, i) for i in (0, 1)]
        assert store.df("SELECT token_id FROM tokens WHERE rollout_id = ? AND pos < ? ORDER BY pos",
                        [child, fork])["token_id"].tolist() == parent_tokens
        t2 = turn(store, child, 2)
        assert t2["role"] == "assistant" and t2["start_pos"] == second["start_pos"]
        if t2["tool_name"] is None and t2["end_pos"] == store.scalar(
                "SELECT n_tokens FROM rollouts WHERE rollout_id = ?", [child]):
            continue  # this continuation answered without calling again
        t3 = turn(store, child, 3)  # the tool ran on the child's own call: its real output, or why it failed
        assert t3["role"] == "tool"
        if t3["error"] is None:
            args = json.loads(t2["tool_args"])
            assert t3["content"] == TASK.format_response(TASK.tools[t2["tool_name"]](**args))
            new_calls += t2["tool_args"] != second["tool_args"]
        else:
            assert t3["error"] in t3["content"]
        assert not store.scalar("SELECT bool_or(trained) FROM tokens WHERE rollout_id = ? AND pos >= ? AND pos < ?",
                                [child, t3["start_pos"], t3["end_pos"]])  # the tool's tokens: masked
    assert new_calls >= 1  # a branch wrote another call than its parent (a forced digit), and the tool answered it
    # the tree's values work as for single answers: the fork's value is the mean reward of its trajectories
    tree = forks.tree(store, parent)
    f = next(f for f in forks.forks(store, tree) if f.pos == fork)
    kids = tree[tree["rollout_id"].isin(res.rollout_ids)]
    assert sorted(b.n for b in f.branches) == [2, 2]
    for b in f.branches:
        assert b.value == pytest.approx(kids[kids["rollout_id"].isin(b.rollout_ids)]["reward"].mean())
    assert kids["reward"].notna().all()


def test_a_fork_on_a_tool_response_is_refused_saying_why(trajectory):
    store, parent = trajectory
    tool = turn(store, parent, 1)
    pos = int(tool["start_pos"]) + 1
    why = (f"token {pos} is in a tool response (turn 1): the policy did not write it; branch at a token of an "
           "assistant turn")
    assert masked_fork(store, parent, pos) == why
    assert masked_fork(store, parent, int(tool["start_pos"]) - 1) is None  # the call's last token: the policy's
    with pytest.raises(BranchError) as err:
        plan_branch(store, parent, pos, [None])
    assert str(err.value) == why


def test_branch_siblings_make_turn_pairs(trajectory, tmp_path):
    store, parent = trajectory
    res = build_pairs(store, PairRule("all_pairs", level="turn"))
    pairs = store.df("SELECT chosen_rollout_id, rejected_rollout_id, prefix, prefix_tokens FROM pairs "
                     "WHERE kind = 'turn'")
    assert res.added == len(pairs) > 0
    curation.accept(store, build_id=res.build_id)
    out = curation.export(store, tmp_path / "turns.jsonl", "preference", "conversational")
    rows = [json.loads(x) for x in out.path.read_text().splitlines()]
    calls = [m for r in rows for side in ("prompt", "chosen", "rejected") for m in r[side] if m.get("tool_calls")]
    assert calls and all(c["tool_calls"][0]["function"]["name"] == "calculator" for c in calls)
    assert all(isinstance(c["tool_calls"][0]["function"]["arguments"], dict) for c in calls)
