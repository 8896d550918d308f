"""Training–inference mismatch signals: Δ and the KL estimators on literal cases, each correction
against the formula its framework documents, the DuckDB twins against numpy, and diagnose."""
import inspect
import math
import textwrap
from types import SimpleNamespace

import duckdb
import numpy as np
import pandas as pd
import pytest

from studio.signals.mismatch import (
    METHODS,
    PRESETS,
    Correction,
    delta,
    delta_sql,
    diagnose,
    kl_terms,
    rejected_sql,
    sequence_aggregates_sql,
    sequence_rejected,
    sequence_stats,
    state_sql,
    token_correction,
    token_mult_prob_error,
    weight_sql,
)


def test_delta_is_train_minus_behaviour_and_nan_where_missing():
    d = delta([-0.5, -2.0, np.nan, -1.0, -np.inf], [-1.0, -1.5, -1.0, None, -1.0])
    assert d[:2].tolist() == [0.5, -0.5]
    assert np.isnan(d[2:]).all()
    with pytest.raises(ValueError, match="differ in length"):
        delta([-1.0], [-1.0, -2.0])


def test_kl_estimators_on_literal_values():
    k1, k2, k3 = kl_terms(np.array([0.0, 0.5, -1.0]))
    assert k1.tolist() == [-0.0, -0.5, 1.0]
    assert k2.tolist() == [0.0, 0.125, 0.5]
    assert k3 == pytest.approx([0.0, math.exp(0.5) - 1.5, math.exp(-1.0)])  # e^Δ − 1 − Δ
    assert (k3 >= 0).all()


def test_nemo_rl_token_mult_prob_error():
    # nemo_rl/algorithms/loss_functions.py: masked_mean(exp(|generation_logprobs - prev_logprobs|))
    assert token_mult_prob_error([0.0, -0.5, np.nan, 0.5]) == pytest.approx((1 + 2 * math.exp(0.5)) / 3)
    assert math.isnan(token_mult_prob_error([np.nan]))


def test_tis_truncates_at_the_cap():
    # verl rollout_is="token" (verl/trainer/ppo/rollout_corr_helper.py): w = min(r, threshold)
    d = np.log([0.5, 1.0, 3.0])
    w, s = token_correction(d, Correction("tis", cap=2.0))
    assert w == pytest.approx([0.5, 1.0, 2.0])
    assert s.tolist() == [0, 0, 1]
    # slime --tis-clip-low: also clamped from below
    w, s = token_correction(d, Correction("tis", cap=2.0, low=0.8))
    assert w == pytest.approx([0.8, 1.0, 2.0]) and s.tolist() == [1, 0, 1]


def test_mask_and_icepop_zero_outside_the_band():
    d = np.log([0.3, 0.6, 4.0, 6.0])
    w, s = token_correction(d, PRESETS["IcePop [0.5, 5]"])  # Ring-1T IcePop band [0.5, 5]
    assert w == pytest.approx([0.0, 0.6, 4.0, 0.0]) and s.tolist() == [2, 0, 0, 2]
    w, s = token_correction(d, Correction("mis", cap=3.0))  # no lower bound
    assert w == pytest.approx([0.3, 0.6, 0.0, 0.0]) and s.tolist() == [0, 0, 2, 2]


def test_token_rejection_by_k1_and_k3():
    d = np.array([0.05, -0.3, 0.2])
    _, s = token_correction(d, Correction("k1", threshold=0.1))
    assert s.tolist() == [0, 2, 2]
    w, s = token_correction(d, Correction("k3", threshold=0.025))  # k3 = 0.00127, 0.0408, 0.0214
    assert s.tolist() == [0, 2, 0] and w.tolist() == [1.0, 0.0, 1.0]


def test_sequence_level_corrections():
    d = np.array([0.5, 0.5, -0.1, 0.1, np.nan])
    seq = ["a", "a", "b", "b", "b"]
    w, s = token_correction(d, Correction("seq_tis", cap=2.0), seq)  # exp(1) = 2.718 > 2
    assert w == pytest.approx([2.0, 2.0, 1.0, 1.0, 1.0]) and s.tolist() == [1, 1, 0, 0, 0]
    w, s = token_correction(d, Correction("seq_mis", cap=2.0), seq)
    assert w == pytest.approx([0.0, 0.0, 1.0, 1.0, 1.0]) and s.tolist() == [2, 2, 0, 0, 0]
    # verl decoupled_geo_rs: exp(mean Δ) outside [0.999, 1.001]
    _, s = token_correction(d, PRESETS["verl geometric RS [0.999, 1.001]"], seq)
    assert s.tolist() == [2, 2, 0, 0, 0]
    # prime-rl geo mask (src/prime_rl/trainer/rl/loss.py, geo_mask_low/high 0.1 / 10): exp(mean Δ) = e^0.5 kept
    _, s = token_correction(d, PRESETS["prime-rl geo mask [0.1, 10]"], seq)
    assert s.tolist() == [0] * 5
    _, s = token_correction(np.array([3.0, 2.0, 0.0]), PRESETS["prime-rl geo mask [0.1, 10]"], [0, 0, 1])
    assert s.tolist() == [2, 2, 0]  # exp(2.5) = 12.2 > 10
    with pytest.raises(ValueError, match="seq_index"):
        token_correction(d, Correction("seq_mis"))


