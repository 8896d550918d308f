"""Corrected mini-runs: the importance weights of TIS / MIS / ICEPOP in the loss against their
formulas on literal tensors, a real short mini-run with a bfloat16 sampler storing both log-probs,
the engines and the mismatch metrics, and the seeded mismatch world."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from backends.trainer import policy_loss  # noqa: E402
from studio.runs import minirun  # noqa: E402
from studio.runs.training import MiniRunConfig, TrainConfigError  # noqa: E402
from studio.runs.training.correction import correction_fn, is_weights, step_metrics  # noqa: E402
from studio.signals.mismatch import Correction  # noqa: E402
from studio.store import Store  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


# ---------------------------------------------------------------------------- the weights, literally

def test_tis_and_mis_weights_multiply_the_policy_gradient_term():
    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])  # the trainer's log-probs (π_old)
    # behaviour (the sampler's): r = exp(old - behaviour) = 3, 1, 0.25, e^0.1
    behaviour = old - torch.log(torch.tensor([[3.0, 1.0, 0.25, float(np.exp(0.1))]]))
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the fourth token is padding
    a = torch.tensor([2.0])
    # TIS, C = 2 (verl's rollout_is_threshold): w = min(r, 2) = 2, 1, 0.25
    w = is_weights(old - behaviour, Correction("tis", cap=2.0))
    assert w[0, :3].tolist() == pytest.approx([2.0, 1.0, 0.25], abs=1e-6)
    # π = π_old (ρ = 1): per token -w·A, averaged over the 3 real tokens: -(2 + 1 + 0.25)·2 / 3
    loss, _ = policy_loss(old, old, a, mask, is_weights=w)
    assert loss.item() == pytest.approx(-(2 + 1 + 0.25) * 2 / 3, abs=1e-6)
    # MIS band [0.5, 2]: 3 and 0.25 fall outside, dropped (w = 0) but still counted in the length
    w = is_weights(old - behaviour, Correction("mis", cap=2.0, low=0.5))
    assert w[0, :3].tolist() == pytest.approx([0.0, 1.0, 0.0], abs=1e-6)
    assert policy_loss(old, old, a, mask, is_weights=w)[0].item() == pytest.approx(-2 / 3, abs=1e-6)
    # ICEPOP [0.5, 5]: 3 stays with weight 3, 0.25 is dropped
    w = is_weights(old - behaviour, Correction("icepop", cap=5.0, low=0.5))
    assert w[0, :3].tolist() == pytest.approx([3.0, 1.0, 0.0], abs=1e-6)
    # the weights scale the gradient token by token: d loss / d log π_t = -w_t·A / 3 (ρ = 1, inside the clip)
    lp = old.clone().requires_grad_(True)
    policy_loss(lp, old, a, mask, is_weights=w)[0].backward()
    assert lp.grad[0].tolist() == pytest.approx([-3 * 2 / 3, -1 * 2 / 3, 0.0, 0.0], abs=1e-6)
    # a NaN weight on a masked token (a tool token has no behaviour log-prob) reaches neither loss nor gradient
    w_nan = w.clone()
    w_nan[0, 3] = float("nan")
    assert torch.isfinite(policy_loss(old, old, a, mask, is_weights=w_nan)[0])


def test_without_correction_the_loss_is_unchanged():
    torch.manual_seed(0)
    lp, old = torch.randn(3, 5) - 2, torch.randn(3, 5) - 2
    a, m = torch.tensor([1.0, -0.5, 0.2]), torch.ones(3, 5)
    plain = policy_loss(lp, old, a, m, beta=0.1, ref_logps=old + 0.1)[0]
    ones = policy_loss(lp, old, a, m, beta=0.1, ref_logps=old + 0.1, is_weights=torch.ones(3, 5))[0]
    assert plain.item() == ones.item()
    assert correction_fn(MiniRunConfig()) is None


def test_the_corrections_defaults_and_bad_bands():
    assert MiniRunConfig(correction="tis").correction_band() == (0.0, 2.0)  # verl: rollout_is_threshold 2
    assert MiniRunConfig(correction="mis").correction_band() == (0.5, 2.0)  # its mask mode: [1/2, 2]
    assert MiniRunConfig(correction="icepop").correction_band() == (0.5, 5.0)  # IcePop's band
    assert MiniRunConfig(correction="mis", is_cap=3, is_low=0.2).correction_band() == (0.2, 3.0)
    with pytest.raises(TrainConfigError, match="band is empty: is_low 0.9 must be below is_cap 0.8"):
        MiniRunConfig(correction="mis", is_cap=0.8, is_low=0.9).validate()
    with pytest.raises(TrainConfigError, match="sampler precision must be one of float32, bfloat16"):
        MiniRunConfig(sampler_precision="int8").validate()
    with pytest.raises(TrainConfigError, match="correction must be one of none, tis, mis, icepop"):
        MiniRunConfig(correction="ppo").validate()


def test_step_metrics_on_literal_deltas():
    # one completion, Δ = log 3, 0, log 0.25 on trained tokens; the fourth token is a tool token (NaN)
    train = [np.log(np.array([3.0, 1.0, 0.25, 1.0]))]
    behaviour = [np.array([0.0, 0.0, 0.0, np.nan])]
    mask = [np.array([True, True, True, False])]
    d = np.log([3.0, 1.0, 0.25])
    m = step_metrics(train, behaviour, mask, MiniRunConfig(correction="tis"))
    assert m["mismatch/k1"] == pytest.approx(np.mean(-d))
    assert m["mismatch/k3"] == pytest.approx(np.mean([3 - 1 - d[0], 0.0, 0.25 - 1 - d[2]]))
    assert m["mismatch/abs_delta_max"] == pytest.approx(np.log(4))
    assert m["is/clipped_share"] == pytest.approx(1 / 3) and m["is/masked_share"] == 0.0
    assert m["is/weight_mean"] == pytest.approx((2 + 1 + 0.25) / 3)
    m = step_metrics(train, behaviour, mask, MiniRunConfig(correction="mis"))
    assert m["is/masked_share"] == pytest.approx(2 / 3) and m["is/clipped_share"] == 0.0
    assert "is/weight_mean" not in step_metrics(train, behaviour, mask, MiniRunConfig())


# ---------------------------------------------------------------------------- a real run

@pytest.fixture()
def store(minirun_store):
    return minirun_store


def test_a_bfloat16_sampler_stores_both_log_probs_and_the_tis_metrics_match_them(store):
    """Overlapped bfloat16 sampler, float32 trainer, TIS with a small cap (so tokens are clipped):
    every trained token has both log-probs with a small non-zero Δ, the rollouts name both
    engines and policy versions, and each step's metrics are those of its stored tokens."""
    cfg = MiniRunConfig(steps=3, prompts_per_step=2, group_size=4, checkpoint_every=3, sampler_precision="bfloat16",
                        correction="tis", is_cap=1.02, overlap=True)
    rid = minirun.start(store, cfg, name="tis bf16")
    st = minirun.wait(rid, 600)
    assert st.status == "done", st.error
    ro = store.df("SELECT train_step, policy_version, engine, train_policy_version, train_engine FROM rollouts "
                  "WHERE run_id = ? ORDER BY train_step", [rid])
    assert ro["engine"].str.match(r"torch \S+ cpu bfloat16$").all(), ro["engine"].unique()
    assert ro["train_engine"].str.match(r"trainer torch \S+ cpu float32$").all(), ro["train_engine"].unique()
    assert (ro["train_policy_version"] == [f"{rid}@{s - 1}" for s in ro["train_step"]]).all()
    # overlapped: from step 2 on, the sampler's weights are one update older than the trainer's (stale weights)
    assert ro.drop_duplicates("train_step")["policy_version"].tolist() == [f"{rid}@0", f"{rid}@0", f"{rid}@1"]
    t = store.df("""SELECT ro.train_step, t.logprob, t.train_logprob FROM tokens t JOIN rollouts ro USING (rollout_id)
                    WHERE ro.run_id = ? AND coalesce(t.trained, true)""", [rid])
    assert t["logprob"].notna().all() and t["train_logprob"].notna().all()
    d = (t["train_logprob"] - t["logprob"]).to_numpy(np.float64)
    assert 0 < np.abs(d).mean() < 0.2 and (d != 0).mean() > 0.5  # bfloat16: small, but on most tokens
    m = minirun.metrics(store, [rid]).pivot(index="train_step", columns="metric", values="value")
    for step, sub in t.groupby("train_step"):
        dd = (sub["train_logprob"] - sub["logprob"]).to_numpy(np.float64)
        r = np.exp(dd)
        assert m.at[step, "is/clipped_share"] == pytest.approx((r > 1.02).mean(), abs=1e-9)
        assert m.at[step, "is/weight_mean"] == pytest.approx(np.minimum(r, 1.02).mean(), abs=1e-5)
        assert m.at[step, "mismatch/k3"] == pytest.approx((r - 1 - dd).mean(), rel=1e-3, abs=1e-7)
        assert m.at[step, "mismatch/abs_delta_max"] == pytest.approx(np.abs(dd).max(), abs=1e-5)
    assert m["is/clipped_share"].sum() > 0  # the cap acted (the stale steps' tokens leave 1.02 most)


