"""Imported runs get every capability: rule scoring with their gold answers, branching after Enrich."""
from __future__ import annotations

import json

import pytest

from sample_data import POLICY_DIR
from studio.ingest.importers import import_run
from studio.rewards.rules import FREE_TEXT_SOURCE, apply_rule_sync
from studio.runs.branch import BranchConfig, branch_sync
from studio.runs.enrich import enrich_sync
from tests.fixtures import trl_log, verl_dump

GOLD_RULE = '''
from studio.rewardlib import math_match


def reward(prompt, completion, gold, steps, **ctx):
    return {"gold_seen": 1.0 if gold.get("answer") else 0.0,
            "accuracy": math_match(ctx["parsed"].answer, gold.get("answer"))}
'''


@pytest.fixture
def verl_run(tmp_path, store_factory):
    store = store_factory("v.duckdb")
    dump = tmp_path / "verl"
    verl_dump(dump, 1, ["Q: 2+3=", "Q: 2+3=", "Q: 7-4=", "Q: 7-4="],
              ["2+3=5;A:5", "2+3=6;A:6", "7-4=3;A:3", "7-4=2;A:2"], ["5", "5", "3", "3"], [1.0, 0.0, 1.0, 0.0], {})
    rep = import_run(store, [dump], "verl")
    return store, rep.run_id


def test_a_verl_run_is_scored_by_a_rule_that_reads_its_gold_answers(verl_run):
    store, run_id = verl_run
    assert store.scalar("SELECT DISTINCT task FROM runs WHERE run_id = ?", [run_id]) == "import"
    res = apply_rule_sync(store, GOLD_RULE, name="gold-check")
    assert res.status == "done", res.message
    got = store.df("""SELECT ro.text, max(rw.value) FILTER (WHERE component = 'gold_seen') AS gold_seen,
                             max(rw.value) FILTER (WHERE component = 'accuracy') AS accuracy
                      FROM rollouts ro JOIN rewards rw USING (rollout_id) WHERE rw.rule_version_id = ?
                      GROUP BY ro.text ORDER BY ro.text""", [res.rule_version_id])
    assert got["gold_seen"].tolist() == [1.0] * 4
    assert dict(zip(got["text"], got["accuracy"], strict=True)) == {
        "2+3=5;A:5": 1.0, "2+3=6;A:6": 0.0, "7-4=2;A:2": 0.0, "7-4=3;A:3": 1.0}
    # the free-text task reads 'A:5' as the answer, verified against the gold one
    assert dict(store.df("SELECT text, correct FROM rollouts").itertuples(index=False)) == {
        "2+3=5;A:5": True, "2+3=6;A:6": False, "7-4=3;A:3": True, "7-4=2;A:2": False}


def test_an_imported_rollout_is_branched_after_enrich(verl_run):
    store, run_id = verl_run
    rid = store.scalar("SELECT rollout_id FROM rollouts WHERE text = '2+3=6;A:6'")
    rep = enrich_sync(store, POLICY_DIR, run_id=run_id)
    assert rep.n_rollouts == 4
    res = branch_sync(store, rid, 4, [None], BranchConfig(n=3, seed=1), policy_path=POLICY_DIR)
    assert res.status == "done", res.error
    kids = store.df("SELECT text, parent_rollout_id, correct FROM rollouts WHERE run_id = ?", [res.run_id])
    assert len(kids) == 3 and set(kids["parent_rollout_id"]) == {rid}
    assert all(t.startswith("2+3=") for t in kids["text"])  # the prefix before the fork is kept
    assert kids["correct"].notna().all()  # verified against the imported gold answer


def test_a_trl_run_with_an_answer_column_is_scored_by_the_free_text_rule_and_branched(tmp_path, store_factory):
    store = store_factory("t.duckdb")
    out = tmp_path / "trl"
    trl_log(out, 1, ["Q: 2+3="] * 4, ["2+3=5;A:5", "2+3=6;A:6", "2+3=5;A:5", "A:7"],
            {"accuracy_reward": [1.0, 0.0, 1.0, 0.0]}, extra={"answer": ["5"] * 4})
    rep = import_run(store, [out], "trl")
    assert rep.n_rollouts == 4
    res = apply_rule_sync(store, FREE_TEXT_SOURCE, name="math")
    assert res.status == "done", res.message
    acc = store.df("SELECT ro.text, rw.value FROM rollouts ro JOIN rewards rw USING (rollout_id) "
                   "WHERE rw.rule_version_id = ? AND rw.component = 'accuracy'", [res.rule_version_id])
    assert sorted(acc["value"].tolist()) == [0.0, 0.0, 1.0, 1.0]
    gold = json.loads(store.scalar("SELECT gold FROM prompts"))
    assert gold["answer"] == "5"
    # and branched once Enrich gave it tokens
    assert enrich_sync(store, POLICY_DIR, run_id=rep.run_id).n_rollouts == 4
    rid = store.scalar("SELECT rollout_id FROM rollouts WHERE text = 'A:7'")
    res = branch_sync(store, rid, 1, [None], BranchConfig(n=2, seed=0), policy_path=POLICY_DIR)
    assert res.status == "done", res.error
    assert store.scalar("SELECT count(*) FROM rollouts WHERE parent_rollout_id = ? AND text LIKE 'A%'", [rid]) == 2
