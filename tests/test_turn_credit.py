"""Credit over turns: turn advantages on literal cases, G-RA gating, per-token credit of a
trajectory (tool tokens get none under every estimator), a rule's turn_reward stored and read
back, information gain per turn against direct probabilities of the sample policy."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from backends import Generation, Turn
from studio import queries
from studio.queries import credit
from studio.queries.turns import turn_reward_sources, turn_rewards_of
from studio.rewards import rules
from studio.rewards.sandbox import Limits
from studio.signals.advantages import Credit
from studio.signals.steps import gated, step_advantages
from studio.signals.turns import TurnCredit, discounted_to_go, gate_turns, normalise_turns, turn_advantages
from studio.store import Store
from studio.store.records import generation_rows, prompt_rows
from studio.store.runs import start_run
from studio.tasks import Prompt, get_task

SOURCE = "import@0000000000"  # per-turn scores as an import stores them: under the import's version id


# ---------------------------------------------------------------------------- pure functions

def test_turn_advantages_on_literal_cases():
    a, b = np.array([1.0, 0.0, 1.0]), np.array([0.0, 0.0])
    # group: the five rewards 1,0,1,0,0 have mean 0.4 and sample std sqrt(0.3) = 0.5477;
    # r̃ = 0.6/0.5478 = 1.0954 for a 1 and -0.4/0.5478 = -0.7302 for a 0
    hi, lo = 0.6 / (np.sqrt(0.3) + 1e-4), -0.4 / (np.sqrt(0.3) + 1e-4)
    ga, gb = normalise_turns([a, b], "group")
    assert ga == pytest.approx([hi, lo, hi]) and gb == pytest.approx([lo, lo])
    # summed to go (γ = 1): a -> (hi+lo+hi, lo+hi, hi); b -> (2 lo, lo)
    sa, sb = turn_advantages([a, b], "group", 1.0)
    assert sa == pytest.approx([2 * hi + lo, lo + hi, hi]) and sb == pytest.approx([2 * lo, lo])
    # ... which is the step view's process-supervision advantage over the same rewards
    assert np.concatenate([sa, sb]) == pytest.approx(np.concatenate(step_advantages([a, b])))
    # discounted (γ = 0.5): A_0 = r̃_0 + 0.5 r̃_1 + 0.25 r̃_2
    da, _ = turn_advantages([a, b], "group", 0.5)
    assert da == pytest.approx([hi + 0.5 * lo + 0.25 * hi, lo + 0.5 * hi, hi])
    # γ = 0: each turn alone
    assert turn_advantages([a, b], "group", 0.0)[0] == pytest.approx(ga)
    # per index: turn 0 is (1, 0) -> ±1/(0.7071+1e-4); turn 1 is (0, 0) -> 0; turn 2 has one trajectory -> 0
    z = 0.5 / (np.sqrt(0.5) + 1e-4)
    ia, ib = normalise_turns([a, b], "index")
    assert ia == pytest.approx([z, 0.0, 0.0]) and ib == pytest.approx([-z, 0.0])
    # none: raw rewards, summed to go
    assert turn_advantages([a, b], "none")[0].tolist() == [2.0, 1.0, 1.0]
    # a turn without a reward is left out of the statistics and gets r̃ = 0: (1, ·) vs (0, 0) as above
    na, nb = normalise_turns([np.array([1.0, np.nan]), np.array([0.0, 0.0])], "group")
    m, s = 1 / 3, np.std([1.0, 0.0, 0.0], ddof=1)
    assert na == pytest.approx([(1 - m) / (s + 1e-4), 0.0]) and nb == pytest.approx([-m / (s + 1e-4)] * 2)
    # all-equal rewards: no signal
    assert [x.tolist() for x in turn_advantages([np.ones(2), np.ones(3)])] == [[0.0, 0.0], [0.0, 0.0, 0.0]]
    assert discounted_to_go([1.0, 1.0, 1.0], 0.9).tolist() == pytest.approx([2.71, 1.9, 1.0])
    with pytest.raises(ValueError, match="unknown turn normalisation"):
        TurnCredit(norm="batch").validate()
    with pytest.raises(ValueError, match="γ must be within"):
        TurnCredit(gamma=1.5).validate()


def test_gated_reward_accumulation_over_turns():
    # outcome 1 reaches τ = 1: turn rewards kept, the outcome on the last turn: R = 1 + 0.2 + 0.3
    kept = gate_turns([0.2, 0.3], 1.0, tau=1.0)
    assert kept.tolist() == pytest.approx([0.2, 1.3]) and kept.sum() == pytest.approx(gated(1.0, [0.2, 0.3], 1.0))
    # outcome 0 misses τ: the turn rewards cannot be farmed by a failing trajectory, R = 0
    assert gate_turns([0.2, 0.3], 0.0, tau=1.0).tolist() == [0.0, 0.0] == [gated(0.0, [0.2, 0.3], 1.0)] * 2
    # a lower gate lets a partial outcome through: R = 0.5 + 0.2 + 0.3
    assert gate_turns([0.2, 0.3], 0.5, tau=0.5).sum() == pytest.approx(1.0)
    # an unscored trajectory has no credit to give
    assert np.isnan(gate_turns([0.2], None, tau=1.0)).all()
    # gated then normalised: the failing trajectory's tool-call bonuses no longer lift it above the winner
    win, lose = gate_turns([0.0, 0.0], 1.0, 1.0), gate_turns([1.0, 1.0], 0.0, 1.0)
    aw, al = turn_advantages([win, lose])
    assert aw[0] > 0 > al[0]


# ---------------------------------------------------------------------------- in the store

def _trajectory(i: int, call_ok: bool = True) -> Generation:
    """turn 0: the policy calls a tool (3 tokens); turn 1: the tool's response (2 tokens, masked);
    turn 2: the answer (2 tokens)."""
    T = 7
    mask = np.array([1, 1, 1, 0, 0, 1, 1], dtype=bool)
    lp = np.where(mask, -0.5, np.nan).astype(np.float32)
    return Generation(
        prompt_index=0, sample_idx=i, prompt="2+2=", text="<call>2+2</call><resp>4A:4", token_ids=np.arange(T),
        token_texts=["<call>", "2+2", "</call>", "<resp>", "4", "A:", "4"], logprobs=lp, entropies=-lp,
        topk_ids=np.where(mask[:, None], 1, -1).repeat(2, 1),
        topk_logprobs=np.where(mask[:, None], -1.0, np.nan).repeat(2, 1), finish_reason="stop", loss_mask=mask,
        turns=[Turn("assistant", 0, 3, "<call>2+2</call>", tool_name="calc", tool_args='{"x": "2+2"}'),
               Turn("tool", 3, 5, "<resp>4", tool_name="calc", error=None if call_ok else "boom"),
               Turn("assistant", 5, 7, "A:4")])


@pytest.fixture
def trajectories():
    """A store with one group of three trajectories of '2+2=' and per-turn scores as an import stores
    them (turn 0 and turn 2 of each; turn 1 is the tool's)."""
    store = Store.open()
    task, prompts = get_task("arithmetic"), [Prompt("2+2=", {"answer": 4})]
    store.write({"prompts": prompt_rows(task, prompts)})
    run_id = start_run(store, "generate", "trajectories", "policy", "arithmetic", {})
    rows = generation_rows(run_id, task, prompts, [_trajectory(i) for i in range(3)])
    store.write(rows.frames())
    rids = rows.rollouts["rollout_id"].tolist()
    scores = {rids[0]: (1.0, 1.0), rids[1]: (0.0, 1.0), rids[2]: (0.0, 0.0)}
    store.write({"turn_rewards": pd.DataFrame(
        [(r, k, SOURCE, v) for r, (v0, v2) in scores.items() for k, v in ((0, v0), (2, v2))],
        columns=["rollout_id", "turn_idx", "source", "value"])})
    return store, rids


def test_turn_advantages_over_the_rollout_s_group(trajectories):
    store, rids = trajectories
    t = credit.turn_advantages(store, rids[1], SOURCE)
    assert t["turn_idx"].tolist() == [0, 1, 2] and t["role"].tolist() == ["assistant", "tool", "assistant"]
    # rewards of the group: (1, 1), (0, 1), (0, 0): mean 0.5, sample std sqrt(0.3); r̃ = ±0.5/0.5478
    r = 0.5 / (np.sqrt(0.3) + 1e-4)
    assert t["reward"].tolist()[0::2] == [0.0, 1.0] and np.isnan(t["reward"][1])
    # rollout 1: r̃ = (-r, +r), summed to go: (0, r); the tool turn gets no credit
    assert t["advantage"].tolist() == pytest.approx([0.0, 0.0, r])
    # per index: turn 0 is (1, 0, 0) -> mean 1/3, std 0.5774; turn 2 is (1, 1, 0) -> mean 2/3
    s = np.std([1.0, 0.0, 0.0], ddof=1) + 1e-4
    t = credit.turn_advantages(store, rids[1], SOURCE, TurnCredit("index", gamma=0.0))
    assert t["advantage"].tolist() == pytest.approx([-1 / 3 / s, 0.0, 1 / 3 / s])
    # every token of assistant turn k gets A_k, the tool's tokens 0
    tok = credit.turn_token_advantages(t, 7)
    assert tok.tolist() == pytest.approx([-1 / 3 / s] * 3 + [0.0, 0.0] + [1 / 3 / s] * 2)
    # another source has nothing for it
    assert credit.turn_advantages(store, rids[1], "other@1").empty


def test_gated_turn_advantages_read_each_trajectory_s_outcome(trajectories):
    store, rids = trajectories
    # outcomes (a rule version): only rollout 0 reaches τ = 1
    store.write({"rule_versions": pd.DataFrame([{"rule_version_id": "out@1", "name": "out", "source": "",
                                                 "sha256": "", "created_at": pd.Timestamp("2026-01-01"),
                                                 "note": ""}]),
                 "rewards": pd.DataFrame([(r, "out@1", "total", v, None) for r, v in zip(rids, (1.0, 0.5, 0.0),
                                                                                         strict=True)],
                                         columns=["rollout_id", "rule_version_id", "component", "value", "error"])})
    how = TurnCredit("none", gamma=1.0, tau=1.0)
    # rollout 0: turn rewards kept, outcome on the last turn: (1, 1 + 1); summed to go (3, 2)
    assert credit.turn_advantages(store, rids[0], SOURCE, how, "out@1")["advantage"].tolist() == [3.0, 0.0, 2.0]
    # rollout 1 misses τ: its turn reward of 1 does not count, only its outcome 0.5 on the last turn
    assert credit.turn_advantages(store, rids[1], SOURCE, how, "out@1")["reward"].tolist()[0::2] == [0.0, 0.5]


def test_tool_tokens_get_no_credit_under_any_estimator(trajectories):
    store, rids = trajectories
    store.write({"rule_versions": pd.DataFrame([{"rule_version_id": "out@1", "name": "out", "source": "",
                                                 "sha256": "", "created_at": pd.Timestamp("2026-01-01"),
                                                 "note": ""}]),
                 "rewards": pd.DataFrame([(r, "out@1", "total", v, None) for r, v in zip(rids, (1.0, 0.0, 0.0),
                                                                                         strict=True)],
                                         columns=["rollout_id", "rule_version_id", "component", "value", "error"])})
    # a reference policy's and a critic's per-token scores, every position (tool tokens included)
    store.write({"token_scores": pd.DataFrame(
        [(r, p, v, -0.7, None, None) for r in rids for p in range(7) for v in ("ref@1",)]
        + [(r, p, "value-c@1", None, None, 0.25) for r in rids for p in range(7)],
        columns=["rollout_id", "pos", "policy_version", "logprob", "entropy", "value"])})
    for est in ("grpo", "dr_grpo", "rloo", "reinforce_pp", "kl", "gae"):
        c = Credit(est, reference="ref@1", values="value-c@1")
        tc = credit.token_advantages(store, rids[0], c, "out@1")
        assert tc.values is not None, (est, tc.note)
        assert tc.values[3:5].tolist() == [0.0, 0.0], est  # the tool's response
        assert (tc.values[[0, 1, 2, 5, 6]] != 0).all(), est
        view = credit.rollout_view(store, rids[0], c, "out@1")
        assert view.credit.values[3:5].tolist() == [0.0, 0.0], est


# ---------------------------------------------------------------------------- a rule's turn_reward

TURN_RULE = '''
def reward(prompt, completion, gold, steps, **ctx):
    return float(len(ctx.get("turns", [])))


def turn_reward(prompt, turn, gold, **ctx):
    # a failed call costs 1; a call that ran earns 0.5; the answer turn 0
    if turn.tool_name is None:
        return 0.0
    return -1.0 if turn.error else 0.5 + 0 * len(turn.response)
'''


def test_a_rule_s_turn_reward_is_stored_per_assistant_turn_and_read_back(trajectories):
    store, rids = trajectories
    with store.transaction() as cur:  # the second trajectory's call failed
        cur.execute("UPDATE turns SET error = 'boom' WHERE rollout_id = ? AND turn_idx = 1", [rids[1]])
    res = rules.apply_rule_sync(store, TURN_RULE, "turns", limits=Limits(workers=1))
    assert res.status == "done" and res.failed == 0, res
    got = turn_rewards_of(store, rids, [res.rule_version_id])
    # one row per assistant turn (turns 0 and 2), none for the tool's turn
    assert got[["rollout_id", "turn_idx", "value"]].values.tolist() == [
        [rids[0], 0, 0.5], [rids[0], 2, 0.0], [rids[1], 0, -1.0], [rids[1], 2, 0.0], [rids[2], 0, 0.5], [rids[2], 2, 0.0]]
    assert res.rule_version_id in turn_reward_sources(store)
    # the rule's reward saw the three turns
    assert store.scalar("SELECT min(value) FROM rewards WHERE rule_version_id = ? AND component = 'total'",
                        [res.rule_version_id]) == 3.0
    # and turn advantages read them: the failed call is the group's worst turn
    t = credit.turn_advantages(store, rids[1], res.rule_version_id, TurnCredit(gamma=0.0))
    assert t["advantage"][0] < 0 and t["advantage"][1] == 0.0


def test_a_turn_reward_that_raises_is_the_rollout_s_error(trajectories):
    store, rids = trajectories
    bad = TURN_RULE.replace("    if turn.tool_name is None:", "    if turn.index == 2:\n        raise ValueError('no')\n"
                                                                   "    if turn.tool_name is None:")
    res = rules.apply_rule_sync(store, bad, "raises", limits=Limits(workers=1))
    assert res.status == "done" and res.failed == 3
    err = store.df("SELECT value, error FROM rewards WHERE rule_version_id = ? AND component = 'total'",
                   [res.rule_version_id])
    assert err["value"].isna().all() and err["error"].str.contains("ValueError: no").all()
    assert "turn_reward" in err["error"][0]  # the frame inside the rule is named
    # nothing half-written: no turn rewards for the failed rollouts
    assert turn_rewards_of(store, rids, [res.rule_version_id]).empty
    # a turn_reward returning something that is not a number says so
    res = rules.apply_rule_sync(store, TURN_RULE.replace("return 0.0", "return None"), "none",
                                limits=Limits(workers=1))
    assert "turn_reward returned None for turn 2; it returns a finite number" in res.errors[0][1]


def test_check_source_validates_turn_reward():
    probs = rules.source_problems("def reward(p, c, g, s, **k):\n    return 1\n\ndef turn_reward(turn):\n    return 0\n")
    assert [str(p) for p in probs] == ["line 4: turn_reward takes (prompt, turn, gold, **ctx)"]


# ---------------------------------------------------------------------------- information gain per turn

def test_information_gain_per_turn_equals_direct_probabilities(seeded_store):
    """A stored rollout of the sample task made a trajectory: its first step an assistant turn, the
    next step a tool's response (masked), the rest the answer turn. IG per turn from the worker
    equals P(gold | prefix) differences computed here with score_batch on the sample policy."""
    from backends import load_policy
    from backends.policy import score_batch
    from sample_data import POLICY_DIR
    from studio.runs.credit_models import turn_information_gain
    from studio.workers.sync import run_sync

    store = seeded_store
    rid = store.scalar("SELECT rollout_id FROM rollouts WHERE text LIKE '%;%;%' AND finish_reason = 'stop' "
                       "AND correct ORDER BY rollout_id LIMIT 1")
    tok = store.df("SELECT pos, token_id, token_text, step_idx FROM tokens WHERE rollout_id = ? ORDER BY pos", [rid])
    a = int(tok.index[tok["step_idx"] == 0][-1]) + 1  # turn 0: step 1 with its ';'
    b = int(tok.index[tok["step_idx"] == 1][-1]) + 1  # turn 1: step 2, as if a tool had written it
    n = len(tok)
    store.write({"turns": pd.DataFrame({"rollout_id": rid, "turn_idx": [0, 1, 2], "role": ["assistant", "tool",
                                                                                            "assistant"],
                                        "start_pos": [0, a, b], "end_pos": [a, b, n]})})
    with store.transaction() as cur:
        cur.execute("UPDATE token_rows SET trained = pos NOT BETWEEN ? AND ? WHERE rollout_id = ?", [a, b - 1, rid])
    source = run_sync(turn_information_gain, store, POLICY_DIR, [rid])
    got = turn_rewards_of(store, [rid], [source])

    row = store.df("SELECT p.text AS prompt, p.gold FROM rollouts ro JOIN prompts p USING (prompt_id) "
                   "WHERE rollout_id = ?", [rid]).iloc[0]
    gold = queries.prompt_of_row({"prompt": row["prompt"], "gold": row["gold"]}).gold["answer"]
    policy = load_policy(POLICY_DIR)
    ans = policy.tokenizer(f"A:{gold}", add_special_tokens=False)["input_ids"]
    ids = tok["token_id"].astype(int).tolist()
    # P(gold | prompt) and P(gold | prompt, turn 0 and the tool's response after it): the answer's tokens
    # teacher-forced after the stored ids
    gens = score_batch(policy.model, policy.tokenizer, [row["prompt"]] * 2, [ans, ids[:b] + ans])
    p0, p1 = (float(np.exp(g.logprobs[-len(ans):].sum())) for g in gens)
    # the answer turn: the rollout is correct, so P = 1 after it
    assert got["turn_idx"].tolist() == [0, 2]
    assert got["value"].tolist() == pytest.approx([p1 - p0, 1.0 - p1], abs=1e-4)
    assert 0 < p0 < 1 and 0 < p1 < 1
    # a second call computes nothing new and stores no duplicates
    run_sync(turn_information_gain, store, POLICY_DIR, [rid])
    assert store.scalar("SELECT count(*) FROM turn_rewards WHERE source = ?", [source]) == 2


# ---------------------------------------------------------------------------- the sample agent world

def test_credit_over_turns_on_the_sample_agent_world(tmp_path):
    """On the shipped trajectories of the calculator agent: information gain per turn with the
    agent policy, a rule's turn_reward and the turn advantages, end to end."""
    from sample_data import AGENT_POLICY_DIR, AGENT_ROLLOUTS_DIR
    from studio.runs.credit_models import turn_information_gain
    from studio.workers.sync import run_sync

    store = Store.open(tmp_path / "agents.duckdb", seed_dir=AGENT_ROLLOUTS_DIR)
    # a group whose trajectories both succeed and fail, each after at least one tool call
    gid = store.scalar("""SELECT group_id FROM rollouts GROUP BY group_id
                          HAVING bool_or(correct) AND NOT bool_and(correct) AND min(n_tool_calls) > 0
                          ORDER BY group_id LIMIT 1""")
    group = store.df("""SELECT rollout_id, correct, finish_reason, n_turns, n_tool_calls, n_tool_errors FROM rollouts
                        WHERE group_id = ? ORDER BY rollout_id""", [gid])
    rids = group["rollout_id"].tolist()
    source = run_sync(turn_information_gain, store, AGENT_POLICY_DIR, rids)
    ig = turn_rewards_of(store, rids, [source])
    turns = store.df("SELECT rollout_id, turn_idx, role FROM turns WHERE list_contains(?, rollout_id)", [rids])
    # one value per assistant turn, none on the tools' turns
    acting = turns[turns["role"] == "assistant"]
    assert sorted(zip(ig["rollout_id"], ig["turn_idx"])) == sorted(zip(acting["rollout_id"], acting["turn_idx"]))
    # a trajectory that stopped sums to 1[correct] − P(gold | prompt): the same P for the whole group
    sums = ig.groupby("rollout_id")["value"].sum()
    stopped = group[group["finish_reason"] == "stop"]
    p0 = {round(float(stopped["correct"].iloc[i]) - sums[r], 6) for i, r in enumerate(stopped["rollout_id"])}
    assert len(p0) == 1 and 0.0 <= p0.pop() <= 1.0
    # another policy's vocabulary reads the stored ids as another text: refused, nothing stored
    from sample_data import POLICY_DIR
    from studio.workers import TokenizerMismatch

    stored = store.scalar("SELECT count(*) FROM turn_rewards")
    with pytest.raises(TokenizerMismatch, match="not the one that made the rollout"):
        run_sync(turn_information_gain, store, POLICY_DIR, rids)
    assert store.scalar("SELECT count(*) FROM turn_rewards") == stored
    # a rule's turn_reward: every failed call costs 1
    res = rules.apply_rule_sync(store, "def reward(prompt, completion, gold, steps, **ctx):\n    return 0.0\n\n"
                                       "def turn_reward(prompt, turn, gold, **ctx):\n"
                                       "    return -1.0 if turn.error else 0.0\n",
                                "failed-calls", scope=queries.RolloutFilter(group_id=gid), limits=Limits(workers=1))
    assert res.status == "done" and res.failed == 0
    per = turn_rewards_of(store, rids, [res.rule_version_id]).groupby("rollout_id")["value"].sum()
    assert (-per.reindex(rids).to_numpy() == group["n_tool_errors"].to_numpy()).all()
    # turn advantages from information gain: a row per turn, the tools' turns without credit
    for rid in rids:
        t = credit.turn_advantages(store, rid, source, TurnCredit("group", gamma=0.9))
        assert len(t) == group.set_index("rollout_id").loc[rid, "n_turns"]
        assert (t.loc[t["role"] != "assistant", "advantage"] == 0.0).all()
        assert t.loc[t["role"] == "assistant", "reward"].notna().all()
