"""Curated preference data: pair rules on literal groups, step pairs from a real fork tree,
review, staleness, versioned exports read back with ``datasets``, and one DPO step in TRL on
an exported file with the sample policy."""
from __future__ import annotations

import hashlib
import io
import json
import math
import os
import subprocess
import sys
import zipfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local: never touch the Hub
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from sample_data import POLICY_DIR, ROLLOUTS_DIR  # noqa: E402
from studio import curation, queries  # noqa: E402
from studio.curation import CurationError, NothingToExport, PairRule, StalePairsError, build_pairs  # noqa: E402
from studio.face.cli import curate  # noqa: E402
from studio.store import Store  # noqa: E402
from studio.store.records import now  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
V = "lit@1"  # the literal stores' reward version


# ---------------------------------------------------------------------------- literal stores

def literal_store(path, rollouts: list[tuple]) -> Store:
    """A store of hand-made rollouts: ``(rollout_id, group_id, prompt, text, n_tokens, total,
    accuracy)``; every rollout scored by version ``V`` with ``total`` and ``accuracy``, and correct (the
    rollout's own fact) where its accuracy is 1."""
    store = Store.open(path)
    t = now()
    prompts = sorted({r[2] for r in rollouts})
    pid = {p: f"p{i}" for i, p in enumerate(prompts)}
    store.write({
        "runs": pd.DataFrame([{"run_id": "run1", "kind": "import", "name": "literal", "policy": "lit-policy",
                               "task": "arithmetic", "created_at": t, "status": "done"}]),
        "prompts": pd.DataFrame([{"prompt_id": pid[p], "task": "arithmetic", "text": p, "gold": "{}"}
                                 for p in prompts]),
        "rule_versions": pd.DataFrame([{"rule_version_id": V, "name": "lit", "source": "# literal", "sha256": "0",
                                        "created_at": t, "note": ""}]),
        "rollouts": pd.DataFrame([{"rollout_id": r[0], "run_id": "run1", "prompt_id": pid[r[2]], "group_id": r[1],
                                   "sample_idx": i, "text": r[3], "n_tokens": r[4], "created_at": t,
                                   "correct": r[6] >= 1.0} for i, r in enumerate(rollouts)]),
        "rewards": pd.DataFrame([(r[0], V, c, v) for r in rollouts for c, v in (("total", r[5]), ("accuracy", r[6]))],
                                columns=["rollout_id", "rule_version_id", "component", "value"]),
    })
    return store


# one group of one prompt: a and d are the same right answer, b and c two wrong ones
GROUP_1 = [
    ("ra", "g1", "Q: 2+3=", "2+3=5;A:5", 10, 1.35, 1.0),
    ("rb", "g1", "Q: 2+3=", "2+3=6;A:6 and more text", 20, 0.10, 0.0),
    ("rc", "g1", "Q: 2+3=", "2+3=5;A:6", 11, 0.35, 0.0),
    ("rd", "g1", "Q: 2+3=", "2+3=5;A:5", 10, 1.35, 1.0),
]
ALL_EQUAL = [("re", "g2", "Q: 1+1=", "1+1=2;A:2", 9, 1.35, 1.0), ("rf", "g2", "Q: 1+1=", "1+1=2; A:2", 10, 1.35, 1.0)]


def pairs_of(store, build_id=None) -> set[tuple[str, str]]:
    where, params = ("WHERE build_id = ?", [build_id]) if build_id else ("", [])
    return set(store.cursor().execute(f"SELECT chosen_rollout_id, rejected_rollout_id FROM pairs {where}",
                                      params).fetchall())


@pytest.fixture()
def lit(tmp_path):
    store = literal_store(tmp_path / "lit.duckdb", GROUP_1 + ALL_EQUAL)
    yield store
    store.close()


@pytest.mark.parametrize("rule, expected", [
    # the largest margin of the group: a (1.35) over b (0.10); d is a's twin and counts once
    (PairRule("best_vs_worst"), {("ra", "rb")}),
    # every right x wrong pair, twins once
    (PairRule("correct_vs_incorrect"), {("ra", "rb"), ("ra", "rc")}),
    (PairRule("correct_vs_incorrect", dedupe=False), {("ra", "rb"), ("ra", "rc"), ("rd", "rb"), ("rd", "rc")}),
    # every pair whose rewards differ (never a with its twin d, never the all-equal group)
    (PairRule("all_pairs"), {("ra", "rb"), ("ra", "rc"), ("rc", "rb")}),
    # c over b by 0.25 falls under a 0.5 margin
    (PairRule("all_pairs", min_margin=0.5), {("ra", "rb"), ("ra", "rc")}),
    (PairRule("all_pairs", min_margin=1.25), {("ra", "rb")}),  # a margin exactly at the minimum is kept
    # lengths 10 / 20 / 11 tokens: |10-20|/20 = 0.5 and |11-20|/20 = 0.45 fail 0.2, |10-11|/11 = 0.09 passes
    (PairRule("all_pairs", length_match=0.2), {("ra", "rc")}),
    # best vs worst among the length-matched pairs: the largest margin left
    (PairRule("best_vs_worst", length_match=0.2), {("ra", "rc")}),
    # one pair per prompt, the largest margin
    (PairRule("all_pairs", per_prompt_cap=1), {("ra", "rb")}),
    (PairRule("all_pairs", per_prompt_cap=2), {("ra", "rb"), ("ra", "rc")}),
    # another component says what is right: accuracy >= 0.5 is the same split here; total >= 0.3 makes c right
    (PairRule("correct_vs_incorrect", correct_component="total", correct_threshold=0.3), {("ra", "rb"), ("rc", "rb")}),
])
def test_pair_rules_on_a_literal_group(lit, rule, expected):
    res = build_pairs(lit, rule, rule_version_id=V)
    assert pairs_of(lit) == expected and res.added == res.pairs == len(expected)
    row = lit.df("SELECT * FROM pairs ORDER BY margin DESC LIMIT 1").iloc[0]
    rewards = {r[0]: r[5] for r in GROUP_1}
    assert row["chosen_reward"] == rewards[row["chosen_rollout_id"]]
    assert row["rejected_reward"] == rewards[row["rejected_rollout_id"]]
    assert row["margin"] == pytest.approx(row["chosen_reward"] - row["rejected_reward"])
    assert row["status"] == "pending" and row["kind"] == "completion" and row["source"] == "rule"
    assert row["rule"] == rule.name and row["rule_version_id"] == V and not row["swapped"]
    assert json.loads(row["params"]) == rule.params()


