"""Estimators on literal cases, their SQL twins against the numpy forms, step segmentation
edge cases, information gain against direct log-likelihoods of the sample policy."""
import math

import numpy as np
import pandas as pd
import pytest

from studio import queries
from studio.queries import credit
from studio.runs.credit_models import information_gain
from studio.signals.advantages import (
    Credit,
    dr_grpo,
    entropy_mask,
    gae,
    grpo,
    kl_in_reward,
    kl_token_rewards,
    reinforce_pp,
    rloo,
)
from studio.signals.steps import Segmenter, aggregate, gated, step_advantages, token_spans
from studio.workers.sync import run_sync


def test_sequence_estimators_on_literal_groups():
    r, g = np.array([1.0, 0.0, 0.0, 0.0, 2.0, 2.0]), np.array([0, 0, 0, 0, 1, 1])
    # group 0: mean 0.25 -> Dr. GRPO 0.75 / -0.25; group 1 all equal -> 0
    assert dr_grpo(r, g).tolist() == [0.75, -0.25, -0.25, -0.25, 0.0, 0.0]
    # RLOO: 1 - mean(0,0,0) = 1; 0 - mean(1,0,0) = -1/3
    assert rloo(r, g) == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3, 0.0, 0.0])
    # RLOO is G/(G-1) times Dr. GRPO within a group
    assert rloo(r, g)[:4] == pytest.approx(4 / 3 * dr_grpo(r, g)[:4])
    # REINFORCE++: a = (0.75, -0.25, -0.25, -0.25, 0, 0); mean 0, population std sqrt(0.75/6 ... )
    a = dr_grpo(r, g)
    assert reinforce_pp(r, g) == pytest.approx((a - a.mean()) / (a.std() + 1e-8))
    # two batches are whitened apart: the all-equal batch stays 0
    assert reinforce_pp(r, g, np.array([0, 0, 0, 0, 1, 1]))[4:].tolist() == [0.0, 0.0]


def test_token_estimators_on_literal_cases():
    # GAE with γ = λ = 1 and the outcome only: A_t = R - V(s_t)
    assert gae(np.array([0.0, 0.0, 1.0]), np.array([0.2, 0.6, 0.9])) == pytest.approx([0.8, 0.4, 0.1])
    # γ = 0.5, λ = 1: δ = (0 + .5*.6 - .2, 0 + .5*.9 - .6, 1 - .9) = (.1, -.15, .1); A_2 = .1, A_1 = -.15 + .05, A_0 = .1 - .05
    assert gae(np.array([0.0, 0.0, 1.0]), np.array([0.2, 0.6, 0.9]), gamma=0.5) == pytest.approx([0.05, -0.1, 0.1])
    with pytest.raises(ValueError, match="one value per token"):
        gae(np.zeros(3), np.zeros(2))
    # KL in reward: r = -0.1*(lp - ref) + R at the end
    r1 = kl_token_rewards(np.array([-1.0, -2.0]), np.array([-2.0, -2.0]), 1.0, 0.1)
    assert r1 == pytest.approx([-0.1, 1.0])
    r2 = kl_token_rewards(np.array([-1.0]), np.array([-1.0]), 0.0, 0.1)
    # returns: G = (0.9, 1.0) and (0.0); baseline = mean(0.9, 0.0) = 0.45
    a1, a2 = kl_in_reward([r1, r2], np.array([0, 0]))
    assert a1 == pytest.approx([0.45, 0.55]) and a2 == pytest.approx([-0.45])
    assert entropy_mask(np.array([0.1, 0.5, 0.7]), 0.5).tolist() == [0.0, 1.0, 1.0]


@pytest.mark.parametrize("key,fn", [("grpo", grpo), ("dr_grpo", dr_grpo), ("rloo", rloo)])
def test_sql_twins_equal_the_numpy_forms_on_the_store(seeded_store, key, fn):
    df = queries.rollout_table(seeded_store, queries.RolloutFilter(limit=10**6), None, Credit(key))
    ref = fn(df["reward"].to_numpy(), df["group_id"].to_numpy())
    assert df["advantage"].to_numpy() == pytest.approx(ref, abs=1e-9)
    assert (df["advantage"] != 0).sum() > 100  # the sample has groups with a signal


def test_reinforce_pp_sql_whitens_per_batch_and_scoping_keeps_it(seeded_store):
    full = queries.rollout_table(seeded_store, queries.RolloutFilter(limit=10**6), None, Credit("reinforce_pp"))
    runs = seeded_store.df("SELECT rollout_id, run_id, coalesce(train_step, 0) AS step FROM rollouts")
    full = full.merge(runs, on="rollout_id")
    ref = reinforce_pp(full["reward"].to_numpy(), full["group_id"].to_numpy(),
                       (full["run_id"] + ":" + full["step"].astype(str)).to_numpy())
    assert full["advantage"].to_numpy() == pytest.approx(ref, abs=1e-9)
    # one group's view (as the token strip reads it) gets the same numbers as the whole batch
    rid = full.loc[full["advantage"].abs() > 0.1, "rollout_id"].iloc[0]
    one = queries.rollout(seeded_store, rid, None, Credit("reinforce_pp"))
    assert one["advantage"] == pytest.approx(full.set_index("rollout_id").loc[rid, "advantage"], abs=1e-12)


