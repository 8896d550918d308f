"""The two log-probs of a token as the record contract stores them: the behaviour one a sampler reported, the
one a training side recomputed, and who produced each; bad recomputed lists are refused naming what is wrong."""
from __future__ import annotations

import numpy as np
import pytest

from backends import Generation
from studio.store import Store
from studio.store.records import RecordError, generation_rows
from studio.tasks import Prompt, get_task


def _gen(train=None, ranks=None, mask=None) -> Generation:
    T = 4
    lp = np.array([-0.1, -2.0, -0.5, -0.01], np.float32)
    return Generation(prompt_index=0, sample_idx=0, prompt="2+2=", text="4;=4", token_ids=np.arange(T),
                      token_texts=["4", ";", "=", "4"], logprobs=lp, entropies=-lp, topk_ids=np.zeros((T, 2), np.int64),
                      topk_logprobs=np.zeros((T, 2), np.float32), finish_reason="stop",
                      engine="torch 2.13.0 cpu bfloat16", train_logprobs=train, ranks=ranks, loss_mask=mask)


def _rows(gen, **kw):
    return generation_rows("run", get_task("arithmetic"), [Prompt("2+2=", {"answer": 4})], [gen], **kw)


def test_both_log_probs_and_their_producers_are_stored_side_by_side(tmp_path):
    train = np.array([-0.12, -1.9, -0.5, -0.02], np.float32)
    rows = _rows(_gen(train, np.array([1, 3, 1, 1])), policy_version="policy@abc",
                 train_policy_version="policy@abc", train_engine="torch 2.13.0 cpu float32")
    ro = rows.rollouts.iloc[0]
    assert (ro.engine, ro.train_policy_version, ro.train_engine) == (
        "torch 2.13.0 cpu bfloat16", "policy@abc", "torch 2.13.0 cpu float32")
    s = Store.open(tmp_path / "s.duckdb")
    s.write(rows.frames())
    got = s.df("SELECT pos, logprob, train_logprob, train_rank FROM tokens ORDER BY pos")
    assert got["train_logprob"].to_numpy() == pytest.approx(train)
    assert got["train_logprob"].sub(got["logprob"]).to_numpy() == pytest.approx([-0.02, 0.1, 0.0, -0.01], abs=1e-6)
    assert got["train_rank"].tolist() == [1, 3, 1, 1]
    s.close()


def test_a_rollout_without_a_recomputation_names_no_training_side():
    ro = _rows(_gen(), train_policy_version="p@x", train_engine="trainer").rollouts.iloc[0]
    assert ro.train_policy_version is None and ro.train_engine is None
    assert _rows(_gen()).tokens.column("train_logprob").null_count == 4


@pytest.mark.parametrize("train, message", [
    (np.array([-0.1, -0.2, -0.3], np.float32), "recomputed log-probs: 3 values for 4 tokens"),
    (np.array([-0.1, np.nan, -0.3, -0.1], np.float32), "NaN or infinite at token 1"),
    (np.array([-0.1, -0.2, -np.inf, -0.1], np.float32), "NaN or infinite at token 2"),
    (np.array([-0.1, -0.2, -0.3, 0.7], np.float32), "positive log-probability at token 3"),
])
def test_a_bad_recomputed_list_is_refused_naming_what_is_wrong(train, message):
    with pytest.raises(RecordError, match=message):
        _rows(_gen(train))


def test_a_masked_token_s_recomputed_value_is_not_read_and_stored_as_null():
    mask = np.array([True, True, False, True])
    gen = _gen(np.array([-0.1, -0.2, np.nan, -0.1], np.float32), mask=mask)
    gen.logprobs[2] = np.nan
    tok = _rows(gen).tokens.to_pandas()
    assert tok["train_logprob"].isna().tolist() == [False, False, True, False]
