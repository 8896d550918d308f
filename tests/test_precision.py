"""Precision: a policy loaded in bfloat16 (on a CPU too) samples and scores in that dtype, says so in
its engine and policy version, scores return each token's rank, Generate samples in the chosen
precision and records the engine, and a real studio backend reports its engine over HTTP."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from backends import load_policy
from backends.remote import RemotePolicy
from sample_data import POLICY_DIR
from studio.runs.generation import ConfigError, GenerateConfig, generate_sync
from studio.runs.rescore import rescore_sync
from studio.workers import policy_version
from tests.fixtures import Backend

PROMPTS = ["Q: 23+48-7=", "Q: 5-9="]


def test_a_policy_loads_in_the_precision_asked_for_and_names_it():
    bf = load_policy(POLICY_DIR, device="cpu", precision="bfloat16")
    fp = load_policy(POLICY_DIR, device="cpu")  # auto on a CPU: float32
    assert bf is not fp and next(bf.model.parameters()).dtype == torch.bfloat16
    assert (bf.precision, fp.precision) == ("bfloat16", "float32")
    assert bf.engine == f"torch {torch.__version__.split('+')[0]} cpu bfloat16"
    gens = bf.sample(PROMPTS, n=2, max_new_tokens=12, seed=1)
    assert {g.engine for g in gens} == {bf.engine}
    assert all(np.isfinite(g.logprobs).all() and (g.logprobs <= 0).all() for g in gens)
    base = policy_version(str(POLICY_DIR))
    assert "~" not in base and policy_version(str(POLICY_DIR), "bfloat16") == base + "~bfloat16"
    with pytest.raises(ValueError, match="precision 'fp8' is not one of auto, float32, bfloat16, float16"):
        load_policy(POLICY_DIR, device="cpu", precision="fp8")


def test_scoring_returns_each_tokens_rank_from_the_full_distribution():
    pol = load_policy(POLICY_DIR, device="cpu")
    g = pol.sample(PROMPTS, n=2, max_new_tokens=16, seed=4)
    s = pol.score([x.prompt for x in g], [x.token_ids.tolist() for x in g], top_k_stats=20)
    for x in s:
        assert x.ranks.shape == x.token_ids.shape and (x.ranks >= 1).all()
        for t, tok in enumerate(x.token_ids):  # the rank is 1 + the place of the token among the top 20
            top = x.topk_ids[t].tolist()
            if tok in top:
                assert x.ranks[t] == top.index(tok) + 1
            else:
                assert x.ranks[t] > 20


def test_generate_samples_in_the_chosen_precision_and_records_the_engine(store_factory):
    store = store_factory()
    res = generate_sync(store, POLICY_DIR, PROMPTS, GenerateConfig(group_size=2, precision="bfloat16",
                                                                   max_new_tokens=12))
    assert res.status == "done", res.error
    ro = store.df("SELECT DISTINCT engine, policy_version FROM rollouts")
    assert ro.values.tolist() == [[f"torch {torch.__version__.split('+')[0]} cpu bfloat16",
                                   policy_version(str(POLICY_DIR)) + "~bfloat16"]]
    with pytest.raises(ConfigError, match="precision"):
        GenerateConfig(precision="int4").validate()
    # a branch continues in its parent run's precision
    from studio.runs.branch import BranchConfig, branch_sync

    rid = store.df("SELECT rollout_id FROM rollouts WHERE n_tokens > 3 LIMIT 1")["rollout_id"][0]
    br = branch_sync(store, rid, 2, [None], BranchConfig(n=2, seed=1), policy_path=POLICY_DIR)
    assert br.status == "done", br.error
    assert store.df("SELECT DISTINCT engine, policy_version FROM rollouts WHERE run_id = ?", [br.run_id]
                    ).values.tolist() == ro.values.tolist()


def test_the_studio_backend_reports_its_engine_and_a_rescore_through_it_records_it(tmp_path, store_factory,
                                                                                   monkeypatch):
    monkeypatch.delenv("ROLLOUT_STUDIO_API_KEY", raising=False)
    b = Backend(tmp_path, "--precision", "bfloat16")
    try:
        remote = RemotePolicy(b.url)
        server_engine = f"torch {torch.__version__.split('+')[0]} cpu bfloat16"
        assert remote.engine == f"backend {b.url} ({server_engine})"
        assert remote.version == f"{b.url}#{policy_version(str(POLICY_DIR))}~bfloat16"
        gens = remote.sample(PROMPTS, n=1, max_new_tokens=8)
        assert {g.engine for g in gens} == {remote.engine}
        store = store_factory()
        res = generate_sync(store, POLICY_DIR, PROMPTS, GenerateConfig(group_size=2, max_new_tokens=12))
        assert res.status == "done", res.error
        ids = store.df("SELECT rollout_id FROM rollouts")["rollout_id"].tolist()
        rep = rescore_sync(store, b.url, ids)
        assert rep.engine == remote.engine and rep.rescored == len(ids)
        assert store.df("SELECT DISTINCT train_engine FROM rollouts")["train_engine"].tolist() == [remote.engine]
        d = store.df("SELECT train_logprob - logprob AS d FROM tokens")["d"]
        assert d.notna().all() and 0 < d.abs().max() < 0.5  # fp32 samples, recomputed by the bf16 backend
    finally:
        b.stop()


def test_a_plain_server_is_named_with_precision_unknown(tmp_path, monkeypatch):
    monkeypatch.delenv("ROLLOUT_STUDIO_API_KEY", raising=False)
    b = Backend(tmp_path, "--no-extension")
    try:
        remote = RemotePolicy(b.url)
        assert remote.engine == f"rollout-studio {b.url} (precision unknown)"
        assert {g.engine for g in remote.sample(PROMPTS[:1], max_new_tokens=4)} == {remote.engine}
    finally:
        b.stop()
