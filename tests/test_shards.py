"""Token shards: a bulk import's token rows go to one Parquet file beside the store, read through
the ``tokens`` view as if they were in the table; failed imports leave no file behind; enrich
changes sharded rows; the store and its shard folder move together."""
from __future__ import annotations

import json
import os
import shutil
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sample_data import POLICY_DIR, ROLLOUTS_DIR
from studio import queries
from studio.ingest.errors import MalformedInput
from studio.ingest.formats import ColumnMapping
from studio.ingest.importers import import_run
from studio.queries import credit
from studio.runs import enrich
from studio.store import STRAY_SHARD_AGE_S, Store, StoreError, shards

MAPPING = ColumnMapping(prompt="question", completion="answer", step="it", rewards=("correct",),
                        token_texts="toks", logprobs="lp", entropies="ent")


def rows(n: int, start: int = 0) -> list[dict]:
    rng = np.random.default_rng(start)
    out = []
    for i in range(start, start + n):
        k = int(rng.integers(1, 40))
        out.append({"question": f"q{i // 4}", "answer": f"a{i}", "it": i // 100, "correct": i % 2,
                    "toks": [f"t{(i + j) % 13}" for j in range(k)],
                    "lp": [float(-x) for x in rng.random(k).round(3)], "ent": [float(x) for x in rng.random(k).round(3)]})
    return out


def write_parquet(path, data):
    pq.write_table(pa.Table.from_pylist(data), path)
    return path


def all_tokens(store):
    return store.df("""SELECT ro.text, t.pos, t.token_text, t.logprob, t.entropy, t.token_id FROM tokens t
                       JOIN rollouts ro USING (rollout_id) ORDER BY ro.text, t.pos""")


@pytest.fixture()
def sharding(monkeypatch):
    """Imports of 1,000+ token rows write a shard (the default is a million: the same code path)."""
    monkeypatch.setattr(shards, "SHARD_MIN_ROWS", 1000)


def test_a_large_import_writes_one_shard_that_reads_like_the_table(tmp_path, monkeypatch):
    src = [write_parquet(tmp_path / f"part{i}.parquet", rows(150, 150 * i)) for i in range(3)]
    table_store = Store.open(tmp_path / "table.duckdb")
    import_run(table_store, src, "generic", mapping=MAPPING)  # 3 files x ~3,000 tokens: under a million
    assert table_store.shard_paths() == [] and table_store.scalar("SELECT count(*) FROM token_shards") == 0

    monkeypatch.setattr(shards, "SHARD_MIN_ROWS", 1000)
    store = Store.open(tmp_path / "sharded.duckdb")
    rep = import_run(store, src, "generic", mapping=MAPPING)
    [path] = store.shard_paths()
    assert path.parent == tmp_path / "sharded.duckdb.shards" and path.is_file()
    listed = store.df("SELECT * FROM token_shards").iloc[0]
    assert listed["n_rows"] == rep.n_tokens == pq.ParquetFile(path).metadata.num_rows
    assert listed["run_id"] == rep.run_id
    assert store.scalar("SELECT count(*) FROM token_rows") == 0  # every token row is in the shard
    # the same rows, columns and types through the view
    assert all_tokens(store).equals(all_tokens(table_store))
    ids = store.df("SELECT rollout_id FROM rollouts ORDER BY rollout_id")["rollout_id"]
    assert (listed["min_rollout_id"], listed["max_rollout_id"]) == (ids.iloc[0], ids.iloc[-1])
    rid = ids.iloc[200]
    text = store.scalar("SELECT text FROM rollouts WHERE rollout_id = ?", [rid])
    other = table_store.scalar("SELECT rollout_id FROM rollouts WHERE text = ?", [text])
    assert queries.tokens(store, rid).equals(queries.tokens(table_store, other))
    # the group view's read: every rollout's tokens
    group = queries.tokens_of(store, ids.iloc[:8].tolist())
    assert sum(len(t) for t in group.values()) == store.scalar(
        "SELECT sum(n_tokens) FROM rollouts WHERE rollout_id <= ?", [ids.iloc[7]])
    # reopening reads it again
    store.close()
    store = Store.open(tmp_path / "sharded.duckdb")
    assert store.counts()["tokens"] == rep.n_tokens
    store.close()
    table_store.close()