def test_pairs_within_a_prompt_dedupe_across_groups_and_a_second_build_adds_nothing(tmp_path):
    # two groups of one prompt with the same texts, and a third with another right answer
    rows = [("ra", "g1", "Q: 7+1=", "7+1=8;A:8", 8, 1.35, 1.0), ("rb", "g1", "Q: 7+1=", "7+1=9;A:9", 8, 0.1, 0.0),
            ("rc", "g2", "Q: 7+1=", "7+1=8;A:8", 8, 1.35, 1.0), ("rd", "g2", "Q: 7+1=", "7+1=9;A:9", 8, 0.1, 0.0),
            ("re", "g3", "Q: 7+1=", "1+7=8;A:8", 8, 1.35, 1.0), ("rf", "g3", "Q: 7+1=", "7+1=9;A:9", 8, 0.1, 0.0)]
    store = literal_store(tmp_path / "s.duckdb", rows)
    first = build_pairs(store, PairRule("best_vs_worst"), rule_version_id=V)
    # g2's pair is g1's texts again: kept once; g3's right answer is another text
    assert pairs_of(store) == {("ra", "rb"), ("re", "rf")} and first.added == 2
    again = build_pairs(store, PairRule("best_vs_worst"), rule_version_id=V)
    assert again.added == 0 and again.pairs == 2 and again.build_id is None and "stored already" in again.message
    assert store.scalar("SELECT count(*) FROM pair_builds") == 1
    # another rule making the same texts from other rollouts adds nothing; without dedupe it adds g2's pair
    other = build_pairs(store, PairRule("correct_vs_incorrect"), rule_version_id=V)
    assert other.added == 0
    loose = build_pairs(store, PairRule("correct_vs_incorrect", dedupe=False), rule_version_id=V)
    assert pairs_of(store, loose.build_id) == {("rc", "rd")}
    # across the prompt's groups: every right text over every wrong one, each text pair once
    store2 = literal_store(tmp_path / "s2.duckdb", rows)
    build_pairs(store2, PairRule("correct_vs_incorrect", within="prompt"), rule_version_id=V)
    got = store2.df("""SELECT c.text AS chosen, r.text AS rejected FROM pairs p
                       JOIN rollouts c ON c.rollout_id = p.chosen_rollout_id
                       JOIN rollouts r ON r.rollout_id = p.rejected_rollout_id""")
    assert sorted(map(tuple, got.values.tolist())) == [("1+7=8;A:8", "7+1=9;A:9"), ("7+1=8;A:8", "7+1=9;A:9")]
    store.close(), store2.close()


def test_bad_rules_and_versions_are_refused_with_what_to_change(lit):
    with pytest.raises(CurationError, match="pair rule must be one of"):
        build_pairs(lit, PairRule("longest"))
    with pytest.raises(CurationError, match=r"length match \(a share\) must be 0-1, got 2.0"):
        build_pairs(lit, PairRule(length_match=2.0))
    with pytest.raises(CurationError, match="per-prompt cap must be at least 1, got 0"):
        build_pairs(lit, PairRule(per_prompt_cap=0))
    with pytest.raises(CurationError, match="no reward version 'nope@1'"):
        build_pairs(lit, rule_version_id="nope@1")
    with pytest.raises(CurationError, match="has no 'format' component.*accuracy, total"):
        build_pairs(lit, PairRule("correct_vs_incorrect", correct_component="format"), rule_version_id=V)
    assert lit.scalar("SELECT count(*) FROM pairs") == 0
    # the default version is the one that scored the scope
    assert curation.default_version(lit) == V
    empty = build_pairs(lit, PairRule(), scope=queries.RolloutFilter(group_id="g2"))
    assert empty.pairs == 0 and "no pairs in scope" in empty.message