def _trl_importance_weights(diff, mode: str, clip_max: float, clip_min=None):
    """TRL's own lines: the IS block of ``GRPOTrainer._generate_and_score_completions``
    (trl/trainer/grpo_trainer.py, TRL 1.16), cut from its source and run on ``diff``
    (its ``per_token_logps_diff``, shape (B, T)); it is not a separate function there."""
    torch = pytest.importorskip("torch")
    from trl.trainer.grpo_trainer import GRPOTrainer

    src = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    start = src.rindex("\n", 0, src.index("sequence_level_is = self.vllm_importance_sampling_mode")) + 1
    end = src.index("# Compute the per-token log probabilities for the reference model")
    trainer = SimpleNamespace(vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_max=clip_max,
                              vllm_importance_sampling_clip_min=clip_min)
    scope = {"self": trainer, "per_token_logps_diff": torch.tensor(diff), "torch": torch, "math": math}
    exec(textwrap.dedent(src[start:end]), scope)
    return scope["vllm_importance_sampling_ratio"].expand(*diff.shape).numpy()


@pytest.mark.parametrize("name, mode", [("TRL token_truncate (cap 3)", "token_truncate"),
                                        ("TRL token_mask (cap 3)", "token_mask"),
                                        ("TRL sequence_truncate (cap 3)", "sequence_truncate"),
                                        ("TRL sequence_mask (cap 3)", "sequence_mask")])
def test_trl_presets_match_trl_itself(name, mode):
    diff = np.random.default_rng(1).normal(0, 0.8, (4, 6))
    ref = _trl_importance_weights(diff, mode, clip_max=3.0)
    w, s = token_correction(diff.ravel(), PRESETS[name], np.repeat(np.arange(4), 6))
    assert w == pytest.approx(ref.ravel())
    ratio = np.exp(np.repeat(diff.sum(1), 6) if mode.startswith("sequence") else diff.ravel())
    assert ((s == 0) == np.isclose(w, ratio, rtol=1e-12)).all()  # kept exactly where TRL left the ratio alone


def test_tis_with_a_lower_bound_matches_trl_truncate_with_clip_min():
    diff = np.random.default_rng(2).normal(0, 0.8, (3, 5))
    ref = _trl_importance_weights(diff, "token_truncate", clip_max=2.0, clip_min=0.5)
    w, _ = token_correction(diff.ravel(), Correction("tis", cap=2.0, low=0.5))
    assert w == pytest.approx(ref.ravel())
    ref = _trl_importance_weights(diff, "token_mask", clip_max=2.0, clip_min=0.5)
    w, _ = token_correction(diff.ravel(), Correction("mis", cap=2.0, low=0.5))
    assert w == pytest.approx(ref.ravel())


def test_sequence_stats_literal():
    st = sequence_stats(np.array([0.2, -0.4, np.nan, 1.0]), ["x", "x", "y", "z"])
    assert st.loc["x", "n"] == 2 and st.loc["x", "delta_sum"] == pytest.approx(-0.2)
    assert st.loc["x", "geo_ratio"] == pytest.approx(math.exp(-0.1))
    assert st.loc["x", "max_abs_delta"] == pytest.approx(0.4)
    assert st.loc["x", "k1"] == pytest.approx(0.1) and st.loc["x", "k2"] == pytest.approx(0.05)
    assert st.loc["y", "n"] == 0 and np.isnan(st.loc["y", "delta_sum"])
    assert sequence_rejected(st, Correction("seq_k3", threshold=0.1)).tolist() == [False, False, True]
    assert not sequence_rejected(st, Correction("tis")).any()


def test_unknown_method_is_refused_and_every_method_describes_itself():
    with pytest.raises(ValueError, match="unknown correction method 'foo'"):
        Correction("foo")
    with pytest.raises(ValueError, match="low = 3, cap = 2"):
        Correction("mis", cap=2.0, low=3.0)
    with pytest.raises(ValueError, match="threshold must be a finite number"):
        Correction("k1", threshold=float("nan"))
    for m in METHODS:
        assert Correction(m, threshold=0.1).describe()


CORRECTIONS = [Correction(m, cap=2.0, low=lo, threshold=0.05) for m in METHODS for lo in (0.0, 0.6)]