def test_each_row_group_of_a_shard_bounds_its_rollout_ids(tmp_path, sharding, monkeypatch):
    """Point reads skip row groups by their rollout_id statistics: each row group's must hold its
    ids, and the groups follow each other in id order."""
    monkeypatch.setattr(shards, "ROW_GROUP", 1000)
    store = Store.open(tmp_path / "s.duckdb")
    src = [write_parquet(tmp_path / f"p{i}.parquet", rows(150, 150 * i)) for i in range(2)]
    rep = import_run(store, src, "generic", mapping=MAPPING)
    [path] = store.shard_paths()
    pf = pq.ParquetFile(path)
    assert pf.metadata.num_row_groups >= rep.n_tokens // 1000
    col = pf.schema_arrow.get_field_index("rollout_id")
    last = ""
    for g in range(pf.metadata.num_row_groups):
        stats = pf.metadata.row_group(g).column(col).statistics
        ids = pf.read_row_group(g, columns=["rollout_id"]).column(0).cast(pa.string()).to_pylist()
        assert stats.has_min_max and stats.min <= min(ids) and max(ids) <= stats.max
        assert stats.min >= last
        last = max(ids)
    assert pq.read_table(path).num_rows == rep.n_tokens
    store.close()


def test_a_second_import_adds_a_second_shard_and_small_ones_go_to_the_table(tmp_path, sharding):
    store = Store.open(tmp_path / "s.duckdb")
    import_run(store, write_parquet(tmp_path / "a.parquet", rows(200)), "generic", mapping=MAPPING)
    import_run(store, write_parquet(tmp_path / "b.parquet", rows(200, 200)), "generic", mapping=MAPPING)
    import_run(store, write_parquet(tmp_path / "c.parquet", rows(3, 400)), "generic", mapping=MAPPING)
    assert len(store.shard_paths()) == 2
    small = store.scalar("SELECT count(*) FROM token_rows")
    assert 0 < small == store.scalar(
        "SELECT sum(n_tokens) FROM rollouts WHERE text IN ('a400', 'a401', 'a402')")
    assert store.counts()["tokens"] == store.scalar("SELECT sum(n_tokens) FROM rollouts")
    # a point read opens only the shard holding the rollout, and reads what the whole view holds
    ids = store.df("SELECT rollout_id FROM rollouts ORDER BY rollout_id")["rollout_id"].tolist()
    first, second = store.shard_paths()
    assert first.name in store.tokens_between(ids[0], ids[0]) and second.name not in store.tokens_between(ids[0], ids[0])
    assert second.name in store.tokens_between(ids[250], ids[250])
    assert store.tokens_between(ids[-1], ids[-1]) == "token_rows"  # the small import's: in no shard's range
    for rid in [ids[0], ids[150], ids[250], ids[399], ids[-1]]:
        want = store.df(f"SELECT {queries.TOKEN_COLUMNS} FROM tokens WHERE rollout_id = ? ORDER BY pos", [rid])
        assert len(want) > 0 and queries.tokens(store, rid).equals(want)
        # the steps read the rollout's tokens themselves when not given them: the same rows
        assert credit.steps_of(store, rid).equals(credit.steps_of(store, rid, tokens=queries.tokens(store, rid)))
    across = queries.tokens_of(store, ids[195:205] + ids[-2:])  # both shards and the table
    assert sum(map(len, across.values())) == store.scalar(
        "SELECT sum(n_tokens) FROM rollouts WHERE list_contains(?, rollout_id)", [ids[195:205] + ids[-2:]])
    store.close()