# ---------------------------------------------------------------------------- the sample store

@pytest.fixture()
def out(tmp_path):
    """An empty folder for exports (the store lives in tmp_path)."""
    folder = tmp_path / "out"
    folder.mkdir()
    return folder


@pytest.fixture()
def built(seeded_store):
    """The sample rollouts with best-vs-worst pairs under the built-in rule."""
    res = build_pairs(seeded_store, PairRule("best_vs_worst"))
    assert res.added > 20
    return seeded_store, res


def test_default_version_is_the_task_rule_and_scopes_select_rollouts(seeded_store):
    from studio.rewards import ARITHMETIC_V1

    assert curation.default_version(seeded_store) == ARITHMETIC_V1.version_id
    gid = seeded_store.scalar("""SELECT group_id FROM rollouts ro JOIN rewards rw USING (rollout_id)
                                 WHERE rw.component = 'total' GROUP BY 1 HAVING max(value) > min(value) LIMIT 1""")
    one = build_pairs(seeded_store, PairRule("all_pairs"), scope=queries.RolloutFilter(group_id=gid))
    ids = seeded_store.df("SELECT chosen_rollout_id AS a, rejected_rollout_id AS b FROM pairs")
    inside = set(seeded_store.df("SELECT rollout_id FROM rollouts WHERE group_id = ?", [gid])["rollout_id"])
    assert one.added > 0 and set(ids["a"]) | set(ids["b"]) <= inside
    assert json.loads(seeded_store.scalar("SELECT scope FROM pair_builds")) == {"group_id": gid}
    # a filter on correctness keeps right answers only: no right x wrong pair remains in it
    right = build_pairs(seeded_store, PairRule("correct_vs_incorrect"), scope=queries.RolloutFilter(correct=True))
    assert right.pairs == 0


def test_review_queue_decisions_and_progress(built):
    store, res = built
    q = curation.queue(store, limit=5)
    assert len(q) == 5 and (q["status"] == "pending").all() and q["stale"].isna().all()
    assert (q["chosen_reward"] > q["rejected_reward"]).all()
    assert {"accuracy", "format", "steps", "total"} <= set(q["chosen_components"].iloc[0])
    assert q["chosen_components"].iloc[0]["total"] == q["chosen_reward"].iloc[0]
    a, b, c = q["pair_id"].iloc[:3]
    assert curation.accept(store, [a, b], reviewer="ann") == 2
    assert curation.reject(store, [c], reviewer="bob") == 1
    assert curation.swap(store, [b], reviewer="ann") == 1
    assert curation.set_note(store, a, "clean carry", reviewer="ann") == 1
    p = curation.progress(store)
    assert p == {"total": res.added, "pending": res.added - 3, "accepted": 2, "rejected": 1, "stale": 0,
                 "reviewed": 3}
    assert "stale" not in curation.progress(store, stale=False)
    assert curation.progress(store, res.build_id)["total"] == res.added
    # pending first: the decided ones move to the end of the queue
    order = curation.queue(store, limit=res.added)
    assert order["status"].tolist() == ["pending"] * (res.added - 3) + ["accepted"] * 2 + ["rejected"]
    acc = curation.queue(store, status="accepted").set_index("pair_id")
    before = q.set_index("pair_id")
    # the swapped pair reads the other way round, everywhere the queue shows it
    assert acc.loc[b, "chosen_rollout_id"] == before.loc[b, "rejected_rollout_id"]
    assert acc.loc[b, "chosen_text"] == before.loc[b, "rejected_text"]
    assert acc.loc[b, "margin"] == pytest.approx(-before.loc[b, "margin"]) and acc.loc[b, "swapped"]
    assert acc.loc[a, "note"] == "clean carry" and acc.loc[a, "reviewer"] == "ann"
    assert curation.swap(store, [b]) == 1  # a second swap undoes the first
    assert not curation.queue(store, status="accepted").set_index("pair_id").loc[b, "swapped"]
    with pytest.raises(CurationError, match="1 pair id\\(s\\) are not in this store: pr-missing"):
        curation.accept(store, [a, "pr-missing"])
    with pytest.raises(CurationError, match="say which pairs"):
        curation.accept(store)
    # bulk: the rest of the build, pending ones only (the rejected one stays rejected)
    assert curation.accept(store, build_id=res.build_id, only_pending=True, reviewer="ann") == res.added - 3
    assert curation.progress(store)["rejected"] == 1


