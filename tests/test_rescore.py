"""Rescore on the real sample policies and a real store: rollouts sampled in bfloat16 and
recomputed in float32 show a small but real mismatch, the first recomputation fills the train
log-prob once, tool tokens get none, another tokenizer is refused naming the rollout, imports
without log-probs are enriched, and the command line does it end to end."""
from __future__ import annotations

import numpy as np
import pytest

from sample_data import AGENT_POLICY_DIR, AGENT_ROLLOUTS_DIR, CHAT_POLICY_DIR, POLICY_DIR, ROLLOUTS_DIR
from studio.face.cli import rescore as rescore_cli
from studio.runs.generation import GenerateConfig, generate_sync
from studio.runs.rescore import RescoreError, rescore_sync
from studio.store import Store
from studio.workers import policy_version

PROMPTS = ["Q: 23+48-7=", "Q: 5-9=", "Q: 61+7+30-44=", "Q: 8+8="]


def _ids(store, run_id=None) -> list[str]:
    where, params = ("WHERE run_id = ?", [run_id]) if run_id else ("", [])
    return store.df(f"SELECT rollout_id FROM rollouts {where} ORDER BY rollout_id", params)["rollout_id"].tolist()


@pytest.fixture()
def bf16_run(store_factory):
    """A store with 16 rollouts the sample policy sampled in bfloat16."""
    store = store_factory("s.duckdb")
    res = generate_sync(store, POLICY_DIR, PROMPTS, GenerateConfig(group_size=4, precision="bfloat16", seed=3))
    assert res.status == "done", res.error
    return store, res.run_id


def test_bf16_samples_rescored_in_fp32_show_a_small_but_real_mismatch(bf16_run):
    store, run = bf16_run
    ids = _ids(store, run)
    ro = store.df("SELECT DISTINCT engine, policy_version FROM rollouts WHERE run_id = ?", [run])
    assert len(ro) == 1 and ro.engine[0].endswith("cpu bfloat16") and ro.policy_version[0].endswith("~bfloat16")
    rep = rescore_sync(store, POLICY_DIR, ids)
    assert (rep.rescored, rep.filled, rep.enriched, rep.skipped) == (len(ids), len(ids), 0, [])
    assert rep.policy_version == policy_version(str(POLICY_DIR)) and "~" not in rep.policy_version
    assert rep.engine.endswith("cpu float32")
    t = store.df("SELECT train_logprob - logprob AS d, train_rank, topk_ids, token_id FROM tokens "
                 "WHERE list_contains(?, rollout_id)", [ids])
    d = t["d"].to_numpy()
    assert not np.isnan(d).any()
    # measured on this policy: mean Δ about -1e-4, max |Δ| a few 1e-3; bf16 rounding is never exactly zero
    assert abs(d.mean()) > 0 and np.abs(d).max() > 1e-4 and np.abs(d).max() < 0.5
    ro = store.df("SELECT DISTINCT train_policy_version, train_engine FROM rollouts WHERE run_id = ?", [run])
    assert ro.values.tolist() == [[rep.policy_version, rep.engine]]
    # the rank under the fp32 policy: 1 exactly where the token is its argmax (the fp32 rescore's top-1)
    s = store.df("SELECT s.rank, t.token_id, s.logprob FROM token_scores s JOIN tokens t USING (rollout_id, pos) "
                 "WHERE s.policy_version = ?", [rep.policy_version])
    assert len(s) == len(t) and (s["rank"] >= 1).all()
    np.testing.assert_array_equal(np.sort(t["train_rank"].to_numpy()), np.sort(s["rank"].to_numpy()))


