"""The mismatch reads (``studio.queries.mismatch``) against the numpy signals they twin.

A seeded store gets known log-probs: the rollouts of one group carry a behaviour log-prob and a
recomputed one drawn by a seeded generator (a few large outliers among them), one token of each
is a tool token (``trained = false``: one without log-probs, one carrying them, which every Δ
here must leave out), and one rollout is also rescored into ``token_scores``. Every number the
queries compute in DuckDB is checked against ``studio.signals.mismatch`` on the same arrays.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from studio import queries
from studio.queries import RolloutFilter, mismatch
from studio.signals.mismatch import (
    PRESETS,
    Correction,
    delta,
    kl_terms,
    sequence_rejected,
    sequence_stats,
    token_correction,
)
from tests.fixtures import open_store

SOURCE = "sample_policy@0123abcd~bfloat16"


@pytest.fixture(scope="module")
def world():
    """(store, tokens frame of the literal group with both log-probs, the group id, the rescored rollout)."""
    store = open_store(seeded=True)
    group = store.scalar("SELECT group_id FROM rollouts ORDER BY group_id LIMIT 1")
    toks = store.df("""SELECT t.rollout_id, t.pos, t.token_id, t.token_text, t.entropy FROM token_rows t
                       JOIN rollouts ro USING (rollout_id) WHERE ro.group_id = ? ORDER BY 1, 2""", [group])
    rng = np.random.default_rng(33)
    n = len(toks)
    toks["logprob"] = -rng.uniform(0.0, 3.0, n)
    toks["train_logprob"] = toks["logprob"] + rng.normal(0.0, 0.05, n)
    toks.loc[rng.choice(n, 4, replace=False), "train_logprob"] += 1.5  # outliers: large |Δ|
    toks["trained"] = True
    first = toks.groupby("rollout_id").head(1).index
    toks.loc[first, "trained"] = False  # a tool token carrying log-probs: left out of every Δ
    toks.loc[first[:1], ["logprob", "train_logprob"]] = np.nan  # and one without any
    toks["rank"] = (toks.index % 5 + 1).astype(int)
    cur = store.cursor()
    cur.register("lit", toks)
    cur.execute("""UPDATE token_rows SET logprob = lit.logprob, train_logprob = lit.train_logprob,
                                  trained = lit.trained, train_rank = lit.rank
                              FROM lit WHERE token_rows.rollout_id = lit.rollout_id AND token_rows.pos = lit.pos""")
    cur.execute("UPDATE rollouts SET engine = 'vllm bf16', train_engine = 'fsdp fp32', "
                           "train_policy_version = policy_version WHERE group_id = ?", [group])
    one = toks["rollout_id"].iloc[-1]
    mine = toks[toks["rollout_id"] == one]
    store.write({"token_scores": pd.DataFrame({
        "rollout_id": one, "pos": mine["pos"], "policy_version": SOURCE,
        "logprob": mine["logprob"].fillna(-1.0) - 0.25, "engine": "torch cpu bfloat16", "rank": 2})})
    yield store, toks, group, one
    store.close()


def _trained(toks: pd.DataFrame) -> pd.DataFrame:
    return toks[toks["trained"]]


def test_sources_name_the_stored_column_and_each_rescoring(world):
    store, toks, group, one = world
    src = mismatch.mismatch_sources(store)
    stored = src[src["source"] == ""].iloc[0]
    assert stored["engine"] == "fsdp fp32" and stored["rollouts"] == toks["rollout_id"].nunique()
    scored = src[src["source"] == SOURCE].iloc[0]
    assert scored["engine"] == "torch cpu bfloat16" and scored["rollouts"] == 1
    assert mismatch.sources(store) == [SOURCE] and mismatch.has_recomputed(store)


def test_one_rollout_s_tokens_carry_delta_ratio_k3_and_ranks(world):
    store, toks, group, one = world
    rid = toks["rollout_id"].iloc[0]
    got = mismatch.rollout_mismatch(store, rid)
    want = toks[toks["rollout_id"] == rid].reset_index(drop=True)
    assert got["pos"].tolist() == want["pos"].tolist()
    d = delta(want["train_logprob"], want["logprob"])
    np.testing.assert_allclose(got["delta"], d, atol=1e-6)  # float32 storage
    np.testing.assert_allclose(got["ratio"], np.exp(d), rtol=1e-5)
    np.testing.assert_allclose(got["k3"], kl_terms(d)[2], atol=1e-6)
    assert np.isnan(got["delta"].iloc[0])  # the tool token without log-probs: no Δ
    assert got["train_rank"].tolist() == want["rank"].tolist()
    # behaviour rank from the sampler's top-k: the token's place in topk_ids, NA beyond it
    topk = store.df("SELECT pos, token_id, topk_ids FROM tokens WHERE rollout_id = ? ORDER BY pos", [rid])
    for (_, row), rank in zip(topk.iterrows(), got["rank"]):
        ids = list(row["topk_ids"]) if row["topk_ids"] is not None else []
        assert (pd.isna(rank) and row["token_id"] not in ids) or ids[int(rank) - 1] == row["token_id"]


def test_a_token_scores_source_is_read_for_its_rollout(world):
    store, toks, group, one = world
    got = mismatch.rollout_mismatch(store, one, SOURCE)
    mine = toks[toks["rollout_id"] == one]
    np.testing.assert_allclose(got["delta"][got["trained"]], -0.25, atol=1e-5)
    assert (got["train_rank"] == 2).all()
    seq = mismatch.sequence_summaries(store, [one], SOURCE)
    assert seq["n"].tolist() == [int(mine["trained"].sum())]


def test_sequence_summaries_match_sequence_stats_and_leave_tool_tokens_out(world):
    store, toks, group, one = world
    t = _trained(toks)
    want = sequence_stats(delta(t["train_logprob"], t["logprob"]), t["rollout_id"].to_numpy()).sort_index()
    for scope in (RolloutFilter(group_id=group), list(toks["rollout_id"].unique())):
        got = mismatch.sequence_summaries(store, scope).set_index("rollout_id").sort_index()
        assert list(got.index) == list(want.index)
        for col in want.columns:
            np.testing.assert_allclose(got[col].to_numpy(float), want[col].to_numpy(float), rtol=1e-5, atol=1e-6)
    one_only = mismatch.sequence_summaries(store, one)
    assert one_only["rollout_id"].tolist() == [one]


@pytest.mark.parametrize("c", [Correction("geo", cap=1.01, low=0.99), Correction("seq_k3", threshold=0.01),
                               Correction("seq_mis", cap=1.5)])
def test_rejected_follows_the_sequence_correction(world, c):
    store, toks, group, one = world
    t = _trained(toks)
    stats = sequence_stats(delta(t["train_logprob"], t["logprob"]), t["rollout_id"].to_numpy()).sort_index()
    got = mismatch.sequence_summaries(store, RolloutFilter(group_id=group), correction=c).sort_values("rollout_id")
    assert got["rejected"].tolist() == sequence_rejected(stats, c).tolist()


def test_the_table_sorts_worst_mismatch_first_and_filters(world):
    store, toks, group, one = world
    t = _trained(toks)
    stats = sequence_stats(delta(t["train_logprob"], t["logprob"]), t["rollout_id"].to_numpy())
    page = queries.rollout_table(store, RolloutFilter(group_id=group), sort=("max_abs_delta", True))
    assert page["rollout_id"].tolist() == stats.sort_values("max_abs_delta", ascending=False).index.tolist()
    cut = float(stats["max_abs_delta"].median())
    f = RolloutFilter(min_max_abs_delta=cut)  # the whole store: only this group has Δ
    kept = set(queries.rollout_table(store, f)["rollout_id"])
    assert kept == set(stats.index[stats["max_abs_delta"] >= cut])
    assert queries.rollout_table_count(store, f) == len(kept)
    c = Correction("geo", cap=1.01, low=0.99)
    rej = queries.rollout_table(store, RolloutFilter(rejected_only=True, correction=c))
    assert set(rej["rollout_id"]) == set(stats.index[sequence_rejected(stats, c)])
    assert "max_abs_delta" not in page.columns  # the table's columns are unchanged


def test_distributions_count_and_average_the_trained_tokens(world):
    store, toks, group, one = world
    t = _trained(toks)
    d = delta(t["train_logprob"], t["logprob"])
    got = mismatch.distributions(store, RolloutFilter(group_id=group))
    assert got.n_tokens == len(d) == got.hist["tokens"].sum()
    assert got.hist["lo"].min() == pytest.approx(d.min(), abs=1e-6)
    assert got.by_pos["tokens"].sum() == len(d) and got.by_entropy["tokens"].sum() == len(d)
    by_pos = pd.Series(np.abs(d)).groupby(t["pos"].to_numpy()).mean()
    np.testing.assert_allclose(got.by_pos.set_index("pos")["mean_abs_delta"].loc[by_pos.index], by_pos, atol=1e-6)
    assert got.by_frequency["tokens"].sum() == len(d)
    once = t["token_id"].map(t["token_id"].value_counts()) == 1
    row = got.by_frequency.set_index("frequency")
    if once.any():
        assert row.loc["1", "tokens"] == int(once.sum())
        assert row.loc["1", "mean_abs_delta"] == pytest.approx(float(np.abs(d[once.to_numpy()]).mean()), abs=1e-6)


def test_worst_tokens_come_with_their_context(world):
    store, toks, group, one = world
    t = _trained(toks).assign(d=lambda x: delta(x["train_logprob"], x["logprob"]))
    got = mismatch.worst_tokens(store, RolloutFilter(group_id=group), limit=4, context=2)
    want = t.reindex(t["d"].abs().sort_values(ascending=False).index).head(4)
    assert list(zip(got["rollout_id"], got["pos"])) == list(zip(want["rollout_id"], want["pos"]))
    row = got.iloc[0]
    text = store.df("SELECT pos, token_text FROM tokens WHERE rollout_id = ? ORDER BY pos", [row["rollout_id"]])
    text = text.set_index("pos")["token_text"]
    p = int(row["pos"])
    assert row["before"] == "".join(text.loc[max(p - 2, 0):p - 1]) and row["after"] == "".join(text.loc[p + 1:p + 2])


def test_correction_shares_match_token_correction(world):
    store, toks, group, one = world
    t = _trained(toks)
    d = delta(t["train_logprob"], t["logprob"])
    seq = t["rollout_id"].to_numpy()
    got = mismatch.correction_shares(store, RolloutFilter(group_id=group)).set_index("preset")
    assert list(got.index) == list(PRESETS)
    for name, c in PRESETS.items():
        _, states = token_correction(d, c, seq_index=seq)
        if c.method in ("tis", "seq_tis"):
            assert got.loc[name, "clipped"] == pytest.approx(float(np.mean(states == 1)))
            assert np.isnan(got.loc[name, "masked"])
        else:
            assert got.loc[name, "masked"] == pytest.approx(float(np.mean(states == 2)))
        if c.level == "sequence" and c.method != "seq_tis":
            stats = sequence_stats(d, seq)
            assert got.loc[name, "rejected"] == pytest.approx(float(np.mean(sequence_rejected(stats, c))))


def test_by_step_and_engines(world):
    store, toks, group, one = world
    steps = mismatch.by_step(store, RolloutFilter(group_id=group))
    if store.scalar("SELECT count(*) FROM rollouts WHERE group_id = ? AND train_step IS NOT NULL", [group]):
        t = _trained(toks)
        d = delta(t["train_logprob"], t["logprob"])
        assert steps["tokens"].sum() == len(d)
        assert steps["worst_delta"].abs().max() == pytest.approx(np.abs(d).max(), abs=1e-6)
    else:
        assert steps.empty
    engines, causes = mismatch.engine_comparison(store, RolloutFilter(group_id=group))
    assert engines[["engine", "train_engine"]].values.tolist() == [["vllm bf16", "fsdp fp32"]]
    assert all(c.name != "stale weights" for c in causes)  # same versions on both sides


def test_the_api_reads_mismatch_per_rollout_and_per_token(world):
    from studio.face.api import Studio, StudioAPIError

    store, toks, group, one = world
    studio = Studio(store, "sample_data/policy")
    per = studio.mismatch(rollouts=list(toks["rollout_id"].unique()), correction="verl geometric RS [0.999, 1.001]")
    assert set(per["rollout_id"]) == set(toks["rollout_id"]) and per["rejected"].dtype == bool
    assert len(studio.mismatch_tokens(one)) == int((toks["rollout_id"] == one).sum())
    with pytest.raises(StudioAPIError, match="no rescoring 'nope'"):
        studio.mismatch(source="nope")
    with pytest.raises(StudioAPIError, match="unknown correction"):
        studio.mismatch(correction="tis")