def test_hand_picked_pairs(seeded_store):
    g = queries.group(seeded_store, queries.groups(seeded_store).iloc[0]["group_id"])
    a, b = g["rollout_id"].iloc[0], g["rollout_id"].iloc[1]
    pid = curation.hand_pick(seeded_store, b, a, note="b reads better", reviewer="ann")
    row = seeded_store.df("SELECT * FROM pairs WHERE pair_id = ?", [pid]).iloc[0]
    assert (row["chosen_rollout_id"], row["rejected_rollout_id"]) == (b, a)
    assert (row["source"], row["status"]) == ("hand", "accepted")
    assert row["kind"] == "completion" and row["reviewer"] == "ann" and row["note"] == "b reads better"
    rewards = g.set_index("rollout_id")["reward"]
    assert row["chosen_reward"] == rewards[b] and row["rejected_reward"] == rewards[a]
    # picking it again updates it, never duplicates it
    assert curation.hand_pick(seeded_store, b, a, status="rejected") == pid
    assert seeded_store.scalar("SELECT count(*) FROM pairs") == 1
    assert seeded_store.scalar("SELECT status FROM pairs") == "rejected"
    other = seeded_store.scalar("SELECT rollout_id FROM rollouts WHERE prompt_id <> ? LIMIT 1",
                                [g["prompt_id"].iloc[0]])
    with pytest.raises(CurationError, match="answer different prompts"):
        curation.hand_pick(seeded_store, a, other)
    with pytest.raises(CurationError, match="are the same"):
        curation.hand_pick(seeded_store, a, a)
    with pytest.raises(CurationError, match="the rejected rollout r-gone is not in this store"):
        curation.hand_pick(seeded_store, a, "r-gone")


# ---------------------------------------------------------------------------- step pairs

def test_step_pairs_from_a_real_fork_tree(seeded_store, tmp_path):
    from tokenizers import Tokenizer

    from studio.queries import forks
    from studio.runs.branch import BranchConfig, branch_sync

    # a right rollout, forked at the answer's first digit: forcing another digit makes the answer wrong
    rid = queries.rollout_table(seeded_store, queries.RolloutFilter(correct=True)).iloc[0]["rollout_id"]
    toks = queries.tokens(seeded_store, rid)
    text = "".join(toks["token_text"])
    pos = len(text[:text.index("A:") + 2])  # one character per token in the sample tokenizer
    digit = toks["token_text"].iloc[pos]
    other = next(d for d in "123456789" if d != digit)
    forced = Tokenizer.from_file(str(POLICY_DIR / "tokenizer.json")).token_to_id(other)
    res = branch_sync(seeded_store, rid, pos, [forced, None], BranchConfig(n=3, seed=11))
    assert res.status == "done" and res.rollouts == 6

    built = build_pairs(seeded_store, PairRule("all_pairs", level="step"),
                        scope=queries.RolloutFilter(run_id=res.run_id))
    assert built.added > 0
    pairs = seeded_store.df("""
        SELECT p.*, c.text AS ctext, r.text AS rtext, c.parent_rollout_id AS cparent, r.parent_rollout_id AS rparent
        FROM pairs p JOIN rollouts c ON c.rollout_id = p.chosen_rollout_id
        JOIN rollouts r ON r.rollout_id = p.rejected_rollout_id""")
    tree = set(forks.tree(seeded_store, rid)["rollout_id"])
    assert (pairs["kind"] == "step").all() and (pairs["margin"] > 0).all()
    forced_ids = set(seeded_store.df("SELECT rollout_id FROM rollouts WHERE forced_token_id = ?",
                                     [forced])["rollout_id"])
    for p in pairs.itertuples():
        assert {p.chosen_rollout_id, p.rejected_rollout_id} <= tree  # siblings: the root and its branches at pos
        assert p.ctext.startswith(p.prefix) and p.rtext.startswith(p.prefix)
        assert p.prefix_tokens >= pos and p.prefix.startswith(text[:pos])
        # the longest shared prefix: the continuations differ at once
        assert p.ctext[len(p.prefix):][:1] != p.rtext[len(p.prefix):][:1]
    # the forced wrong digit loses to the parent's right answer
    assert any(p.chosen_rollout_id == rid and p.rejected_rollout_id in forced_ids for p in pairs.itertuples())

    # exported, the prefix joins the prompt and the completions are the continuations
    curation.accept(seeded_store, build_id=built.build_id)
    out = curation.export(seeded_store, tmp_path / "steps.jsonl")
    rows = [json.loads(line) for line in out.path.read_text().splitlines()]
    prompt = queries.rollout(seeded_store, rid)["prompt"]
    texts = dict(seeded_store.df("SELECT rollout_id, text FROM rollouts").values.tolist())
    by_id = pairs.set_index("pair_id")
    for row, pid in zip(rows, sorted(by_id.index)):
        p = by_id.loc[pid]
        assert row["prompt"] == prompt + p["prefix"]
        assert row["prompt"] + row["chosen"] == prompt + texts[p["chosen_rollout_id"]]
        assert row["prompt"] + row["rejected"] == prompt + texts[p["rejected_rollout_id"]]
    assert json.loads(out.provenance_path.read_text())["kinds"] == {"step": len(rows)}
    # a message cannot end mid-answer: conversational, the prefix starts both assistant messages
    conv = curation.export(seeded_store, tmp_path / "conv.jsonl", style="conversational")
    for row, pid in zip(map(json.loads, conv.path.read_text().splitlines()), sorted(by_id.index)):
        p = by_id.loc[pid]
        assert row["prompt"] == [{"role": "user", "content": prompt}]
        assert row["chosen"] == [{"role": "assistant", "content": texts[p["chosen_rollout_id"]]}]
        assert row["rejected"] == [{"role": "assistant", "content": texts[p["rejected_rollout_id"]]}]
    # a hand pick of two branches of the fork is a step pair too
    a, b = sorted(forced_ids)[:2]
    hp = curation.hand_pick(seeded_store, a, b)
    assert seeded_store.scalar("SELECT kind FROM pairs WHERE pair_id = ?", [hp]) == "step"