# ---------------------------------------------------------------------------- the seeded world

def test_the_seeded_mismatch_world_loads_with_both_log_probs_metrics_and_held_out_results():
    from sample_data import MISMATCH_RUNS_DIR, SEED_DIRS

    assert MISMATCH_RUNS_DIR in SEED_DIRS  # a new served store has it
    assert sum(p.stat().st_size for p in MISMATCH_RUNS_DIR.iterdir()) < 2 * 2**20
    s = Store.open(":memory:", seed_dir=SEED_DIRS)
    try:
        runs = minirun.miniruns(s)
        assert sorted(runs["name"]) == ["bf16 sampler · TIS, C = 2", "bf16 sampler · no correction"]
        assert set(runs["steps"]) == {8} and set(runs["status"]) == {"done"}
        ro = s.df("""SELECT run_id, train_step, engine, train_engine, count(*) AS n FROM rollouts
                     WHERE run_id IN (SELECT run_id FROM runs WHERE kind = 'minirun') GROUP BY ALL""")
        assert len(ro) == 16 and ro["engine"].str.endswith("cpu bfloat16").all()
        assert ro["train_engine"].str.endswith("cpu float32").all()
        d = s.df("""SELECT t.train_logprob - t.logprob AS d FROM tokens t JOIN rollouts ro USING (rollout_id)
                    JOIN runs r USING (run_id) WHERE r.kind = 'minirun'""")["d"]
        assert d.notna().all() and 0 < d.abs().mean() < 0.05
        m = minirun.metrics(s, runs["run_id"].tolist())
        assert (m[m["metric"] == "mismatch/k3"].groupby("run_id").size() == 8).all()
        assert len(m[m["metric"] == "is/clipped_share"]) == 8  # only the TIS run has the correction's metrics
        held = minirun.heldout(s, runs["run_id"].tolist())
        assert set(held[held["figure"] == "accuracy"]["run_id"]) == set(runs["run_id"])
    finally:
        s.close()


