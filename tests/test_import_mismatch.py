"""Imports of both log-probs: the behaviour one (what the sampler reported) in ``tokens.logprob``, the trainer's
recomputed one in ``tokens.train_logprob``, who produced each in ``rollouts.engine`` / ``train_engine`` /
``train_policy_version``; bad log-prob lists refused per line, the rest imported.

The fixtures (``tests/data/imports/mismatch``, written by its ``make_mismatch_fixtures.py``) keep each framework's
field names: verl ``rollout_log_probs`` / ``old_log_probs``, OpenRLHF ``rollout_log_probs`` /
``action_log_probs``, NeMo-RL ``generation_logprobs`` / ``prev_logprobs``, SkyRL ``rollout_logprobs``.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from studio.ingest import read
from studio.ingest.errors import MalformedInput
from studio.ingest.formats import ColumnMapping
from studio.ingest.importers import import_run
from studio.ingest.normalise import Slow
from studio.ingest.tail import Tailer
from studio.store import Store, shards

DATA = Path(__file__).parent / "data" / "imports" / "mismatch"


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "studio.duckdb")
    yield s
    s.close()


def _source_lists(path: Path, behaviour: str, train: str | None) -> list[tuple[list, list | None]]:
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    return [(r[behaviour], r.get(train) if train else None) for r in rows]


def _rows(store: Store, sql: str, params: list) -> list[tuple]:
    """A query's rows, NULL (pandas' NaN / NA) as None."""
    df = store.df(sql, params).astype(object)
    return [tuple(None if v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)) else v for v in r)
            for r in df.itertuples(index=False)]


def _stored(store: Store, run_id: str) -> list[tuple]:
    """Per rollout in file order: (engine, train_engine, train_policy_version, logprobs, train_logprobs, trained)."""
    ros = _rows(store, "SELECT rollout_id, engine, train_engine, train_policy_version FROM rollouts "
                       "WHERE run_id = ? ORDER BY rollout_id", [run_id])
    out = []
    for rid, eng, teng, tver in ros:
        toks = _rows(store, "SELECT logprob, train_logprob, trained FROM tokens WHERE rollout_id = ? ORDER BY pos",
                     [rid])
        out.append((eng, teng, tver, [t[0] for t in toks], [t[1] for t in toks], [t[2] for t in toks]))
    return out


def _f32(values):
    return [None if v is None else float(np.float32(v)) for v in values]


@pytest.mark.parametrize(("path", "fmt", "behaviour", "train", "version"), [
    ("verl", "verl", "rollout_log_probs", "old_log_probs", "verl@step3"),
    ("openrlhf.jsonl", "openrlhf", "rollout_log_probs", "action_log_probs", "openrlhf@step5"),
])
def test_both_log_probs_land_in_their_columns_with_their_engines(store, path, fmt, behaviour, train, version):
    rep = import_run(store, DATA / path)
    assert rep.n_rollouts == 3 and not rep.skipped
    src = DATA / path / "3.jsonl" if path == "verl" else DATA / path
    stored = _stored(store, rep.run_id)
    for (eng, teng, tver, lp, tlp, _), (b, t) in zip(stored, _source_lists(src, behaviour, train), strict=True):
        assert eng == f"{fmt} {behaviour}" and teng == f"{fmt} {train}" and tver == version
        assert lp == _f32(b) and tlp == _f32(t)
        # Δ = train − behaviour reads back exactly (the float32 values subtracted)
        d = _rows(store, "SELECT train_logprob - logprob FROM tokens t JOIN rollouts r USING (rollout_id) "
                         "WHERE r.run_id = ? AND t.logprob = ?", [rep.run_id, lp[0]])[0][0]
        assert d == pytest.approx(float(np.float32(t[0]) - np.float32(b[0])), abs=0)


def test_nemo_rl_training_data_both_sides_on_the_response_only(store):
    path = DATA / "nemo_rl" / "train_data_step7.jsonl"
    rep = import_run(store, DATA / "nemo_rl")
    assert rep.n_rollouts == 3 and not rep.skipped
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    for (eng, teng, tver, lp, tlp, trained), row in zip(_stored(store, rep.run_id), rows, strict=True):
        assert (eng, teng, tver) == ("nemo-rl generation_logprobs", "nemo-rl prev_logprobs", "nemo_rl@step7")
        n, mask = row["input_lengths"], row["token_loss_mask"]
        keep = [k == 1 for k in mask[4:n]]  # the response: from the first trained token to input_lengths
        assert trained == keep
        assert lp == _f32([v if k else None for v, k in zip(row["generation_logprobs"][4:n], keep, strict=True)])
        assert tlp == _f32([v if k else None for v, k in zip(row["prev_logprobs"][4:n], keep, strict=True)])
    assert store.df("SELECT text FROM prompts ORDER BY text")["text"].tolist() == [
        "What is 2+3?", "What is 4*4?", "What is 9-7?"]


def test_openrlhf_with_action_log_probs_only_imports_as_before(store):
    rep = import_run(store, DATA / "openrlhf_old.jsonl")
    for (eng, teng, tver, lp, tlp, _), (b, _t) in zip(
            _stored(store, rep.run_id), _source_lists(DATA / "openrlhf_old.jsonl", "action_log_probs", None),
            strict=True):
        assert eng == "openrlhf action_log_probs" and teng is None and tver is None
        assert lp == _f32(b) and tlp == [None] * len(b)


def test_verl_agent_loop_tool_tokens_have_no_recomputed_log_prob(store):
    rep = import_run(store, DATA / "verl_agent")
    rows = _source_lists(DATA / "verl_agent" / "2.jsonl", "rollout_log_probs", "old_log_probs")
    for (eng, teng, tver, lp, tlp, trained), (b, t) in zip(_stored(store, rep.run_id), rows, strict=True):
        assert eng == "verl rollout_log_probs" and teng == "verl old_log_probs" and tver == "verl_agent@step2"
        assert trained == [True, True, True, False, False, True]
        assert tlp == _f32([*t[:3], None, None, t[5]]) and lp == _f32([*b[:3], None, None, b[5]])


def test_skyrl_behaviour_side_only(store):
    rep = import_run(store, DATA / "skyrl.jsonl")
    stored = _stored(store, rep.run_id)
    assert [s[:3] for s in stored] == [("skyrl rollout_logprobs", None, None)] * 3
    assert all(s[3][0] is not None and s[4] == [None] * 6 for s in stored)


def test_slime_rollout_dump_behaviour_side(store):
    import torch
    samples = torch.load(DATA / "slime" / "rollout_4.pt", weights_only=True)["samples"]
    rep = import_run(store, DATA / "slime")
    assert rep.n_rollouts == 3 and not rep.skipped
    stored = _stored(store, rep.run_id)
    for (eng, teng, tver, lp, tlp, trained), sample in zip(stored, samples, strict=True):
        assert (eng, teng, tver) == ("slime rollout_log_probs", None, None)
        assert lp == _f32(sample["rollout_log_probs"]) and tlp == [None] * 6 and trained == [True] * 6
    assert store.df("SELECT DISTINCT train_step FROM rollouts")["train_step"].tolist() == [4]  # its rollout_id


def test_generic_column_pair(store):
    m = ColumnMapping.parse(["prompt=question", "completion=answer", "logprobs=sampler_lp",
                             "train_logprobs=trainer_lp"])
    rep = import_run(store, DATA / "generic.parquet", "generic", mapping=m, name="sweep")
    t = pq.read_table(DATA / "generic.parquet").to_pylist()
    for (eng, teng, tver, lp, tlp, _), row in zip(_stored(store, rep.run_id), t, strict=True):
        assert (eng, teng, tver) == ("generic sampler_lp", "generic trainer_lp", "sweep")
        assert lp == _f32(row["sampler_lp"]) and tlp == _f32(row["trainer_lp"])


def _bad_verl(tmp_path: Path) -> Path:
    rows = [json.loads(x) for x in (DATA / "verl" / "3.jsonl").read_text().splitlines()]
    good = rows[0]
    bad = [dict(good, old_log_probs=good["old_log_probs"][:4]),
           dict(good, rollout_log_probs=good["rollout_log_probs"] + [-0.1]),
           dict(good, old_log_probs=[float("nan"), *good["old_log_probs"][1:]]),
           dict(good, rollout_log_probs=[*good["rollout_log_probs"][:2], float("inf"), *good["rollout_log_probs"][3:]]),
           dict(good, old_log_probs=[0.5, *good["old_log_probs"][1:]])]
    d = tmp_path / "dump"
    d.mkdir()
    (d / "3.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [good, *bad, rows[1]]))
    return d


def test_bad_log_prob_lists_are_refused_per_line_the_rest_imported(store, tmp_path):
    d = _bad_verl(tmp_path)
    rep = import_run(store, d, on_error="skip")
    assert rep.n_rollouts == 2 and rep.n_tokens == 12
    msgs = {p.line: p.message for p in rep.skipped}
    assert msgs[2] == "'old_log_probs' has 4 values but 'rollout_log_probs' has 6"
    assert msgs[3] == "'old_log_probs' has 6 values but 'rollout_log_probs' has 7"
    assert msgs[4].startswith("old_log_probs has nan at token 0")
    assert msgs[5].startswith("rollout_log_probs has inf at token 2")
    assert msgs[6].startswith("old_log_probs has 0.5 at token 0: a log-prob is at most 0")
    assert "3.jsonl:2: 'old_log_probs' has 4 values" in str(rep.skipped[0])
    with pytest.raises(MalformedInput):  # aborting stores nothing
        import_run(Store.open(tmp_path / "other.duckdb"), d)


def test_bad_agent_log_probs_name_the_line(store, tmp_path):
    rows = [json.loads(x) for x in (DATA / "verl_agent" / "2.jsonl").read_text().splitlines()]
    rows[1]["old_log_probs"] = rows[1]["old_log_probs"][:5]
    (tmp_path / "2.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rep = import_run(store, tmp_path / "2.jsonl", "verl-agent", on_error="skip")
    assert rep.n_rollouts == 2 and [(p.line, p.message) for p in rep.skipped] == [
        (2, "'old_log_probs' has 5 values but 'response_ids' has 6 tokens")]


def test_bad_nemo_rl_log_probs_name_the_line(store, tmp_path):
    rows = [json.loads(x) for x in (DATA / "nemo_rl" / "train_data_step7.jsonl").read_text().splitlines()]
    rows[0]["prev_logprobs"] = rows[0]["prev_logprobs"][:8]
    rows[2]["generation_logprobs"][5] = 0.25
    (tmp_path / "train_data_step7.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rep = import_run(store, tmp_path / "train_data_step7.jsonl", on_error="skip")
    assert rep.n_rollouts == 1 and [(p.line, p.message) for p in rep.skipped] == [
        (1, "prev_logprobs has 8 values for 10 tokens"),
        (3, "generation_logprobs has 0.25 at token 1: a log-prob is at most 0")]
    assert store.df("SELECT count(*) AS n FROM rollouts")["n"][0] == 1


def test_arrow_fast_path_and_line_by_line_path_agree(tmp_path, monkeypatch):
    rows = [json.loads(x) for x in (DATA / "openrlhf.jsonl").read_text().splitlines()]
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, tmp_path / "fast.parquet")
    fast = Store.open(tmp_path / "a.duckdb")
    rep_fast = import_run(fast, tmp_path / "fast.parquet", "openrlhf")
    slow = Store.open(tmp_path / "b.duckdb")

    def no_fast(*_a, **_k):
        raise Slow
    monkeypatch.setattr(read, "arrow_batch", no_fast)
    rep_slow = import_run(slow, tmp_path / "fast.parquet", "openrlhf")
    assert _stored(fast, rep_fast.run_id) == _stored(slow, rep_slow.run_id)
    fast.close()
    slow.close()


def test_a_sharded_import_keeps_the_recomputed_log_probs(tmp_path, monkeypatch):
    monkeypatch.setattr(shards, "SHARD_MIN_ROWS", 10)
    rows = [json.loads(x) for x in (DATA / "verl" / "3.jsonl").read_text().splitlines()]
    d = tmp_path / "dump"
    d.mkdir()
    (d / "3.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows * 4))
    s = Store.open(tmp_path / "s.duckdb")
    rep = import_run(s, d)
    assert list((tmp_path).rglob("*.parquet")), "the import should have streamed into a shard"
    stored = _stored(s, rep.run_id)
    assert len(stored) == 12 and all(x[4] == _f32(rows[0]["old_log_probs"]) for x in stored
                                     if x[3] == _f32(rows[0]["rollout_log_probs"]))
    assert all(None not in x[4] for x in stored)
    s.close()


def test_tailing_a_folder_keeps_both_log_probs(store, tmp_path):
    d = tmp_path / "live"
    d.mkdir()
    src = (DATA / "verl" / "3.jsonl").read_text().splitlines(keepends=True)
    (d / "3.jsonl").write_text(src[0])
    tailer = Tailer(store, d, fmt="verl")
    assert tailer.poll().n_rollouts == 1
    with open(d / "3.jsonl", "a") as f:
        f.writelines(src[1:])
    rep = tailer.poll()
    assert rep.n_rollouts == 2
    stored = _stored(store, rep.run_id)
    assert len(stored) == 3 and all(x[1] == "verl old_log_probs" and None not in x[4] for x in stored)
    shutil.rmtree(d)