# ---------------------------------------------------------------------------- staleness and bad input

def test_stale_pairs_are_flagged_and_never_exported_silently(built, out):
    store, res = built
    q = curation.queue(store, limit=4)
    ids = q["pair_id"].tolist()
    curation.accept(store, ids)
    gone, rescored = q.iloc[0], q.iloc[1]
    with store.transaction() as cur:  # a rollout deleted, another one's reward rewritten under the same version
        cur.execute("DELETE FROM rollouts WHERE rollout_id = ?", [gone["rejected_rollout_id"]])
        cur.execute("UPDATE rewards SET value = value + 0.5 WHERE rollout_id = ? AND rule_version_id = ? "
                    "AND component = 'total'", [rescored["chosen_rollout_id"], rescored["rule_version_id"]])
    stale = curation.stale_pairs(store).set_index("pair_id")
    assert set(stale.index) == {gone["pair_id"], rescored["pair_id"]}
    assert stale.loc[gone["pair_id"], "stale"] == "deleted"
    assert stale.loc[gone["pair_id"], "stale_detail"] == f"rejected rollout {gone['rejected_rollout_id']} deleted"
    assert stale.loc[rescored["pair_id"], "stale"] == "rescored"
    assert "is now" in stale.loc[rescored["pair_id"], "stale_detail"]
    assert curation.progress(store)["stale"] == 2
    assert curation.queue(store, status="accepted").set_index("pair_id").loc[gone["pair_id"], "stale"] == "deleted"

    with pytest.raises(StalePairsError, match="2 of 4 accepted pairs are stale \\(1 with a deleted rollout, 1 "
                                              "re-scored since they were built\\).*nothing was written") as err:
        curation.export(store, out / "p.jsonl")
    assert set(err.value.stale["pair_id"]) == set(stale.index)
    assert list(out.iterdir()) == [] and store.scalar("SELECT count(*) FROM exports") == 0
    out = curation.export(store, out / "p.jsonl", skip_stale=True)
    assert out.rows == 2 and out.skipped_stale == 2 and "left out 2 stale pairs" in out.message
    prov = json.loads(out.provenance_path.read_text())
    assert prov["skipped_stale"]["by_reason"] == {"deleted": 1, "rescored": 1}
    assert {p["pair_id"] for p in prov["skipped_stale"]["pairs"]} == set(stale.index)
    assert {p["pair_id"] for p in prov["pair_decisions"]} == set(ids) - set(stale.index)
    # building the rule again refreshes the re-scored pair (new rewards, back to pending); the deleted one stays stale
    again = build_pairs(store, PairRule("best_vs_worst"))
    assert again.added == 0 and "1 stored pair re-scored since refreshed" in again.message
    left = curation.stale_pairs(store, status=None)
    assert left["pair_id"].tolist() == [gone["pair_id"]]
    row = store.df("SELECT status, chosen_reward FROM pairs WHERE pair_id = ?", [rescored["pair_id"]]).iloc[0]
    assert row["status"] == "pending" and row["chosen_reward"] == pytest.approx(rescored["chosen_reward"] + 0.5)


def test_exporting_nothing_says_so(built, out):
    store, res = built
    with pytest.raises(NothingToExport, match=f"no accepted pair; {res.added} pairs await review"):
        curation.export(store, out / "p.jsonl")
    with pytest.raises(NothingToExport, match="no accepted pair matches the filter"):
        curation.export(store, out / "p.jsonl", build_id="b-other")
    curation.accept(store, build_id=res.build_id)
    with pytest.raises(NothingToExport, match="none of the exported rollouts has step rewards"):
        curation.export(store, out / "s.jsonl", format="stepwise")
    with pytest.raises(CurationError, match="cannot tell the file type from 'p.csv'"):
        curation.export(store, out / "p.csv")
    with pytest.raises(CurationError, match="stepwise supervision format is standard"):
        curation.export(store, out / "s.jsonl", format="stepwise", style="conversational")
    with pytest.raises(CurationError, match="does not exist; create it"):
        curation.export(store, out / "missing" / "p.jsonl")
    assert list(out.iterdir()) == [] and store.scalar("SELECT count(*) FROM exports") == 0