def test_ranks_match_the_argmax(bf16_run):
    store, run = bf16_run
    rep = rescore_sync(store, POLICY_DIR, _ids(store, run))
    from backends import load_policy

    pol = load_policy(POLICY_DIR, device="cpu")
    rows = store.df("""SELECT ro.rollout_id, p.text AS prompt, list(t.token_id ORDER BY t.pos) AS ids,
                              list(t.train_rank ORDER BY t.pos) AS ranks
                       FROM rollouts ro JOIN prompts p USING (prompt_id) JOIN tokens t USING (rollout_id)
                       WHERE ro.run_id = ? GROUP BY ALL""", [run])
    gens = pol.score(rows["prompt"].tolist(), [[int(i) for i in x] for x in rows["ids"]])
    for g, ranks in zip(gens, rows["ranks"], strict=True):
        argmax = g.topk_ids[:, 0] == g.token_ids
        assert ((np.asarray(ranks) == 1) == argmax).all()
        np.testing.assert_array_equal(g.ranks, ranks)
        assert g.engine == rep.engine


def test_the_first_recomputation_is_kept_and_later_ones_are_sources(bf16_run):
    store, run = bf16_run
    ids = _ids(store, run)
    first = rescore_sync(store, POLICY_DIR, ids)
    before = store.df("SELECT rollout_id, pos, train_logprob FROM tokens ORDER BY rollout_id, pos")
    second = rescore_sync(store, POLICY_DIR, ids, precision="bfloat16")
    assert second.policy_version == first.policy_version + "~bfloat16" and second.engine.endswith("cpu bfloat16")
    assert (second.rescored, second.filled) == (len(ids), 0)
    after = store.df("SELECT rollout_id, pos, train_logprob FROM tokens ORDER BY rollout_id, pos")
    assert after.equals(before)
    assert store.df("SELECT DISTINCT train_policy_version FROM rollouts")["train_policy_version"].tolist() == [
        first.policy_version]
    n = store.scalar("SELECT count(*) FROM tokens")
    srcs = store.df("SELECT policy_version, engine, count(*) AS n FROM token_scores GROUP BY ALL ORDER BY 1")
    assert srcs["n"].tolist() == [n, n] and srcs["engine"].str.endswith("float32").tolist() == [True, False]
    # the bf16 rescore mostly reproduces the bf16 sampler's numbers (same dtype, same context); one full
    # forward against a KV-cached decode still rounds differently in bf16 (measured: max |Δ| 0.08)
    d = store.df("SELECT s.logprob - t.logprob AS d FROM token_scores s JOIN tokens t USING (rollout_id, pos) "
                 "WHERE s.policy_version = ?", [second.policy_version])["d"]
    assert d.abs().median() < 1e-3 and d.abs().max() < 0.5
    again = rescore_sync(store, POLICY_DIR, ids, precision="bfloat16")
    assert again.rescored == 0 and len(again.skipped) == len(ids) and "already rescored" in again.skipped[0][1]
    assert store.scalar("SELECT count(*) FROM token_scores") == 2 * n


def test_fp32_samples_rescored_in_fp32_agree(seeded_store):
    ids = _ids(seeded_store)[:12]
    rep = rescore_sync(seeded_store, POLICY_DIR, ids)
    d = seeded_store.df("SELECT train_logprob - logprob AS d FROM tokens WHERE list_contains(?, rollout_id)",
                        [ids])["d"]
    assert rep.filled == len(ids) and d.notna().all() and d.abs().max() < 1e-4


def test_an_agents_tool_tokens_get_no_train_log_prob(store_factory, tmp_path):
    store = Store.open(tmp_path / "a.duckdb", seed_dir=AGENT_ROLLOUTS_DIR)
    try:
        ids = store.df("SELECT rollout_id FROM rollouts WHERE n_tool_calls > 0 ORDER BY rollout_id LIMIT 4"
                       )["rollout_id"].tolist()
        assert ids
        rep = rescore_sync(store, AGENT_POLICY_DIR, ids)
        assert rep.filled == len(ids) and not rep.skipped
        t = store.df("SELECT trained, train_logprob, train_rank, train_logprob - logprob AS d FROM tokens "
                     "WHERE list_contains(?, rollout_id)", [ids])
        tool = t[~t["trained"].fillna(True).astype(bool)]
        own = t[t["trained"].fillna(True).astype(bool)]
        assert len(tool) and tool["train_logprob"].isna().all() and tool["train_rank"].isna().all()
        assert own["train_logprob"].notna().all() and own["d"].abs().max() < 1e-3
    finally:
        store.close()