def _fake_scores(store, rid_list, version, lp_shift=None, values=False):
    toks = store.df("SELECT rollout_id, pos, logprob FROM tokens WHERE list_contains(?, rollout_id)", [rid_list])
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"rollout_id": toks["rollout_id"], "pos": toks["pos"], "policy_version": version,
                          "logprob": (toks["logprob"] - rng.random(len(toks)) * 0.5) if lp_shift else None,
                          "entropy": None, "value": rng.random(len(toks)) if values else None})
    store.write({"token_scores": frame})


def test_kl_and_gae_first_token_in_sql_equal_the_per_token_functions(seeded_store):
    gid = seeded_store.scalar("SELECT group_id FROM rollouts LIMIT 1")
    rids = seeded_store.df("SELECT rollout_id FROM rollouts WHERE group_id = ?", [gid])["rollout_id"].tolist()
    _fake_scores(seeded_store, rids, "ref@1", lp_shift=True)
    _fake_scores(seeded_store, rids, "critic@1", values=True)
    for c in (Credit("kl", beta=0.2, reference="ref@1"), Credit("gae", gamma=0.9, lam=0.8, values="critic@1")):
        grp = queries.group(seeded_store, gid, None, c)
        for rid, a0 in zip(grp["rollout_id"], grp["advantage"]):
            tc = credit.token_advantages(seeded_store, rid, c)
            assert tc.values is not None and len(tc.values) == int(grp.set_index("rollout_id").loc[rid, "n_tokens"])
            assert tc.values[0] == pytest.approx(a0, abs=1e-5)
    # what an estimator lacks is said, not guessed
    assert credit.token_advantages(seeded_store, rids[0], Credit("kl")).note.startswith("pick a reference")
    other = seeded_store.scalar("SELECT rollout_id FROM rollouts WHERE group_id <> ? LIMIT 1", [gid])
    assert "no values from critic@1" in credit.token_advantages(seeded_store, other, Credit("gae", values="critic@1")).note


def test_segmentation_edge_cases():
    assert Segmenter("delimiter", ";").spans(";;a;;b;") == [(2, 3), (5, 6)]  # empty steps dropped
    assert Segmenter("delimiter", "||").spans("no delimiter here") == [(0, 17)]  # missing: one step
    assert Segmenter("regex", r"\.\s+").spans("First. Second.  Third") == [(0, 5), (7, 13), (16, 21)]
    assert Segmenter("newline").spans("a\n\nb\r\nc") == [(0, 1), (3, 4), (6, 7)]
    assert Segmenter("tag", "step").spans("<step>x</step><step> </step><step>yz</step>") == [(6, 7), (34, 36)]
    for bad in (Segmenter("regex", "("), Segmenter("regex", "x*"), Segmenter("delimiter", ""), Segmenter("nope")):
        with pytest.raises(ValueError):
            bad.validate()
    # steps split mid-token: the token with the boundary stays with the earlier step
    assert token_spans(["1+1", "=2;2", "+2=4"], [(0, 5), (6, 11)]) == [(0, 1), (2, 2)]
    assert token_spans(["a;b"], [(0, 1), (2, 3)]) == [(0, 0), (0, 0)]


def test_task_steps_match_the_stored_step_index(seeded_store):
    rid = seeded_store.scalar("SELECT rollout_id FROM rollouts WHERE text LIKE '%;%;%' LIMIT 1")
    text = seeded_store.scalar("SELECT text FROM rollouts WHERE rollout_id = ?", [rid])
    steps = credit.steps_of(seeded_store, rid)
    assert steps["text"].tolist() == text.split(";")[:-1]  # every part before the answer
    by_delim = credit.steps_of(seeded_store, rid, Segmenter("delimiter", ";"))
    assert by_delim["text"].tolist() == text.split(";")  # the answer is a step too here


