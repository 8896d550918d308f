"""Importers and tailing, on fixtures written here in each trainer's own format.

TRL: the frame ``GRPOTrainer.log()`` builds and writes with ``to_parquet`` to
``completions/completions_{step:05d}.parquet``; verl: ``RayPPOTrainer._dump_generations``'s
``{step}.jsonl`` (``json.dumps(entry, ensure_ascii=False)`` lines); OpenRLHF / RL-Logging-Board:
one JSON object per line with token-level lists.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from studio import queries
from studio.face.cli import import_ as import_cli
from studio.ingest import read, write
from studio.ingest.errors import ImportFormatError, MalformedInput
from studio.ingest.formats import ColumnMapping, detect_format
from studio.ingest.importers import import_run
from studio.ingest.tail import Tailer
from studio.store import Store
from tests.fixtures import board_line, trl_log, verl_dump, write_jsonl

FUZZ = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])
TABLES = ("runs", "prompts", "rollouts", "tokens", "token_scores", "rewards", "rule_versions", "import_files")


@pytest.fixture()
def store(empty_store):
    return empty_store


def fingerprint(store) -> dict:
    return {t: store.scalar(f"SELECT count(*) FROM {t}") for t in TABLES}


# ----------------------------------------------------------------------------------- writers in the real formats

# ----------------------------------------------------------------------------------- TRL

def test_trl_completions_tables_import_steps_groups_rewards_and_advantages(store, tmp_path):
    out = tmp_path / "grpo-run"
    qs = ["What is 2+2?", "Name a prime."]
    rng = np.random.default_rng(1)
    for step in (10, 20):
        prompts = [q for q in qs for _ in range(4)]
        acc = rng.integers(0, 2, 8).astype(float).tolist()
        fmt = [0.5] * 7 + [None]  # a reward function that returned None: NaN in the table
        trl_log(out, step, prompts, [f"{p} -> answer {i}" for i, p in enumerate(prompts)],
                {"accuracy_reward": acc, "format_reward": fmt}, extra={"solution": ["4"] * 8})
    assert detect_format(out) == "trl"
    rep = import_run(store, out)
    assert (rep.n_rollouts, rep.n_files, rep.skipped) == (16, 2, [])
    run = store.df("SELECT * FROM runs WHERE run_id = ?", [rep.run_id]).iloc[0]
    assert (run["kind"], run["name"], run["task"]) == ("import", "grpo-run", "import")
    assert json.loads(run["config"])["format"] == "trl"
    ro = store.df("SELECT * FROM rollouts ORDER BY rollout_id")
    assert sorted(set(ro["train_step"])) == [10, 20]
    assert ro.groupby("group_id").size().tolist() == [4] * 4  # one prompt at one step
    assert ro.groupby("group_id")["sample_idx"].apply(sorted).tolist() == [[0, 1, 2, 3]] * 4
    vid = rep.rule_versions[0]
    assert vid.startswith("import-trl@")
    for step in (10, 20):
        src = pd.read_parquet(out / "completions" / f"completions_{step:05d}.parquet")
        got = ro[ro["train_step"] == step].reset_index(drop=True)  # ids sort in file order
        assert got["text"].tolist() == src["completion"].tolist()
        assert np.allclose(got["train_advantage"], src["advantage"])
        table = queries.rollout_table(store, queries.RolloutFilter(train_step=step, run_id=rep.run_id))
        table = table.set_index("completion").loc[src["completion"]]
        # the studio's GRPO advantage from the imported rewards is the one TRL trained with
        assert np.allclose(table["advantage"], src["advantage"], atol=1e-6)
        assert table["reward"].tolist() == pytest.approx(np.nansum(src[["accuracy_reward", "format_reward"]], 1))
        assert table["correct"].tolist() == (src["accuracy_reward"] >= 1).tolist()
    comps = queries.components(store, ro["rollout_id"].tolist())
    last = comps[ro["rollout_id"].iloc[7]]  # format_reward was None: no component row, total still there
    assert set(last) == {"total", "accuracy_reward", "accuracy"}
    assert set(comps[ro["rollout_id"].iloc[0]]) == {"total", "accuracy_reward", "format_reward", "accuracy"}
    # the text column `solution` (logged extra) is not a reward
    assert store.scalar("SELECT count(*) FROM rewards WHERE component = 'solution'") == 0
    files = store.df("SELECT path, format, n_rows, consumed, size FROM import_files ORDER BY path")
    assert files["n_rows"].tolist() == [8, 8] and (files["consumed"] == files["size"]).all()


def test_trl_conversational_prompts_keep_their_messages(store, tmp_path):
    out = tmp_path / "chat-run"
    prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    completions = [[{"role": "assistant", "content": f"It is {a}."}] for a in (4, 5, 4, 3)]
    trl_log(out, 1, [prompt] * 4, completions, {"accuracy_reward": [1.0, 0.0, 1.0, 0.0]})
    rep = import_run(store, out, "trl")
    p = store.df("SELECT * FROM prompts").iloc[0]
    assert p["text"] == "2+2?"  # the last user message; the messages are the prompt's chat
    assert json.loads(p["messages"]) == prompt
    assert store.scalar("SELECT count(*) FROM rollouts WHERE prompt_text IS NOT NULL") == 0  # no templated string given
    assert sorted(store.df("SELECT text FROM rollouts")["text"]) == ["It is 3.", "It is 4.", "It is 4.", "It is 5."]
    assert rep.n_rollouts == 4 and store.scalar("SELECT count(DISTINCT group_id) FROM rollouts") == 1


def test_trl_logged_table_json(store, tmp_path):
    """The completions table as logged (wandb Table JSON: columns + data)."""
    df = pd.DataFrame({"step": [3, 3], "prompt": ["q", "q"], "completion": ["a", "b"], "r1": [1.0, 0.0],
                       "advantage": [0.7, -0.7]})
    path = tmp_path / "completions_3.table.json"
    path.write_text(json.dumps({"_type": "table", "columns": list(df.columns), "data": df.values.tolist()}))
    rep = import_run(store, path, "trl")
    assert rep.n_rollouts == 2
    assert sorted(store.df("SELECT train_advantage FROM rollouts")["train_advantage"]) == [-0.7, 0.7]


# ----------------------------------------------------------------------------------- verl

def test_verl_dumps_import_score_extra_rewards_gold_and_groups(store, tmp_path):
    d = tmp_path / "rollout_data"
    for step in (1, 2):
        # verl repeats each prompt n times, interleaved: prompt i's samples sit together
        inputs = ["<|user|>1+1=?"] * 3 + ["<|user|>2+3=?"] * 3
        outputs = ["2", "3", "2", "5", "5", "6"]
        gts = ["2"] * 3 + ["5"] * 3
        acc = [o == g for o, g in zip(outputs, gts)]
        scores = [1.0 if a else 0.0 for a in acc]
        verl_dump(d, step, inputs, outputs, gts, scores, {"acc": acc, "pred": outputs, "score": scores, "x": [1]})
    (d / "metrics.jsonl").write_text('{"loss": 1}\n')  # not a {step}.jsonl dump: left alone
    assert detect_format(d) == "verl"
    rep = import_run(store, d)
    assert (rep.n_rollouts, rep.n_files) == (12, 2)
    golds = store.df("SELECT text, gold FROM prompts ORDER BY text")
    assert [json.loads(g) for g in golds["gold"]] == [{"answer": "2"}, {"answer": "5"}]
    t = queries.rollout_table(store)
    assert len(t) == 12 and t.groupby("group_id").size().tolist() == [3] * 4
    assert (t["reward"] == t["correct"].astype(float)).all()  # total = score; accuracy = acc
    comps = queries.components(store, t["rollout_id"].tolist())
    assert all(set(c) == {"total", "acc", "accuracy"} for c in comps.values())  # `pred` is text, not a reward
    assert sorted(store.df("SELECT DISTINCT train_step FROM rollouts")["train_step"]) == [1, 2]


# ----------------------------------------------------------------------------------- OpenRLHF / RL-Logging-Board

def test_openrlhf_board_jsonl_token_level_fields(store, tmp_path):
    d = tmp_path / "board"
    d.mkdir()
    rows = [board_line("Tell a joke.", ["Why", " did", " the"], 0.5, 100, 1),
            board_line("Tell a joke.", ["Knock", " knock"], 1.0, 100, 2),
            board_line("Sum 1+1", ["2"], 0.0, 101, 3)]
    write_jsonl(d / "rollouts.jsonl", rows)
    assert detect_format(d) == "openrlhf"
    rep = import_run(store, d)
    assert (rep.n_rollouts, rep.n_tokens) == (3, 6)
    ro = store.df("SELECT * FROM rollouts ORDER BY rollout_id")
    assert ro["n_tokens"].tolist() == [3, 2, 1] and ro["train_step"].tolist() == [100, 100, 101]
    assert ro["group_id"].nunique() == 2
    for rid, row in zip(ro["rollout_id"], rows):
        tok = queries.tokens(store, rid)
        assert tok["token_text"].tolist() == row["response_tokens"]
        assert np.allclose(tok["logprob"], row["logprobs"], atol=1e-6)
        ref = store.df("SELECT ref_logprob FROM tokens WHERE rollout_id = ? ORDER BY pos", [rid])["ref_logprob"]
        assert np.allclose(ref, row["ref_logprobs"], atol=1e-6)
        val = store.df("SELECT value, policy_version FROM token_scores WHERE rollout_id = ? ORDER BY pos", [rid])
        assert np.allclose(val["value"], row["values"], atol=1e-6)
        assert set(val["policy_version"]) == {f"value-import@{rep.run_id}"}
    assert sorted(queries.rollout_table(store)["reward"]) == [0.0, 0.5, 1.0]


def test_openrlhf_aliases(store, tmp_path):
    rows = [{"query": "q", "response": "ab", "response_token_ids": [5, 6], "action_log_probs": [-0.5, -0.25],
             "base_action_log_probs": [-0.6, -0.2], "rewards": 2.0, "global_step": 4, "advantages": [0.3, 0.3],
             "answer": "ab", "is_correct": True}]
    rep = import_run(store, write_jsonl(tmp_path / "exp.jsonl", rows), "openrlhf")
    assert rep.n_tokens == 2
    tok = store.df("SELECT token_id, logprob, ref_logprob FROM tokens ORDER BY pos")
    assert tok["token_id"].tolist() == [5, 6] and tok["ref_logprob"].tolist() == pytest.approx([-0.6, -0.2])
    ro = store.df("SELECT train_step, train_advantage FROM rollouts").iloc[0]
    assert (ro["train_step"], ro["train_advantage"]) == (4, pytest.approx(0.3))
    assert queries.rollout_table(store).iloc[0][["reward", "correct"]].tolist() == [2.0, True]
    assert json.loads(store.scalar("SELECT gold FROM prompts")) == {"answer": "ab"}


# ----------------------------------------------------------------------------------- generic

GENERIC = ColumnMapping(prompt="question", completion="answer", step="it", group="gid", rewards=("fmt", "correct"),
                        token_texts="toks", logprobs="lp", entropies="ent", finish_reason="why")


def generic_rows(n: int = 6) -> list[dict]:
    return [{"question": f"q{i // 3}", "answer": f"a{i}", "it": 1, "gid": f"g{i // 2}", "fmt": 0.1 * i,
             "correct": i % 2, "toks": ["x"] * (i + 1), "lp": [-0.5] * (i + 1), "ent": [0.25] * (i + 1),
             "why": "stop"} for i in range(n)]


@pytest.mark.parametrize("ext", ["jsonl", "parquet"])
def test_generic_with_a_column_mapping(store, tmp_path, ext):
    rows = generic_rows()
    path = tmp_path / f"dump.{ext}"
    if ext == "jsonl":
        write_jsonl(path, rows)
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(ImportFormatError, match="column mapping"):
        import_run(store, path, "generic")
    rep = import_run(store, path, "generic", mapping=GENERIC)
    assert (rep.n_rollouts, rep.n_tokens) == (6, 21)
    ro = store.df("SELECT * FROM rollouts ORDER BY rollout_id")
    assert ro.groupby("group_id").size().tolist() == [2, 2, 2]  # the mapped group, not the prompt
    assert set(ro["finish_reason"]) == {"stop"}
    t = queries.rollout_table(store)
    assert sorted(t["reward"]) == pytest.approx(sorted(0.1 * i + i % 2 for i in range(6)))  # sum of components
    tok = queries.tokens(store, ro["rollout_id"].iloc[2])
    assert tok["entropy"].tolist() == [0.25] * 3 and tok["logprob"].tolist() == [-0.5] * 3


def test_generic_mapping_of_a_missing_column_names_it(store, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", generic_rows(2))
    with pytest.raises(ImportFormatError) as err:
        import_run(store, path, "generic", mapping=ColumnMapping(prompt="question", completion="output"))
    assert "'output'" in str(err.value) and "question" in str(err.value)
    assert fingerprint(store)["rollouts"] == 0


def test_column_mapping_fields_carry_help_and_parse_from_the_cli():
    from dataclasses import fields

    assert all(f.metadata.get("help") for f in fields(ColumnMapping))
    m = ColumnMapping.parse(["prompt=q", "completion=a", "rewards=r1, r2"])
    assert (m.prompt, m.completion, m.rewards) == ("q", "a", ("r1", "r2"))
    with pytest.raises(ValueError, match="field=column"):
        ColumnMapping.parse(["nonsense=x"])


# ----------------------------------------------------------------------------------- bad input

def verl_lines(n: int, step: int = 1) -> list[str]:
    return [json.dumps({"input": f"p{i // 2}", "output": f"o{i}", "gts": "1", "score": float(i % 2), "step": step})
            for i in range(n)]


def test_malformed_lines_are_reported_by_file_and_line_then_abort_or_skip(store, tmp_path):
    d = tmp_path / "dumps"
    d.mkdir()
    good = write_jsonl(d / "1.jsonl", verl_lines(4))
    lines = verl_lines(7, step=2)
    lines[2] = '{"input": "p1", "output": '  # line 3: cut JSON
    lines[4] = json.dumps({"input": "p2", "score": 1.0})  # line 5: no output
    lines[5] = json.dumps({"input": "p2", "output": "x", "score": "high"})  # line 6: a score that is text
    bad = write_jsonl(d / "2.jsonl", lines)
    before = fingerprint(store)
    with pytest.raises(MalformedInput) as err:
        import_run(store, d)
    probs = err.value.problems
    assert [(Path(p.file), p.line) for p in probs] == [(bad, 3), (bad, 5), (bad, 6)]
    assert "JSON" in probs[0].message and "'output'" in probs[1].message and "'score'" in probs[2].message
    assert fingerprint(store) == before  # not even the good first file
    rep = import_run(store, d, on_error="skip")
    assert rep.n_rollouts == 4 + 4 and [p.line for p in rep.skipped] == [3, 5, 6]
    assert str(rep.skipped[0]).startswith(f"{bad}:3: ")
    files = dict(store.cursor().execute("SELECT path, n_skipped FROM import_files").fetchall())
    assert files == {str(good): 0, str(bad): 3}


def test_a_first_line_that_is_not_an_object_is_a_problem_not_a_crash(store, tmp_path):
    path = write_jsonl(tmp_path / "1.jsonl", ["null", *verl_lines(2)])  # pyarrow 26's reader segfaults on this
    with pytest.raises(MalformedInput) as err:
        import_run(store, path, "verl")
    assert [(p.line, p.message) for p in err.value.problems] == [(1, "expected a JSON object, got null")]
    assert import_run(store, path, "verl", on_error="skip").n_rollouts == 2


def test_a_file_that_is_not_what_its_importer_expects_names_the_missing_fields(store, tmp_path):
    path = write_jsonl(tmp_path / "1.jsonl", [{"input": "p", "answer": "x", "step": 1}])
    with pytest.raises(ImportFormatError) as err:
        import_run(store, path, "verl")
    msg = str(err.value)
    assert "missing completion (output)" in msg and "reward (score)" in msg and "answer, input, step" in msg
    parquet = tmp_path / "completions_00001.parquet"
    pd.DataFrame({"step": [1], "question": ["q"]}).to_parquet(parquet)
    with pytest.raises(ImportFormatError, match=r"missing prompt \(prompt\), completion \(completion\)"):
        import_run(store, parquet, "trl")
    with pytest.raises(ImportFormatError, match="cannot tell the format"):
        detect_format(parquet)
    assert fingerprint(store)["runs"] == 0


def test_unreadable_parquet_is_a_problem_and_ragged_tokens_a_bad_row(store, tmp_path):
    bad = tmp_path / "broken.parquet"
    bad.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(MalformedInput, match="cannot read"):
        import_run(store, bad, "trl")
    rows = generic_rows(3)
    rows[1]["lp"] = [-0.5]  # 1 log-prob for 2 tokens
    path = tmp_path / "ragged.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(MalformedInput) as err:
        import_run(store, path, "generic", mapping=GENERIC)
    assert [(p.line, p.message) for p in err.value.problems] == [(2, "'lp' has 1 values but 'toks' has 2")]
    rep = import_run(store, path, "generic", mapping=GENERIC, on_error="skip")
    assert rep.n_rollouts == 2 and rep.n_tokens == 1 + 3


def test_fast_and_slow_paths_store_the_same_rows(tmp_path, monkeypatch):
    rows = [board_line(f"p{i % 2}", ["a", "b", "c"][: i % 3 + 1], float(i), i // 2, i) for i in range(6)]
    rows[4]["ref_logprobs"] = None  # a row without reference log-probs (2 tokens)
    path = write_jsonl(tmp_path / "r.jsonl", rows)

    def stored(s):
        ro = s.df("SELECT train_step, sample_idx, text, n_tokens, prompt_id FROM rollouts ORDER BY rollout_id")
        tok = s.df("SELECT pos, token_text, logprob, ref_logprob FROM tokens ORDER BY rollout_id, pos")
        rw = s.df("SELECT component, value FROM rewards ORDER BY rollout_id, component")
        return ro, tok, rw

    fast = Store.open(":memory:")
    import_run(fast, path)
    monkeypatch.setattr(read, "_jsonl_arrow", lambda data: None)  # every line through the Python pass
    slow = Store.open(":memory:")
    import_run(slow, path)
    try:
        for a, b in zip(stored(fast), stored(slow)):
            pd.testing.assert_frame_equal(a, b)
        assert stored(fast)[1]["ref_logprob"].isna().sum() == 2
    finally:
        fast.close()
        slow.close()


@pytest.mark.parametrize("groups, dictionary, slice_rows, as_dict", [
    (None, True, None, True),  # one row group: read as a dictionary
    (3, True, 16, True),  # row groups of 3 rows, slices of 2: a dictionary per row group, slices within them
    (3, True, None, False),  # row groups far smaller than a slice: read plainly, slices across them
    (None, False, None, True),  # texts written without a dictionary: still read as one
])
def test_parquet_token_texts_read_as_a_dictionary_store_the_same_rows(tmp_path, monkeypatch, groups, dictionary,
                                                                      slice_rows, as_dict):
    """Parquet token texts are read dictionary-encoded and stored from the dictionary (and each token's
    rollout id from the slice's ids): the rows equal a JSONL import of the same records, with a NULL
    text in a list, a row without token lists and texts that occur once."""
    rows = generic_rows(7)
    rows[2]["toks"] = ["x", None, "y"]  # a NULL token text
    rows[4].update(toks=None, lp=None, ent=None)  # no token fields at all
    rows[5]["toks"] = [f"t{k}" for k in range(6)]  # texts that occur once

    def stored(s):
        return s.df("""SELECT ro.text, t.pos, t.token_text, t.logprob, t.entropy FROM tokens t
                       JOIN rollouts ro USING (rollout_id) ORDER BY ro.text, t.pos""")

    want = Store.open(":memory:")
    import_run(want, write_jsonl(tmp_path / "d.jsonl", rows), "generic", mapping=GENERIC)
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, use_dictionary=dictionary, row_group_size=groups)
    if slice_rows:
        monkeypatch.setattr(read, "SLICE", slice_rows)
    opened, real = [], pq.ParquetFile

    def spy(*args, **kw):  # how the importer opens the file
        opened.append(kw)
        return real(*args, **kw)
    monkeypatch.setattr(read.pq, "ParquetFile", spy)
    got = Store.open(":memory:")
    try:
        rep = import_run(got, path, "generic", mapping=GENERIC)
        assert rep.n_tokens == sum(len(r["toks"] or []) for r in rows)
        assert any(k.get("read_dictionary") == ["toks.list.element"] for k in opened) == as_dict
        pd.testing.assert_frame_equal(stored(got), stored(want))
    finally:
        got.close()
        want.close()


@pytest.mark.parametrize("ext", ["jsonl", "parquet"])
def test_slices_keep_groups_whole_and_tokens_in_order(tmp_path, monkeypatch, ext):
    rows = [{**r, "gid": f"g{i % 2}"} for i, r in enumerate(generic_rows(7))]  # groups interleaved over slices
    path = tmp_path / f"d.{ext}"
    write_jsonl(path, rows) if ext == "jsonl" else pq.write_table(pa.Table.from_pylist(rows), path)

    def stored(s):
        return (s.df("""SELECT ro.text, ro.sample_idx, ro.n_tokens, g.first_text FROM rollouts ro JOIN
                        (SELECT group_id, min(text) AS first_text FROM rollouts GROUP BY group_id) g USING (group_id)
                        ORDER BY ro.rollout_id"""),
                s.df("SELECT ro.text, t.pos, t.logprob FROM tokens t JOIN rollouts ro USING (rollout_id) "
                     "ORDER BY ro.rollout_id, t.pos"))

    whole = Store.open(":memory:")
    import_run(whole, path, "generic", mapping=GENERIC)
    monkeypatch.setattr(read, "SLICE", 3)
    monkeypatch.setattr(write, "TOKEN_SLICE", 4)
    sliced = Store.open(":memory:")
    import_run(sliced, path, "generic", mapping=GENERIC)
    try:
        for a, b in zip(stored(whole), stored(sliced)):
            pd.testing.assert_frame_equal(a, b)
        ro = stored(sliced)[0]
        assert ro["sample_idx"].tolist() == [0, 0, 1, 1, 2, 2, 3] and ro["first_text"].nunique() == 2
    finally:
        whole.close()
        sliced.close()


def test_cancel_and_errors_leave_nothing_behind(store, tmp_path):
    d = tmp_path / "run"
    for step in (1, 2, 3):
        trl_log(d, step, ["q"] * 4, ["a", "b", "c", "d"], {"r": [1.0, 0.0, 0.0, 1.0]})
    before, cancel, seen = fingerprint(store), threading.Event(), []

    def progress(done, total):
        seen.append((done, total))
        if done:
            cancel.set()  # after the first file

    rep = import_run(store, d, progress=progress, cancel=cancel)
    assert rep.status == "cancelled" and rep.n_rollouts == 0 and fingerprint(store) == before
    assert seen[0][0] == 0 and seen[-1][1] == sum(f.stat().st_size for f in (d / "completions").iterdir())
    (d / "completions" / "completions_00003.parquet").write_bytes(b"garbage")
    with pytest.raises(MalformedInput):
        import_run(store, d)
    assert fingerprint(store) == before


# ----------------------------------------------------------------------------------- re-import and tail

def test_reimport_adds_only_what_is_new(store, tmp_path):
    d = tmp_path / "dumps"
    d.mkdir()
    path = write_jsonl(d / "1.jsonl", verl_lines(4))
    first = import_run(store, d)
    again = import_run(store, d)
    assert (again.run_id, again.n_rollouts) == (first.run_id, 0)
    write_jsonl(path, verl_lines(2, step=1)[:1], mode="a")
    more = import_run(store, d)
    assert (more.run_id, more.n_rollouts) == (first.run_id, 1)
    assert store.scalar("SELECT count(*) FROM rollouts") == 5
    other = import_run(store, d, task="arithmetic")  # another request (another task): another run
    assert other.run_id != first.run_id and other.n_rollouts == 5


def test_tail_picks_up_shards_written_after_it_started(store, tmp_path):
    out = tmp_path / "live"
    out.mkdir()
    tailer = Tailer(store, out, interval_s=0.05)
    assert tailer.poll() is None and "waiting for files" in tailer.status["last_error"]
    (out / "completions").mkdir()  # TRL makes it before the first shard
    assert tailer.poll() is None and tailer.status["format"] is None
    trl_log(out, 1, ["q"] * 4, ["a", "b", "c", "d"], {"r": [1.0, 0.0, 0.0, 1.0]})
    rep = tailer.poll()
    assert rep.n_rollouts == 4 and tailer.status["format"] == "trl"
    # a shard being written: no footer yet, so it waits without being reported as bad
    trl_log(tmp_path / "scratch", 2, ["q"] * 4, ["e", "f", "g", "h"], {"r": [0.0, 0.0, 1.0, 1.0]})
    whole = (tmp_path / "scratch" / "completions" / "completions_00002.parquet").read_bytes()
    half = out / "completions" / "completions_00002.parquet"
    half.write_bytes(whole[: len(whole) // 2])
    assert tailer.poll() is None and tailer.status["waiting"] == [str(half)] and tailer.status["last_error"] is None
    half.write_bytes(whole)
    tailer.start()
    try:
        deadline = time.monotonic() + 10
        while tailer.status["rollouts"] < 8 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert tailer.status["running"]
    finally:
        tailer.stop()
    st_ = tailer.status
    assert (st_["rollouts"], st_["files"], st_["running"], st_["waiting"]) == (8, 2, False, [])
    assert st_["last_poll"] <= time.time() and st_["run_id"] == rep.run_id
    assert sorted(store.df("SELECT DISTINCT train_step FROM rollouts")["train_step"]) == [1, 2]
    assert store.scalar("SELECT count(*) FROM runs") == 1


def test_tail_jsonl_complete_lines_only_and_resume_without_duplicates(tmp_path):
    db = tmp_path / "studio.duckdb"
    d = tmp_path / "rollout_data"
    d.mkdir()
    path = write_jsonl(d / "1.jsonl", verl_lines(2))
    store = Store.open(db)
    tailer = Tailer(store, d, fmt="verl")
    assert tailer.poll().n_rollouts == 2
    with open(path, "a") as f:  # a line still being written
        f.write(verl_lines(3)[2][:20])
    assert tailer.poll() is None
    with open(path, "a") as f:
        f.write(verl_lines(3)[2][20:] + "\n")
    assert tailer.poll().n_rollouts == 1
    write_jsonl(path, ["{oops", verl_lines(4)[3]], mode="a")  # lines 4 and 5: numbered in the whole file
    rep = tailer.poll()
    assert rep.n_rollouts == 1 and [(p.line, p.file) for p in rep.skipped] == [(4, str(path))]
    run_id = tailer.run_id
    store.close()
    store = Store.open(db)  # the studio restarted: a new Tailer on the same directory continues the run
    write_jsonl(d / "2.jsonl", verl_lines(2, step=2))
    again = Tailer(store, d, fmt="verl")
    rep = again.poll()
    assert (rep.run_id, rep.n_rollouts) == (run_id, 2)
    assert store.scalar("SELECT count(*) FROM rollouts") == 6 and store.scalar("SELECT count(*) FROM runs") == 1
    assert again.poll() is None
    # the studio's way: import the folder, then keep watching it as the same run
    d2 = tmp_path / "second"
    d2.mkdir()
    write_jsonl(d2 / "1.jsonl", verl_lines(2))
    first = import_run(store, d2, name="live")
    write_jsonl(d2 / "2.jsonl", verl_lines(2, step=2))
    follow = Tailer(store, d2, run_id=first.run_id)
    assert follow.poll().run_id == first.run_id and follow.status["rollouts"] == 4
    assert store.scalar("SELECT count(*) FROM rollouts WHERE run_id = ?", [first.run_id]) == 4
    store.close()


def test_a_group_written_across_two_polls_stays_one_group(store, tmp_path):
    """verl writes a step's file line by line: a poll may catch half a prompt's completions; the
    rest join the same group and its sample indices go on (the GRPO advantage needs the group)."""
    d = tmp_path / "live"
    d.mkdir()
    lines = [json.dumps({"input": "Q: 2+2=", "output": f"o{i}", "gts": "4", "score": float(i % 2), "step": 5})
             for i in range(8)]
    path = write_jsonl(d / "5.jsonl", lines[:3])
    tailer = Tailer(store, d, fmt="verl")
    assert tailer.poll().n_rollouts == 3
    write_jsonl(path, lines[3:], mode="a")
    assert tailer.poll().n_rollouts == 5
    g = store.df("SELECT group_id, sample_idx, text FROM rollouts ORDER BY sample_idx")
    assert g["group_id"].nunique() == 1 and g["sample_idx"].tolist() == list(range(8))
    assert g["text"].tolist() == [f"o{i}" for i in range(8)]
    t = queries.rollout_table(store)
    adv = t["advantage"].to_numpy()  # one group of 4 right and 4 wrong: ±(0.5 / the group's std)
    assert (adv > 0).sum() == 4 and (adv < 0).sum() == 4 and np.allclose(abs(adv), 0.5 / (np.std([0, 1] * 4, ddof=1) + 1e-4))


# ----------------------------------------------------------------------------------- CLI

def test_cli_imports_and_reports_bad_lines_with_exit_code_2(tmp_path, capsys):
    db = tmp_path / "s.duckdb"
    d = tmp_path / "dumps"
    d.mkdir()
    lines = verl_lines(3)
    lines[1] = "not json"
    bad = write_jsonl(d / "1.jsonl", lines)
    assert import_cli.main([str(d), "--db", str(db)]) == 2
    err = capsys.readouterr().err  # refusals go to stderr, each bad line with its file and line
    assert f"{bad}:2: not valid JSON" in err and "error:" in err
    s = Store.open(db)
    assert s.scalar("SELECT count(*) FROM rollouts") == 0
    s.close()
    assert import_cli.main([str(d), "--db", str(db), "--skip-bad", "--name", "mine"]) == 0
    out = capsys.readouterr().out
    assert "2 rollouts" in out and f"{bad}:2:" in out
    gen = write_jsonl(tmp_path / "g.jsonl", generic_rows(2))
    assert import_cli.main([str(gen), "--db", str(db), "--format", "generic", "--map", "prompt=question",
                    "--map", "completion=answer", "--map", "rewards=fmt,correct"]) == 0
    assert import_cli.main([str(gen), "--db", str(db), "--format", "generic", "--map", "prompt=nope"]) == 2
    s = Store.open(db)
    assert s.scalar("SELECT count(*) FROM rollouts") == 4
    assert s.scalar("SELECT name FROM runs WHERE name = 'mine'") == "mine"
    s.close()


# ----------------------------------------------------------------------------------- fuzz

texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)
numbers = st.one_of(st.none(), st.floats(-1e6, 1e6, allow_nan=False))


@FUZZ
@given(st.lists(st.tuples(texts, texts, numbers, numbers), min_size=1, max_size=12), st.integers(0, 3))
def test_fuzz_trl_valid_tables_round_trip(tmp_path_factory, recs, n_steps):
    out = tmp_path_factory.mktemp("trl")
    store = Store.open(":memory:")
    n = len(recs)
    frames = []
    for step in range(n_steps + 1):
        df = pd.DataFrame({"step": [step] * n, "prompt": [r[0] for r in recs], "completion": [r[1] for r in recs],
                           "r_a": [r[2] for r in recs], "r_b": [r[3] for r in recs],
                           "advantage": np.zeros(n)})
        (out / "completions").mkdir(exist_ok=True)
        df.to_parquet(out / "completions" / f"completions_{step:05d}.parquet")
        frames.append(df)
    try:
        rep = import_run(store, out, "trl")
        assert rep.n_rollouts == n * (n_steps + 1)
        got = store.df("SELECT text FROM rollouts ORDER BY rollout_id")["text"].tolist()
        assert got == [c for df in frames for c in df["completion"]]
        assert set(store.df("SELECT text FROM prompts")["text"]) == {r[0] for r in recs}
    finally:
        store.close()


@FUZZ
@given(st.lists(st.tuples(texts, texts, st.floats(-10, 10), st.booleans()), min_size=1, max_size=10))
def test_fuzz_verl_valid_dumps_round_trip(tmp_path_factory, recs):
    d = tmp_path_factory.mktemp("verl")
    store = Store.open(":memory:")
    verl_dump(d, 5, [r[0] for r in recs], [r[1] for r in recs], ["g"] * len(recs), [r[2] for r in recs],
              {"acc": [r[3] for r in recs]})
    rep = import_run(store, d, "verl")
    assert rep.n_rollouts == len(recs)
    t = store.df("""SELECT ro.text, rw.value FROM rollouts ro JOIN rewards rw USING (rollout_id)
                    WHERE rw.component = 'total' ORDER BY ro.rollout_id""")
    assert t["text"].tolist() == [r[1] for r in recs]
    assert t["value"].tolist() == pytest.approx([r[2] for r in recs])
    assert store.scalar("SELECT sum(value) FROM rewards WHERE component = 'accuracy'") == sum(r[3] for r in recs)
    store.close()


@FUZZ
@given(st.lists(st.tuples(texts, st.lists(texts, max_size=5), st.floats(-1, 1)), min_size=1, max_size=8))
def test_fuzz_openrlhf_token_records_round_trip(tmp_path_factory, recs):
    path = tmp_path_factory.mktemp("orl") / "r.jsonl"
    rows = [{"prompt": p, "response": "".join(toks), "response_tokens": toks, "logprobs": [-0.5] * len(toks),
             "reward": r, "step": 0} for p, toks, r in recs]
    write_jsonl(path, rows)
    store = Store.open(":memory:")
    rep = import_run(store, path, "openrlhf")
    assert (rep.n_rollouts, rep.n_tokens) == (len(recs), sum(len(t) for _, t, _ in recs))
    got = store.df("""SELECT list(token_text ORDER BY pos) AS toks
                      FROM rollouts ro LEFT JOIN tokens t USING (rollout_id)
                      GROUP BY ro.rollout_id ORDER BY ro.rollout_id""")["toks"]
    assert [[x for x in g if x is not None] for g in got] == [t for _, t, _ in recs]
    store.close()


garbage = st.one_of(
    st.binary(max_size=40).map(lambda b: b.replace(b"\n", b" ")),
    st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | texts,
                 lambda c: st.lists(c, max_size=3) | st.dictionaries(texts, c, max_size=3), max_leaves=6)
    .map(lambda v: json.dumps(v).encode()),
    st.sampled_from([b'{"input": null, "output": "x", "score": 1}', b'{"prompt": 5, "response": []}',
                     b'{"input": "a", "output": "b", "score": "NaN"}', b"[" * 5000, b'{"step": 1e400}',
                     b'{"prompt": "p", "response": "r", "response_tokens": ["a"], "logprobs": [1, 2]}',
                     b'{"question": "q", "answer": "a", "toks": "notalist"}', b"\xff\xfe", b"{}"]))


@FUZZ
@given(st.sampled_from(["verl", "openrlhf", "generic", "trl"]),
       st.lists(st.tuples(st.booleans(), garbage), min_size=1, max_size=8), st.sampled_from(["abort", "skip"]))
def test_fuzz_garbage_lines_raise_typed_errors_and_never_leave_partial_rows(tmp_path_factory, fmt, lines, on_error):
    path = tmp_path_factory.mktemp("junk") / "1.jsonl"
    good = {"verl": verl_lines(1)[0].encode(),
            "openrlhf": json.dumps(board_line("p", ["a", "b"], 1.0, 1)).encode(),
            "generic": json.dumps(generic_rows(1)[0]).encode(),
            "trl": json.dumps({"prompt": "p", "completion": "c", "r": 1, "advantage": 0.0}).encode()}[fmt]
    path.write_bytes(b"\n".join(good if ok else junk for ok, junk in lines) + b"\n")
    store = Store.open(":memory:")
    before = fingerprint(store)
    try:
        rep = import_run(store, path, fmt, mapping=GENERIC if fmt == "generic" else None, on_error=on_error)
    except (MalformedInput, ImportFormatError) as exc:
        assert fingerprint(store) == before
        if isinstance(exc, MalformedInput):
            assert on_error == "abort" and all(p.file == str(path) for p in exc.problems)
        return
    finally:
        store.close()
    n_good = sum(ok for ok, _ in lines)
    assert rep.n_rollouts >= n_good  # a junk line may happen to be a valid record
    assert rep.n_rollouts + rep.n_skipped == sum(1 for ok, j in lines if ok or j.strip())


def test_an_unknown_task_is_refused_before_anything_is_written(tmp_path, store, capsys):
    """``--task`` names a registered task or ``import``; a typo is refused with the known ones named,
    the store unchanged and, from the command line, no store created."""
    from studio.tasks import UnknownTaskError

    d = tmp_path / "run"
    d.mkdir()
    write_jsonl(d / "0.jsonl", [{"input": "Q: 1+1=", "output": "1+1=2;A:2", "score": 1.0, "step": 0}])
    before = fingerprint(store)
    with pytest.raises(UnknownTaskError, match="unknown task 'gsm8k'; known tasks: arithmetic, calculator_agent, import"):
        import_run(store, [d], "verl", task="gsm8k")
    assert fingerprint(store) == before
    assert import_run(store, [d], "verl", task="arithmetic").n_rollouts == 1  # a registered task is fine
    db = tmp_path / "new.duckdb"
    assert import_cli.main([str(d), "--db", str(db), "--format", "verl", "--task", "gsm8k"]) == 2
    assert "unknown task 'gsm8k'" in capsys.readouterr().err and not db.exists()