def test_an_aborted_import_leaves_no_shard_behind(tmp_path, sharding):
    store = Store.open(tmp_path / "s.duckdb")
    good = write_parquet(tmp_path / "a.parquet", rows(300))
    bad = tmp_path / "b.jsonl"
    bad.write_text("\n".join([json.dumps(r) for r in rows(5, 300)] + ["{not json"]) + "\n")
    with pytest.raises(MalformedInput, match="b.jsonl"):
        import_run(store, [good, bad], "generic", mapping=MAPPING)
    assert store.counts() == {"runs": 0, "prompts": 0, "rollouts": 0, "tokens": 0}
    assert store.scalar("SELECT count(*) FROM token_shards") == 0
    assert not any((tmp_path / "s.duckdb.shards").glob("*"))
    # the same import with skip keeps the good rows, in a shard
    rep = import_run(store, [good, bad], "generic", mapping=MAPPING, on_error="skip")
    assert rep.n_rollouts == 305 and len(store.shard_paths()) == 1
    assert store.counts()["tokens"] == rep.n_tokens
    store.close()


def test_a_cancelled_import_leaves_no_shard_behind(tmp_path, sharding):
    store = Store.open(tmp_path / "s.duckdb")
    src = [write_parquet(tmp_path / f"p{i}.parquet", rows(200, 200 * i)) for i in range(3)]
    cancel = threading.Event()
    rep = import_run(store, src, "generic", mapping=MAPPING, cancel=cancel,
                     progress=lambda done, total: cancel.set() if done else None)
    assert rep.status == "cancelled"
    assert store.counts()["rollouts"] == 0 and store.scalar("SELECT count(*) FROM token_shards") == 0
    assert not any((tmp_path / "s.duckdb.shards").glob("*"))
    store.close()


def test_a_file_no_shard_lists_is_removed_and_a_missing_shard_is_named(tmp_path, sharding):
    path = tmp_path / "s.duckdb"
    store = Store.open(path)
    import_run(store, write_parquet(tmp_path / "a.parquet", rows(300)), "generic", mapping=MAPPING)
    [shard] = store.shard_paths()
    store.close()
    stray = shard.with_name("shard_cut_off_before_its_commit.parquet")  # an import killed before COMMIT
    stray.write_bytes(b"PAR1")
    store = Store.open(path)  # just written: it may be another open's import in progress, so it stays
    assert stray.exists()
    store.close()
    old = time.time() - STRAY_SHARD_AGE_S - 60
    os.utime(stray, (old, old))  # untouched since: cut off
    store = Store.open(path)
    assert not stray.exists() and shard.exists()
    n = store.counts()["tokens"]
    store.close()
    shard.rename(tmp_path / "elsewhere.parquet")
    with pytest.raises(StoreError, match=r"s\.duckdb\.shards.*missing.*together with the store file"):
        Store.open(path)
    (tmp_path / "elsewhere.parquet").rename(shard)
    store = Store.open(path)  # nothing was changed by the refusal
    assert store.counts()["tokens"] == n
    store.close()


def test_opening_the_store_again_during_a_sharded_import_leaves_the_import_alone(tmp_path, sharding):
    """A notebook may open the store the served app has open (DuckDB shares the file within a
    process): that open must neither delete the shard being written nor break the import's commit."""
    path = tmp_path / "s.duckdb"
    store = Store.open(path)
    import_run(store, write_parquet(tmp_path / "a.parquet", rows(300)), "generic", mapping=MAPPING)  # a shard
    src = [write_parquet(tmp_path / f"p{i}.parquet", rows(200, 1000 + 200 * i)) for i in range(3)]
    seen = []

    def open_again(done, total):
        if 0 < done < total and not seen:
            # the sink creates its file on its writer thread: give it the time a loaded machine needs
            deadline = time.time() + 30
            while not (writing := [f for f in (tmp_path / "s.duckdb.shards").iterdir()
                                   if f not in store.shard_paths()]) and time.time() < deadline:
                time.sleep(0.05)
            other = Store.open(path)
            seen.append((writing, [f.exists() for f in writing], other.counts()["rollouts"]))
            other.close()

    rep = import_run(store, src, "generic", mapping=MAPPING, progress=open_again)
    [(writing, exists, n_before)] = seen
    assert len(writing) == 1 and exists == [True] and n_before == 300  # the other open saw the committed store
    assert rep.status == "done" and store.shard_paths()[-1] == writing[0]
    assert store.counts()["tokens"] == store.scalar("SELECT sum(n_tokens) FROM rollouts")
    store.close()


