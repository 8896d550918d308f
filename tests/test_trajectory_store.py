"""Agent trajectories in the store: turns, the loss mask and per-turn counts, and a schema-8 store migrated."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from backends import Generation, Turn
from studio.queries.turns import turns_of
from studio.store import Store, schema
from studio.store.records import RecordError, generation_rows
from studio.tasks import Prompt, get_task

DATA = Path(__file__).parent / "data"


def _trajectory() -> Generation:
    # turn 0: the policy calls a tool (3 tokens); turn 1: the tool's response (2 tokens, masked); turn 2: the answer
    T = 7
    mask = np.array([1, 1, 1, 0, 0, 1, 1], dtype=bool)
    lp = np.where(mask, -0.5, np.nan).astype(np.float32)
    return Generation(
        prompt_index=0, sample_idx=0, prompt="2+2=", text="<call>4<resp>ok4", token_ids=np.arange(T),
        token_texts=["<call>", "4", "</call>", "<resp>", "ok", "4", "!"], logprobs=lp, entropies=lp * -1,
        topk_ids=np.where(mask[:, None], 1, -1).repeat(2, 1), topk_logprobs=np.where(mask[:, None], -1.0, np.nan).repeat(2, 1),
        finish_reason="stop", loss_mask=mask,
        turns=[Turn("assistant", 0, 3, "<call>4</call>", tool_name="calc", tool_args='{"x": 4}'),
               Turn("tool", 3, 5, "<resp>ok", tool_name="calc", error="boom"),
               Turn("assistant", 5, 7, "4!")])


def test_a_trajectory_s_tool_tokens_are_stored_masked_without_statistics():
    task = get_task("arithmetic")
    rows = generation_rows("run", task, [Prompt("2+2=", {"answer": 4})], [_trajectory()])
    tok = rows.tokens.to_pandas()
    assert tok["trained"].tolist() == [True, True, True, False, False, True, True]
    assert tok["turn_idx"].tolist() == [0, 0, 0, 1, 1, 2, 2]
    assert tok.loc[~tok["trained"], "logprob"].isna().all() and tok.loc[tok["trained"], "logprob"].notna().all()
    assert tok.loc[~tok["trained"], "topk_ids"].isna().all()
    r = rows.rollouts.iloc[0]
    assert (r["n_turns"], r["n_tool_calls"], r["n_tool_errors"]) == (3, 1, 1)
    assert rows.turns["role"].tolist() == ["assistant", "tool", "assistant"]
    assert rows.turns["error"].tolist()[1] == "boom" and rows.turns["tool_args"].tolist()[0] == '{"x": 4}'


def test_a_single_answer_is_one_assistant_turn_with_every_token_trained():
    store = Store.open()
    task = get_task("arithmetic")
    g = _trajectory()
    g.turns, g.loss_mask = None, None
    g.logprobs, g.entropies = np.full(7, -0.5, np.float32), np.full(7, 0.5, np.float32)
    g.topk_ids, g.topk_logprobs = np.ones((7, 2), np.int64), -np.ones((7, 2), np.float32)
    rows = generation_rows("run", task, [Prompt("2+2=", {"answer": 4})], [g])
    assert rows.turns.empty and rows.tokens.column("trained").to_pylist() == [True] * 7
    store.write(rows.frames())
    t = turns_of(store, rows.rollouts["rollout_id"].tolist())
    assert t[["turn_idx", "role", "start_pos", "end_pos"]].values.tolist() == [[0, "assistant", 0, 7]]


def test_turns_out_of_order_or_a_mask_of_another_length_are_refused():
    task = get_task("arithmetic")
    g = _trajectory()
    g.turns = [Turn("assistant", 0, 3), Turn("tool", 2, 5), Turn("assistant", 5, 7)]
    with pytest.raises(RecordError, match="turn 1 \\(tool\\) spans tokens 2..5, out of order"):
        generation_rows("run", task, [Prompt("2+2=", {"answer": 4})], [g])
    g = _trajectory()
    g.loss_mask = g.loss_mask[:5]
    with pytest.raises(RecordError, match="a loss mask of 5 entries for 7 tokens"):
        generation_rows("run", task, [Prompt("2+2=", {"answer": 4})], [g])
    g = _trajectory()
    g.turns[1].role = "environment"
    with pytest.raises(RecordError, match="turn 1 has role 'environment'"):
        generation_rows("run", task, [Prompt("2+2=", {"answer": 4})], [g])


def test_a_schema_8_store_migrates_without_loss(tmp_path):
    """``tests/data/store_schema8.duckdb`` was written by the studio at schema 8 (commit a1b0a01)."""
    path = tmp_path / "old.duckdb"
    shutil.copy(DATA / "store_schema8.duckdb", path)
    import duckdb

    con = duckdb.connect(str(path))
    before = {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("rollouts", "token_rows", "rewards")}
    sums = con.execute("SELECT sum(logprob), sum(entropy), count(DISTINCT rollout_id) FROM token_rows").fetchone()
    con.close()
    assert before["rollouts"] > 0 and before["token_rows"] > 0
    s = Store.open(path)
    assert s.scalar("SELECT value FROM meta WHERE key='schema_version'") == str(schema.SCHEMA_VERSION) == "11"
    after = {t: s.scalar(f"SELECT count(*) FROM {t}") for t in ("rollouts", "tokens", "rewards")}
    assert after == {"rollouts": before["rollouts"], "tokens": before["token_rows"], "rewards": before["rewards"]}
    assert s.df("SELECT sum(logprob) a, sum(entropy) b, count(DISTINCT rollout_id) c FROM tokens").iloc[0].tolist() \
        == pytest.approx(list(sums))
    # every old rollout reads as one assistant turn, every token trained, no tool calls
    assert s.scalar("SELECT count(*) FROM rollouts WHERE n_turns = 1 AND n_tool_calls = 0 AND n_tool_errors = 0") \
        == before["rollouts"]
    assert s.scalar("SELECT count(*) FROM tokens WHERE coalesce(trained, true) AND coalesce(turn_idx, 0) = 0") \
        == before["token_rows"]
    rid = s.scalar("SELECT rollout_id FROM rollouts ORDER BY rollout_id LIMIT 1")
    n = s.scalar("SELECT n_tokens FROM rollouts WHERE rollout_id = ?", [rid])
    assert turns_of(s, rid)[["role", "start_pos", "end_pos"]].values.tolist() == [["assistant", 0, n]]
    s.close()


def test_a_schema_9_store_gains_the_mismatch_columns_without_loss(tmp_path):
    """``tests/data/store_schema9.duckdb`` was written by the studio at schema 9 (commit 1014a8a): agent
    trajectories with turns and a loss mask. Schema 10 adds the recomputed log-prob and who made each side."""
    path = tmp_path / "old9.duckdb"
    shutil.copy(DATA / "store_schema9.duckdb", path)
    import duckdb

    con = duckdb.connect(str(path))
    sums = con.execute("SELECT count(*), sum(logprob), count(trained) FILTER (NOT trained) FROM token_rows").fetchone()
    n_turns = con.execute("SELECT count(*) FROM turns").fetchone()[0]
    con.close()
    s = Store.open(path)
    assert s.scalar("SELECT value FROM meta WHERE key='schema_version'") == str(schema.SCHEMA_VERSION) == "11"
    got = s.df("SELECT count(*) n, sum(logprob) lp, count(trained) FILTER (NOT trained) masked, "
               "count(train_logprob) tl, count(train_rank) tr FROM tokens").iloc[0]
    assert [got.n, got.lp, got.masked] == pytest.approx(list(sums)) and sums[2] > 0
    assert got.tl == 0 and got.tr == 0  # nothing was recomputed before schema 10
    assert s.scalar("SELECT count(*) FROM turns") == n_turns > 0
    assert s.scalar("SELECT count(engine) + count(train_engine) + count(train_policy_version) FROM rollouts") == 0
    assert s.df("SELECT engine, rank FROM token_scores").columns.tolist() == ["engine", "rank"]
    s.close()