def test_the_cli_takes_the_correction_settings_and_names_a_bad_band(tmp_path, capsys):
    import json

    from studio.face.cli import minirun as minirun_cli

    db = str(tmp_path / "cli.duckdb")
    Store.open(db).close()
    assert minirun_cli.main(["--db", db, "--correction", "mis", "--is-cap", "0.8", "--is-low", "0.9"]) == 2
    assert "band is empty: is_low 0.9 must be below is_cap 0.8" in capsys.readouterr().err
    s = Store.open(db)
    assert s.scalar("SELECT count(*) FROM runs") == 0  # nothing stored for refused settings
    s.close()
    assert minirun_cli.main(["--db", db, "--steps", "1", "--prompts-per-step", "2", "--group-size", "2",
                             "--sampler-precision", "bfloat16", "--correction", "icepop", "--no-overlap"]) == 0
    s = Store.open(db)
    cfg = json.loads(s.scalar("SELECT config FROM runs"))
    assert (cfg["sampler_precision"], cfg["correction"]) == ("bfloat16", "icepop")
    # in-process sampling in bfloat16: the same weights, so Δ is the precision alone
    assert s.scalar("SELECT any_value(engine) FROM rollouts").endswith("cpu bfloat16")
    assert s.scalar("SELECT count(*) FROM metrics WHERE name = 'is/masked_share'") == 1
    s.close()