def test_a_store_moved_with_its_shard_folder_reads_from_the_new_place(tmp_path, sharding):
    old = tmp_path / "old" / "s.duckdb"
    old.parent.mkdir()
    store = Store.open(old)
    import_run(store, write_parquet(tmp_path / "a.parquet", rows(300)), "generic", mapping=MAPPING)
    want = all_tokens(store)
    store.close()
    new = tmp_path / "new" / "s.duckdb"
    shutil.move(old.parent, new.parent)
    store = Store.open(new)
    assert store.shard_paths()[0].parent == new.parent / "s.duckdb.shards"
    assert all_tokens(store).equals(want)
    store.close()


def test_enrich_fills_sharded_rollouts_with_the_samplers_numbers(tmp_path, sharding):
    """Sampled rollouts exported as a run would log them (token texts only), imported into a shard,
    then enriched with the policy that sampled them: the ids and log-probs come back."""
    seed = Store.open(tmp_path / "seed.duckdb", seed_dir=ROLLOUTS_DIR)
    got = seed.df("""SELECT p.text AS question, ro.text AS answer, ro.rollout_id FROM rollouts ro
                     JOIN prompts p USING (prompt_id) WHERE ro.n_tokens > 0 ORDER BY ro.rollout_id LIMIT 60""")
    sampled = {r: queries.tokens(seed, r) for r in got["rollout_id"]}
    data = [{"question": q, "answer": a, "toks": sampled[r]["token_text"].tolist()}
            for q, a, r in got.itertuples(index=False)]
    assert sum(len(d["toks"]) for d in data) > 1000  # enough for a shard
    store = Store.open(tmp_path / "s.duckdb")
    rep = import_run(store, write_parquet(tmp_path / "run.parquet", data), "generic",
                     mapping=ColumnMapping(prompt="question", completion="answer", token_texts="toks"))
    assert len(store.shard_paths()) == 1 and store.scalar("SELECT count(*) FROM token_rows") == 0
    ids = store.df("SELECT rollout_id, text FROM rollouts ORDER BY rollout_id")
    first = ids["rollout_id"].iloc[:4].tolist()
    report = enrich.enrich_sync(store, POLICY_DIR, rollout_ids=first)
    assert report.n_rollouts == 4 and not report.skipped
    # the enriched rollouts' rows moved into the table; the shard's copies are no longer read
    assert store.scalar("SELECT count(*) FROM tokens_moved") == 4
    assert store.counts()["tokens"] == rep.n_tokens
    by_text = dict(zip(got["answer"], got["rollout_id"]))
    for rid, text in ids.iloc[:5].itertuples(index=False):
        tok, want = queries.tokens(store, rid), sampled[by_text[text]]
        assert tok["token_text"].tolist() == want["token_text"].tolist()
        if rid in first:
            assert tok["token_id"].tolist() == want["token_id"].tolist()
            np.testing.assert_allclose(tok["logprob"], want["logprob"], atol=2e-4)
        else:  # not enriched: still read from the shard, as imported
            assert tok["token_id"].isna().all()
    # a second pass over the same rollouts writes nothing; the rest still enrich
    assert enrich.enrich_sync(store, POLICY_DIR, rollout_ids=first).n_rollouts == 0
    store.close()
    store = Store.open(tmp_path / "s.duckdb")
    assert store.counts()["tokens"] == rep.n_tokens
    store.close()
    seed.close()