def test_an_existing_path_is_versioned_and_only_overwritten_when_asked(built, out):
    store, res = built
    curation.accept(store, build_id=res.build_id)
    first = curation.export(store, out / "p.jsonl")
    digest = hashlib.sha256(first.path.read_bytes()).hexdigest()
    assert first.path == out / "p.jsonl" and first.sha256 == digest
    second = curation.export(store, out / "p.jsonl")
    assert second.path == out / "p-2.jsonl" and "p.jsonl exists, so a new version" in second.message
    assert hashlib.sha256(first.path.read_bytes()).hexdigest() == digest  # untouched
    (out / "p-3.jsonl.provenance.json").write_text("{}")  # a lone sidecar also takes the name
    assert curation.export(store, out / "p.jsonl").path == out / "p-4.jsonl"
    again = curation.export(store, out / "p.jsonl", format="unpaired", overwrite=True)
    assert again.path == out / "p.jsonl" and "overwrote the previous file" in again.message
    assert json.loads(again.path.read_text().splitlines()[0]).keys() == {"prompt", "completion", "label"}
    assert json.loads(curation.sidecar_of(again.path).read_text())["format"] == "unpaired"
    folder = curation.export(store, out / "ds")
    assert curation.export(store, out / "ds").path == out / "ds-2" and folder.filetype == "datasets"
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "ds", "ds-2", "ds-2.provenance.json", "ds.provenance.json", "p-2.jsonl", "p-2.jsonl.provenance.json",
        "p-3.jsonl.provenance.json", "p-4.jsonl", "p-4.jsonl.provenance.json", "p.jsonl", "p.jsonl.provenance.json"]
    assert store.scalar("SELECT count(*) FROM exports") == 6
    # overwrite replaces an export, never a folder that is not one
    mine = out / "notes"
    mine.mkdir()
    (mine / "keep.txt").write_text("mine")
    with pytest.raises(CurationError, match="is a folder that is not a datasets export; it was left as it is"):
        curation.export(store, mine, filetype="datasets", overwrite=True)
    assert (mine / "keep.txt").read_text() == "mine" and store.scalar("SELECT count(*) FROM exports") == 6
    assert curation.export(store, out / "ds", overwrite=True).path == out / "ds"


# ---------------------------------------------------------------------------- exports read back

STEP_RULE = '''from studio.rewardlib import answer_correct


def reward(prompt, completion, gold, steps, **ctx):
    right = answer_correct(ctx["parsed"], gold, ctx["task"])
    return {"accuracy": right, "total": right}


def step_reward(prompt, step, gold, **ctx):
    return 1.0 if step.correct else 0.0
'''


@pytest.fixture(scope="module")
def exported_store(tmp_path_factory):
    """The sample store with accepted pairs: best vs worst per group (two of them swapped) and
    step rewards from a rule with a step_reward (the stepwise labels)."""
    from studio.rewards import rules

    path = tmp_path_factory.mktemp("exp") / "studio.duckdb"
    store = Store.open(path, seed_dir=ROLLOUTS_DIR)
    res = build_pairs(store, PairRule("best_vs_worst"))
    curation.accept(store, build_id=res.build_id, reviewer="ann")
    curation.swap(store, curation.queue(store, limit=2)["pair_id"].tolist(), reviewer="ann")
    step = rules.apply_rule_sync(store, STEP_RULE, "steps-only")
    assert step.status == "done"
    yield store, res, step.rule_version_id
    store.close()


def _features(fmt: str, style: str):
    from datasets import Features, List, Value

    s, b = Value("string"), Value("bool")
    msgs = List({"role": s, "content": s})
    text = msgs if style == "conversational" else s
    return Features({
        "preference": {"prompt": text, "chosen": text, "rejected": text},
        "unpaired": {"prompt": text, "completion": text, "label": b},
        "stepwise": {"prompt": s, "completions": List(s), "labels": List(b)},
    }[fmt])


def _read(path: Path, filetype: str, cache):
    import datasets

    if filetype == "datasets":
        return datasets.load_from_disk(str(path))
    return datasets.load_dataset("json" if filetype == "jsonl" else "parquet", data_files=str(path), split="train",
                                 cache_dir=str(cache))


@pytest.mark.parametrize("filetype", ["jsonl", "parquet", "datasets"])
@pytest.mark.parametrize("fmt, style", [("preference", "standard"), ("preference", "conversational"),
                                        ("unpaired", "standard"), ("unpaired", "conversational"),
                                        ("stepwise", "standard")])
def test_exports_read_back_with_datasets_in_trls_columns_and_types(exported_store, tmp_path, fmt, style, filetype):
    from trl.data_utils import is_conversational

    store, res, _ = exported_store
    name = {"jsonl": "out.jsonl", "parquet": "out.parquet", "datasets": "out"}[filetype]
    out = curation.export(store, tmp_path / name, fmt, style)
    assert out.filetype == filetype
    ds = _read(out.path, filetype, tmp_path / "cache")
    assert ds.features == _features(fmt, style)
    assert len(ds) == out.rows > 0
    assert is_conversational(ds[0]) == (style == "conversational")
    q = curation.queue(store, status="accepted", limit=10_000)
    if fmt == "preference":
        assert len(ds) == len(q) == res.added
        got = {(r["prompt"], r["chosen"], r["rejected"]) if style == "standard" else
               (r["prompt"][0]["content"], r["chosen"][0]["content"], r["rejected"][0]["content"]) for r in ds}
        assert got == set(zip(q["prompt"], q["chosen_text"], q["rejected_text"]))  # swaps honoured
        if style == "conversational":
            assert [m["role"] for m in ds[0]["prompt"] + ds[0]["chosen"]] == ["user", "assistant"]
    elif fmt == "unpaired":
        lab = {(r["prompt"] if style == "standard" else r["prompt"][0]["content"],
                r["completion"] if style == "standard" else r["completion"][0]["content"], r["label"]) for r in ds}
        assert lab == ({(p, c, True) for p, c in zip(q["prompt"], q["chosen_text"])}
                       | {(p, r, False) for p, r in zip(q["prompt"], q["rejected_text"])})
    else:
        texts = dict(store.df("SELECT rollout_id, text FROM rollouts").values.tolist())
        sides = set(q["chosen_rollout_id"]) | set(q["rejected_rollout_id"])
        assert len(ds) == len(sides)
        assert {"".join(r["completions"]) for r in ds} == {texts[s] for s in sides}
        assert all(len(r["completions"]) == len(r["labels"]) >= 1 for r in ds)