@pytest.fixture(scope="module")
def db():
    rng = np.random.default_rng(7)
    n = 400
    train = rng.normal(-1.0, 0.5, n).clip(max=-1e-3)
    beh = (train + rng.normal(0, 0.3, n)).clip(max=-1e-3)
    train[::37] = np.nan
    frame = pd.DataFrame({"rollout_id": rng.integers(0, 12, n).astype(str), "pos": np.arange(n),
                          "train_logprob": train, "logprob": beh})
    con = duckdb.connect()
    con.register("frame", frame)
    con.execute("CREATE TABLE t AS SELECT rollout_id, pos, CAST(train_logprob AS FLOAT) AS train_logprob, "
                "CAST(logprob AS FLOAT) AS logprob FROM frame")
    stored = con.execute("SELECT rollout_id, pos, train_logprob, logprob FROM t ORDER BY pos").df()
    yield con, stored
    con.close()


def test_sql_twins_match_numpy(db):
    con, f = db
    d = delta(f.train_logprob, f.logprob)
    got = con.execute(f"SELECT {delta_sql()} AS d FROM t ORDER BY pos").df()["d"].to_numpy(dtype=float)
    np.testing.assert_allclose(got, d, equal_nan=True)
    stats = sequence_stats(d, f.rollout_id)
    agg = con.execute(f"WITH x AS (SELECT rollout_id, {delta_sql()} AS d FROM t) "
                      f"SELECT rollout_id, {sequence_aggregates_sql()} FROM x GROUP BY rollout_id").df()
    agg = agg.set_index("rollout_id").loc[stats.index]
    for col in stats.columns:
        np.testing.assert_allclose(agg[col].to_numpy(dtype=float), stats[col].to_numpy(dtype=float), rtol=1e-9)
    for c in CORRECTIONS:
        w, s = token_correction(d, c, f.rollout_id.to_numpy())
        q = (f"WITH x AS (SELECT pos, rollout_id, {delta_sql()} AS d FROM t) "
             f"SELECT {state_sql(c, partition='rollout_id')} AS s, {weight_sql(c, partition='rollout_id')} AS w "
             "FROM x ORDER BY pos")
        out = con.execute(q).df()
        assert out["s"].tolist() == s.tolist(), c
        np.testing.assert_allclose(out["w"].to_numpy(dtype=float), w, rtol=1e-9, err_msg=str(c))
        rej = con.execute(f"SELECT rollout_id, {rejected_sql(c)} AS r FROM ({'SELECT rollout_id, ' + sequence_aggregates_sql()} "
                          f"FROM (SELECT rollout_id, {delta_sql()} AS d FROM t) GROUP BY rollout_id)").df()
        rej = rej.set_index("rollout_id").loc[stats.index, "r"].tolist()
        assert rej == sequence_rejected(stats, c).tolist(), c


def _tokens(deltas_per_rollout, trained=None):
    rows = []
    for r, ds in enumerate(deltas_per_rollout):
        for p, x in enumerate(ds):
            rows.append({"rollout_id": f"r{r}", "pos": p, "delta": x,
                         "trained": True if trained is None else trained[r][p]})
    return pd.DataFrame(rows)


def test_diagnose_is_silent_on_clean_data():
    rng = np.random.default_rng(3)
    tok = _tokens([rng.normal(0, 0.01, 30) for _ in range(6)])
    assert diagnose(tok, ["p@1"], ["p@1"]) == []


def test_diagnose_names_a_constant_offset():
    rng = np.random.default_rng(4)
    tok = _tokens([-0.1 + rng.normal(0, 0.01, 30) for _ in range(4)])
    (cause,) = diagnose(tok, [], [])
    assert cause.name == "constant offset" and "-0.10" in cause.evidence and "top-p" in cause.fix


def test_diagnose_names_a_first_token_outlier():
    rng = np.random.default_rng(5)
    tok = _tokens([np.r_[0.8, rng.normal(0, 0.01, 20)] for _ in range(5)])
    names = [c.name for c in diagnose(tok, [], [])]
    assert names == ["first-token outlier"]


def test_diagnose_names_tool_tokens_and_stale_weights():
    rng = np.random.default_rng(6)
    ds = [np.r_[rng.normal(0, 0.01, 20), rng.normal(0, 1.5, 5)] for _ in range(3)]
    trained = [[True] * 20 + [False] * 5 for _ in range(3)]
    causes = {c.name: c for c in diagnose(_tokens(ds, trained), ["p@step3"], ["p@step4"])}
    assert set(causes) == {"masked tool tokens included", "stale weights"}
    assert "15 tool" in causes["masked tool tokens included"].evidence
    assert "p@step3" in causes["stale weights"].evidence


def test_the_same_weights_in_another_precision_or_behind_a_backend_are_not_stale():
    """A bf16 Rescore (`~bfloat16`) or a backend (`<url>#`) of the sampler's own weights is not stale weights."""
    d = [np.zeros(25)]
    sampled = ["http://gpu:8000#policy@562503e564"]
    assert diagnose(_tokens(d, [[True] * 25]), sampled, ["policy@562503e564~bfloat16"]) == []
    assert [c.name for c in diagnose(_tokens(d, [[True] * 25]), sampled, ["policy@0000000000"])] == ["stale weights"]