def test_another_tokenizer_is_refused_naming_the_rollout_and_nothing_is_stored(seeded_store):
    ids = _ids(seeded_store)[:3]
    with pytest.raises(RescoreError, match=f"rollout {ids[0]} cannot be rescored by the policy .*chat_policy"):
        rescore_sync(seeded_store, CHAT_POLICY_DIR, ids)
    assert seeded_store.scalar("SELECT count(*) FROM token_scores") == 0
    assert seeded_store.scalar("SELECT count(train_logprob) FROM tokens") == 0
    assert seeded_store.scalar("SELECT count(train_policy_version) FROM rollouts") == 0


def test_an_import_without_log_probs_is_enriched_by_rescore(seeded_store):
    ids = _ids(seeded_store)[:3]
    want = seeded_store.df("SELECT logprob FROM tokens WHERE rollout_id = ? ORDER BY pos", [ids[0]])["logprob"]
    with seeded_store.transaction() as cur:
        cur.execute("UPDATE token_rows SET logprob = NULL, entropy = NULL WHERE rollout_id = ?", [ids[0]])
    rep = rescore_sync(seeded_store, POLICY_DIR, ids)
    assert (rep.enriched, rep.rescored) == (1, 2)
    got = seeded_store.df("SELECT logprob FROM tokens WHERE rollout_id = ? ORDER BY pos", [ids[0]])["logprob"]
    np.testing.assert_allclose(got, want, atol=2e-4)
    assert seeded_store.scalar("SELECT enriched_by FROM rollouts WHERE rollout_id = ?", [ids[0]]).startswith("policy@")


def test_a_bad_precision_is_refused():
    with pytest.raises(ValueError, match="precision 'int8' is not one of auto, float32, bfloat16, float16"):
        rescore_sync(None, POLICY_DIR, [], precision="int8")


def test_the_cli_rescores_a_run_end_to_end(tmp_path, capsys):
    db = tmp_path / "s.duckdb"
    store = Store.open(db, seed_dir=ROLLOUTS_DIR)
    run = store.df("SELECT run_id, count(*) AS n FROM rollouts GROUP BY 1 ORDER BY 2 LIMIT 1").iloc[0]
    rid = _ids(store)[0]
    store.close()
    assert rescore_cli.main(["--policy", "sample", "--precision", "bfloat16", "--run", run.run_id,
                             "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert f"rescored {run.n} rollouts with policy@" in out and "~bfloat16 (torch " in out
    assert f"train log-probs filled for {run.n}" in out
    assert rescore_cli.main(["--policy", "sample", "--rollout", "nope", "--db", str(db)]) == 2
    assert "no rollout nope" in capsys.readouterr().err
    assert rescore_cli.main(["--policy", str(CHAT_POLICY_DIR), "--rollout", rid, "--db", str(db)]) == 2
    assert f"rollout {rid} cannot be rescored" in capsys.readouterr().err


def test_the_api_rescores_a_run(tmp_path):
    from studio.face.api import Studio

    store = Store.open(tmp_path / "s.duckdb", seed_dir=ROLLOUTS_DIR)
    studio = Studio(store, POLICY_DIR)
    try:
        run = store.df("SELECT run_id FROM rollouts ORDER BY rollout_id LIMIT 1").iloc[0, 0]
        rep = studio.rescore(POLICY_DIR, run=run, precision="bfloat16")
        assert rep.rescored == len(_ids(store, run)) and rep.policy_version.endswith("~bfloat16")
        with pytest.raises(ValueError, match="either rollouts or a run"):
            studio.rescore(POLICY_DIR)
    finally:
        studio.close()