def test_stepwise_labels_are_the_step_rewards_then_the_answer(exported_store, tmp_path):
    from studio.tasks import get_task

    store, _, step_source = exported_store
    out = curation.export(store, tmp_path / "s.jsonl", "stepwise", step_source=step_source)
    task = get_task("arithmetic")
    rows = [json.loads(line) for line in out.path.read_text().splitlines()]
    for row in rows:
        prompt = task.parse_prompt(row["prompt"])
        parsed = task.parse_completion(prompt, "".join(row["completions"]))
        # one labelled piece per task step (step reward = the step's verdict), then the answer line
        expected = [bool(s.correct) for s in parsed.steps]  # an unverifiable step (None) scored 0
        tail = "".join(row["completions"])[parsed.steps[-1].end + 1:] if parsed.steps else ""
        if tail:
            expected.append(task.is_correct(prompt, parsed.answer))
        assert row["labels"] == expected, row
    prov = json.loads(out.provenance_path.read_text())
    assert prov["step_labels"]["source"] == step_source and prov["step_labels"]["label"] == "step reward > 0.5"
    no_answer = curation.export(store, tmp_path / "s2.jsonl", "stepwise", answer_step=False)
    assert all(not r["labels"] or len(r["labels"]) <= len(s["labels"])
               for r, s in zip(map(json.loads, no_answer.path.read_text().splitlines()), rows))


def test_unpaired_matches_trls_unpairing_and_drops_conflicting_labels(lit, tmp_path):
    from datasets import Dataset
    from trl.data_utils import unpair_preference_dataset

    res = build_pairs(lit, PairRule("all_pairs"), rule_version_id=V)  # a > c > b: c is chosen once, rejected once
    curation.accept(lit, build_id=res.build_id)
    pref = curation.export(lit, tmp_path / "pref.jsonl")
    trl_rows = unpair_preference_dataset(Dataset.from_list([json.loads(x) for x in pref.path.read_text().splitlines()]))
    everything = {(r["prompt"], r["completion"], r["label"]) for r in trl_rows}
    kept = curation.export(lit, tmp_path / "keep.jsonl", "unpaired", conflicts="keep")
    mine = [json.loads(x) for x in kept.path.read_text().splitlines()]
    assert {(r["prompt"], r["completion"], r["label"]) for r in mine} == everything and len(mine) == 4
    dropped = curation.export(lit, tmp_path / "drop.jsonl", "unpaired")
    rows = [json.loads(x) for x in dropped.path.read_text().splitlines()]
    assert {(r["completion"], r["label"]) for r in rows} == {("2+3=5;A:5", True), ("2+3=6;A:6 and more text", False)}
    prov = json.loads(dropped.provenance_path.read_text())
    assert prov["unpaired"] == {"conflicts": "drop", "conflicting_completions": 1}


def test_provenance_in_the_sidecar_and_the_store(exported_store, tmp_path):
    store, res, _ = exported_store
    out = curation.export(store, tmp_path / "p.parquet")
    prov = json.loads(out.provenance_path.read_text())
    assert prov["sha256"] == hashlib.sha256(out.path.read_bytes()).hexdigest() == out.sha256
    assert prov["rows"] == out.rows == res.added and prov["pairs"] == res.added and prov["file"] == "p.parquet"
    run = store.df("SELECT run_id, policy FROM runs").iloc[0]
    assert [r["run_id"] for r in prov["runs"]] == [run["run_id"]]
    assert run["policy"] in prov["policies"] and any(p.startswith("policy@") for p in prov["policies"])
    assert [v["rule_version_id"] for v in prov["rule_versions"]] == [res.rule_version_id]
    assert prov["pair_rules"][0]["build_id"] == res.build_id and prov["pair_rules"][0]["rule"] == "best_vs_worst"
    assert prov["pair_rules"][0]["params"] == PairRule("best_vs_worst").params()
    assert prov["filters"]["status"] == "accepted" and prov["filters"]["skip_stale"] is False
    by = prov["decisions"]["by_reviewer"]
    assert by == [{**by[0], "reviewer": "ann", "pairs": res.added, "swapped": 2, "noted": 0}]
    decisions = {d["pair_id"]: d for d in prov["pair_decisions"]}
    assert len(decisions) == res.added and all(d["reviewer"] == "ann" and d["decided_at"] for d in decisions.values())
    assert sum(d["swapped"] for d in decisions.values()) == 2
    assert prov["created_at"].endswith("Z") and prov["studio_version"]
    # the store keeps the summary and every pair's decision at the time of the export
    row = store.df("SELECT * FROM exports WHERE export_id = ?", [out.export_id]).iloc[0]
    assert row["sha256"] == out.sha256 and row["path"] == str(out.path) and row["n_pairs"] == res.added
    assert curation.export_provenance(store, out.export_id)["pair_rules"] == prov["pair_rules"]
    snap = store.df("SELECT * FROM export_pairs WHERE export_id = ?", [out.export_id])
    assert set(snap["pair_id"]) == set(decisions) and snap["swapped"].sum() == 2
    assert out.export_id in set(curation.exports(store)["export_id"])


