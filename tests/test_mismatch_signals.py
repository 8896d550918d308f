"""Training–inference mismatch signals: Δ and the KL estimators on literal cases, each correction
against the formula its framework documents, the DuckDB twins against numpy, and diagnose."""
import math

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
    with pytest.raises(ValueError, match="seq_index"):
        token_correction(d, Correction("seq_mis"))


def test_trl_modes_match_trl_1_16_formula():
    # trl/trainer/grpo_trainer.py (1.16) computes its IS weights inline in _generate_and_score_completions:
    # clamp(exp(diff), clip_min, clip_max) for *_truncate, masked_fill(ratio outside [min, max], 0) for *_mask,
    # diff summed per sequence for sequence_*. The same arithmetic in torch, against ours:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    diff = rng.normal(0, 0.8, (4, 6))
    t = torch.tensor(diff)
    for name, mode in [("TRL token_truncate (cap 3)", "token_truncate"), ("TRL token_mask (cap 3)", "token_mask"),
                       ("TRL sequence_truncate (cap 3)", "sequence_truncate"),
                       ("TRL sequence_mask (cap 3)", "sequence_mask")]:
        ld = t.sum(-1, keepdim=True) if mode.startswith("sequence") else t
        ratio = torch.exp(ld)
        ref = torch.clamp(ratio, max=3.0) if mode.endswith("truncate") else ratio.masked_fill(ratio > 3.0, 0.0)
        ref = ref.expand_as(t).numpy()
        seq = np.repeat(np.arange(4), 6)
        w, _ = token_correction(diff.ravel(), PRESETS[name], seq)
        assert w == pytest.approx(ref.ravel()), name


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