def test_information_gain_equals_direct_log_likelihoods(seeded_store):
    """IG_k from the worker equals P(gold | prefix) differences computed here with a plain
    forward pass of the sample policy."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sample_data import POLICY_DIR

    rid = seeded_store.scalar("SELECT rollout_id FROM rollouts WHERE text LIKE '%;%;%' LIMIT 1")
    source = run_sync(information_gain, seeded_store, POLICY_DIR, [rid])
    got = credit.step_rewards(seeded_store, rid, source)["value"].to_numpy()
    row = seeded_store.df("""SELECT ro.text, p.text AS prompt, p.gold FROM rollouts ro JOIN prompts p USING (prompt_id)
                             WHERE rollout_id = ?""", [rid]).iloc[0]
    gold = queries.prompt_of_row({"prompt": row["prompt"], "gold": row["gold"]}).gold["answer"]
    tok = AutoTokenizer.from_pretrained(POLICY_DIR)
    model = AutoModelForCausalLM.from_pretrained(POLICY_DIR).eval()

    def p_gold(prefix: str) -> float:
        ctx = tok(row["prompt"])["input_ids"] + tok(prefix, add_special_tokens=False)["input_ids"]
        ans = tok(f"A:{gold}", add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ctx + ans])).logits[0].float(), -1)
        return math.exp(sum(logp[len(ctx) + i - 1, t].item() for i, t in enumerate(ans)))

    parts = row["text"].split(";")[:-1]
    probs = [p_gold("")] + [p_gold(";".join(parts[:k + 1]) + ";") for k in range(len(parts))]
    assert got == pytest.approx(np.diff(probs), abs=1e-4)
    # a second call computes nothing new and stores no duplicates
    run_sync(information_gain, seeded_store, POLICY_DIR, [rid])
    assert seeded_store.scalar("SELECT count(*) FROM step_rewards WHERE source = ?", [source]) == len(parts)


def test_aggregation_gating_step_advantages_and_group_diagnostics(seeded_store):
    assert aggregate([0.2, -0.1, 0.4], "sum") == pytest.approx(0.5)
    assert aggregate([], "min") is None
    assert gated(0.9, [1.0, 1.0], tau=1.0) == 0.9 and gated(1.0, [1.0, 1.0], tau=1.0) == 3.0
    assert [a.tolist() for a in step_advantages([np.ones(2), np.ones(3)])] == [[0.0, 0.0], [0.0, 0.0, 0.0]]
    run = seeded_store.scalar("SELECT run_id FROM runs LIMIT 1")
    z = credit.all_equal_by_step(seeded_store, run)
    groups = queries.groups(seeded_store, run)
    assert z["groups"].sum() == len(groups)
    assert (z["all_equal_share"] * z["groups"]).sum() == pytest.approx(groups["all_equal"].sum())
    ps = credit.prompt_stats(seeded_store, run)
    assert ps["n"].sum() == seeded_store.scalar("SELECT count(*) FROM rollouts WHERE run_id = ?", [run])
    assert set(ps["band"]) <= {"never solved", "hard", "medium", "easy", "always solved"}
    assert (ps.loc[ps["pass_rate"] == 1.0, "band"] == "always solved").all()


def test_step_advantages_are_normalised_over_the_rollout_s_group(seeded_store):
    gid, other = seeded_store.df("SELECT DISTINCT group_id FROM rollouts ORDER BY 1 LIMIT 2")["group_id"]
    a, b = seeded_store.df("SELECT rollout_id FROM rollouts WHERE group_id = ? ORDER BY 1 LIMIT 2", [gid])["rollout_id"]
    far = seeded_store.scalar("SELECT rollout_id FROM rollouts WHERE group_id = ? LIMIT 1", [other])
    # a: steps (1, 0), b: steps (1, 1); a step reward in another group must not move the mean
    rows = [(a, 0, 1.0), (a, 1, 0.0), (b, 0, 1.0), (b, 1, 1.0), (far, 0, -50.0)]
    seeded_store.write({"step_rewards": pd.DataFrame(
        [(r, k, k, k, "lit", v) for r, k, v in rows],
        columns=["rollout_id", "step_idx", "start_pos", "end_pos", "source", "value"])})
    # four values, mean 0.75, sample std 0.5: r~ = +0.5 for a 1 and -1.5 for a 0; suffix sums per rollout
    assert credit.group_step_advantages(seeded_store, a, "lit") == pytest.approx({0: -1.0, 1: -1.5}, abs=1e-3)
    assert credit.group_step_advantages(seeded_store, b, "lit") == pytest.approx({0: 1.0, 1: 0.5}, abs=1e-3)
    assert credit.group_step_advantages(seeded_store, far, "lit") == {0: 0.0}  # alone in its group: nothing to compare
    c = seeded_store.scalar("SELECT rollout_id FROM rollouts WHERE group_id = ? AND rollout_id NOT IN (?, ?) LIMIT 1",
                            [gid, a, b])
    assert credit.group_step_advantages(seeded_store, c, "lit") == {}  # no step rewards of its own


def test_estimators_compared_flag_sign_flips(seeded_store):
    df = credit.compare_estimators(seeded_store, Credit("grpo"), Credit("rloo"))
    assert len(df) == 512 and not df["sign_flip"].any()  # RLOO rescales GRPO's sign-preserving centring
    assert (df["diff"].abs() > 0).any()