def test_download_bytes(exported_store, tmp_path):
    import datasets

    store, res, _ = exported_store
    name, data, prov = curation.export_bytes(store, "preference", "jsonl")
    assert name.endswith(".jsonl") and len(data.decode().splitlines()) == res.added
    assert prov["sha256"] == hashlib.sha256(data).hexdigest()
    name, data, prov = curation.export_bytes(store, "preference", "datasets", filename="prefs")
    assert name == "prefs.zip"
    zipfile.ZipFile(io.BytesIO(data)).extractall(tmp_path)
    assert json.loads((tmp_path / "prefs" / "provenance.json").read_text())["export_id"] == prov["export_id"]
    assert len(datasets.load_from_disk(str(tmp_path / "prefs"))) == res.added
    assert store.scalar("SELECT path FROM exports WHERE export_id = ?", [prov["export_id"]]) == "download:prefs"


# ---------------------------------------------------------------------------- CLI

def test_cli_build_review_export_and_exit_codes(tmp_path, capsys):
    db = tmp_path / "studio.duckdb"
    Store.open(db, seed_dir=ROLLOUTS_DIR).close()
    out = tmp_path / "prefs.parquet"
    assert curate.main(["export", "--db", str(db), "--out", str(out)]) == 1
    assert "refused: nothing to export" in capsys.readouterr().err
    assert curate.main(["build", "--db", str(db), "--rule", "correct_vs_incorrect", "--per-prompt-cap", "2",
                          "--length-match", "0.5", "--no-dedupe"]) == 0
    said = capsys.readouterr().out
    assert "correct_vs_incorrect (completion level)" in said and "new pairs" in said
    build_id = said.rsplit("[build ", 1)[1].split("]")[0]
    assert curate.main(["accept", "--db", str(db), "--build", build_id, "--reviewer", "cli"]) == 0
    assert curate.main(["status", "--db", str(db)]) == 0
    assert "0 pending" in capsys.readouterr().out
    # the module entry point, in its own process: refused (exit 1, and a clean exit), then done
    refused = subprocess.run([sys.executable, "-m", "studio.curation", "export", "--db", str(db), "--out", str(out),
                              "--build", "b-none"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and "refused: nothing to export" in refused.stderr, refused.stderr
    done = subprocess.run([sys.executable, "-m", "studio.curation", "export", "--db", str(db), "--out", str(out),
                           "--format", "unpaired"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert out.exists() and (tmp_path / "prefs.parquet.provenance.json").exists()
    store = Store.open(db)
    params = json.loads(store.scalar("SELECT params FROM pair_builds"))
    assert params["per_prompt_cap"] == 2 and params["length_match"] == 0.5 and params["dedupe"] is False
    store.close()
    with pytest.raises(SystemExit):  # argparse: an unknown rule is a usage error (exit 2)
        curate.main(["build", "--db", str(db), "--rule", "nope"])
    assert curate.main(["status", "--db", str(tmp_path / "missing.duckdb")]) == 2
    assert "there is no studio store at" in capsys.readouterr().err and not (tmp_path / "missing.duckdb").exists()
    (tmp_path / "bad.duckdb").write_bytes(b"not a store" * 100)
    assert curate.main(["status", "--db", str(tmp_path / "bad.duckdb")]) == 2
    assert "not a readable DuckDB store" in capsys.readouterr().err


# ---------------------------------------------------------------------------- TRL's DPOTrainer

@pytest.mark.filterwarnings("ignore::FutureWarning")  # transformers 5 renames inside TRL's trainer
def test_an_exported_preference_file_trains_one_dpo_step_in_trl(built, tmp_path):
    pytest.importorskip("trl")
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    store, res = built
    curation.accept(store, build_id=res.build_id)
    out = curation.export(store, tmp_path / "prefs.jsonl")
    ds = load_dataset("json", data_files=str(out.path), split="train", cache_dir=str(tmp_path / "cache"))
    model = AutoModelForCausalLM.from_pretrained(POLICY_DIR)
    tok = AutoTokenizer.from_pretrained(POLICY_DIR)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = DPOConfig(output_dir=str(tmp_path / "dpo"), per_device_train_batch_size=4, max_steps=1, learning_rate=1e-3,
                     beta=0.1, max_length=64, logging_steps=1, report_to="none", use_cpu=True, bf16=False,
                     save_strategy="no", disable_tqdm=True, seed=0)
    trainer = DPOTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
    result = trainer.train()
    assert trainer.state.global_step == 1
    assert math.isfinite(result.training_loss)
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert logged and math.isfinite(logged[0]["loss"])
    moved = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert moved, "one optimiser step changed the weights"
