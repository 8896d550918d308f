"""Moving a store between kinds (``rollout-studio store copy``) and looking after one (``store
create|info|compact``), on real stores: the seeded sample worlds in a file, a sharded file store, shared
stores with a SQLite catalog and with a real PostgreSQL one. A copy is the same rows, counted; a failed
or refused copy changes no store and leaves nothing half-made."""
from __future__ import annotations

import hashlib
import json
import os

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sample_data import SEED_DIRS
from studio.face.cli import run
from studio.ingest.formats import ColumnMapping
from studio.ingest.importers import import_run
from studio.store import Store, StoreError, lake, schema, shards, upkeep
from studio.store import copy as store_copy
from studio.store.copy import copy_store

COPIED = [t for t in schema.TABLES if t not in store_copy.NOT_COPIED]


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    """A file store with every sample world (a fresh copy per test: ``seeded_copy``)."""
    path = tmp_path_factory.mktemp("seeded") / "samples.duckdb"
    Store.open(path, seed_dir=SEED_DIRS).close()
    return path


@pytest.fixture()
def src(seeded, tmp_path):
    path = tmp_path / "src.duckdb"
    path.write_bytes(seeded.read_bytes())
    return path


def rows(store: Store, table: str) -> pd.DataFrame:
    """Every row of ``table``, in one order (for equality)."""
    return store.df(f"SELECT * FROM {table} ORDER BY ALL")


def every_table(path) -> dict[str, pd.DataFrame]:
    store = Store.open(path)
    try:
        return {t: rows(store, t) for t in COPIED if t != "meta"}
    finally:
        store.close()


def tree(folder) -> dict[str, str]:
    """Every file under ``folder`` and a digest of its bytes."""
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            p = os.path.join(root, name)
            out[os.path.relpath(p, folder)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


def test_a_file_store_goes_to_a_shared_store_and_back_unchanged(src, tmp_path):
    before = every_table(src)
    counts = copy_store(src, tmp_path / "shared")
    assert list(counts) == COPIED
    assert counts["rollouts"] == 1728 and counts["tokens"] == len(before["tokens"]) > 70_000
    assert all(counts[t] == len(before[t]) for t in before)

    shared = Store.open(tmp_path / "shared")
    try:
        assert shared.kind == "shared" and shared.counts() == {t: counts[t] for t in ("runs", "prompts", "rollouts",
                                                                                    "tokens")}
        for table, frame in before.items():
            pd.testing.assert_frame_equal(rows(shared, table), frame, check_dtype=False, obj=table)
    finally:
        shared.close()

    back = copy_store(tmp_path / "shared", tmp_path / "back.duckdb")
    assert back == counts
    after = every_table(tmp_path / "back.duckdb")
    for table, frame in before.items():
        pd.testing.assert_frame_equal(after[table], frame, obj=table)
    # shared to shared and file to file too
    assert copy_store(tmp_path / "shared", tmp_path / "shared2") == counts
    assert copy_store(tmp_path / "back.duckdb", tmp_path / "again.duckdb") == counts
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


MAPPING = ColumnMapping(prompt="question", completion="answer", step="it", rewards=("correct",),
                        token_texts="toks", logprobs="lp", entropies="ent")


def training_rows(n: int) -> pa.Table:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        k = int(rng.integers(5, 40))
        out.append({"question": f"q{i // 4}", "answer": f"a{i}", "it": i // 100, "correct": i % 2,
                    "toks": [f"t{(i + j) % 13}" for j in range(k)],
                    "lp": [float(-x) for x in rng.random(k).round(3)], "ent": [float(x) for x in rng.random(k).round(3)]})
    return pa.Table.from_pylist(out)


def test_a_sharded_file_store_copies_its_shard_rows_once(tmp_path, monkeypatch):
    monkeypatch.setattr(shards, "SHARD_MIN_ROWS", 1000)  # the million-row path, with a few thousand rows
    monkeypatch.setattr(store_copy, "BATCH_ROWS", 1000)  # and the copy's batches
    pq.write_table(training_rows(300), tmp_path / "run.parquet")
    store = Store.open(tmp_path / "sharded.duckdb")
    import_run(store, [tmp_path / "run.parquet"], "generic", mapping=MAPPING)
    [shard] = store.shard_paths()
    moved = store.df("SELECT rollout_id FROM rollouts ORDER BY rollout_id LIMIT 3")["rollout_id"].tolist()
    with store.transaction() as cur:  # what enrich does before it changes sharded rows
        assert store.unshard(moved, cur) == 3
    want = rows(store, "tokens")
    assert store.scalar("SELECT count(*) FROM token_rows") > 0 and len(want) > 5000
    store.close()

    seen = []
    counts = copy_store(tmp_path / "sharded.duckdb", tmp_path / "shared",
                        progress=lambda table, done, total: seen.append((table, done, total)))
    assert counts["tokens"] == len(want)
    done = [d for t, d, n in seen if t == "tokens"]
    assert len(done) > 5 and done == sorted(done) and done[-1] == len(want)
    copy_store(tmp_path / "shared", tmp_path / "plain.duckdb")
    for path in (tmp_path / "shared", tmp_path / "plain.duckdb"):
        other = Store.open(path)
        try:
            pd.testing.assert_frame_equal(rows(other, "tokens"), want, check_dtype=False)
            assert other.shard_paths() == [] and other.scalar("SELECT count(*) FROM token_shards") == 0
            assert other.scalar("SELECT count(*) FROM token_rows") == len(want)
        finally:
            other.close()
    assert not (tmp_path / "plain.duckdb.shards").exists() and shard.is_file()


def test_running_runs_keep_their_status_and_the_source_is_only_read(src, tmp_path):
    store = Store.open(src)
    store.write({"runs": pd.DataFrame([{"run_id": "live", "kind": "import", "status": "running"}])})
    store.close()
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    copy_store(src, tmp_path / "shared")
    assert hashlib.sha256(src.read_bytes()).hexdigest() == digest  # opened read-only
    shared = Store.open(tmp_path / "shared")  # its owner (this process) is alive: still running
    try:
        assert shared.scalar("SELECT status FROM runs WHERE run_id = 'live'") == "running"
    finally:
        shared.close()
    copy_store(tmp_path / "shared", tmp_path / "back.duckdb")
    con = duckdb.connect(str(tmp_path / "back.duckdb"), read_only=True)
    assert con.execute("SELECT status FROM runs WHERE run_id = 'live'").fetchall() == [("running",)]
    con.close()


@pytest.mark.parametrize("into", ["new folder", "new file", "empty shared store"])
def test_a_copy_interrupted_midway_leaves_nothing_behind(src, tmp_path, monkeypatch, into):
    monkeypatch.setattr(store_copy, "BATCH_ROWS", 10_000)
    if into == "empty shared store":  # made beforehand, its data on another folder
        lake.create_shared(tmp_path / "dst", data=str(tmp_path / "elsewhere"))
        Store.open(tmp_path / "dst").close()
    dst = tmp_path / ("dst.duckdb" if into == "new file" else "dst")
    before = tree(tmp_path)

    def ctrl_c(table, done, total):
        if table == "tokens" and done >= 30_000:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        copy_store(src, dst, progress=ctrl_c)
    assert tree(tmp_path) == before  # the source unchanged, nothing made (an existing store's files too)
    if into == "empty shared store":
        store = Store.open(dst)
        try:
            assert sum(store.counts().values()) == 0
        finally:
            store.close()
    # and a second try goes through
    assert copy_store(src, dst)["tokens"] > 30_000


def test_a_copy_that_fails_its_check_keeps_nothing(src, tmp_path, monkeypatch):
    # a sum the copy cannot match (as a lost batch would make): refused before the commit
    monkeypatch.setitem(store_copy.CHECKS, "tokens", "count(*) + (random() * 1e9)::BIGINT")
    before = tree(tmp_path)
    with pytest.raises(StoreError, match="the copy of tokens differs from .*nothing was kept"):
        copy_store(src, tmp_path / "dst")
    with pytest.raises(StoreError, match="the copy of tokens differs"):
        copy_store(src, tmp_path / "dst.duckdb")
    assert tree(tmp_path) == before


def test_a_store_that_exists_or_is_missing_is_refused_unchanged(src, tmp_path):
    copy_store(src, tmp_path / "full")  # a shared store with rows
    Store.open(tmp_path / "other.duckdb").close()  # an (empty) file store
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("mine")
    before = tree(tmp_path)
    for dst, why in [(tmp_path / "full", "already holds rows .*rollouts 1,728"),
                     (tmp_path / "other.duckdb", "already exists"),
                     (tmp_path / "notes", "already exists and is not an empty folder"),
                     (src, "are the same store")]:
        with pytest.raises(StoreError, match=why):
            copy_store(src, dst)
    with pytest.raises(StoreError, match="there is no studio store at .*missing.duckdb"):
        copy_store(tmp_path / "missing.duckdb", tmp_path / "x")
    with pytest.raises(StoreError, match="--catalog and --data are for a shared store"):
        copy_store(src, tmp_path / "y.duckdb", data=str(tmp_path / "d"))
    with pytest.raises(StoreError, match=r"postgresql://bob:\*\*\*@db.example/runs: put the password in PGPASSWORD"):
        copy_store(src, tmp_path / "z", catalog="postgresql://bob:hunter2@db.example/runs")
    assert tree(tmp_path) == before


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = run("store", list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_store_commands(src, tmp_path, capsys):
    code, out, err = cli(capsys, "create", "--shared", str(tmp_path / "team"), "--with-samples")
    assert code == 0 and f"made shared store {tmp_path / 'team'} (catalog sqlite" in out, err
    assert "rollouts 1,728" in out
    code, out, _ = cli(capsys, "info", "--db", str(tmp_path / "team"))
    info = dict(line.split("\t") for line in out.splitlines())
    assert code == 0 and info["kind"] == "shared" and info["catalog"] == f"sqlite {tmp_path / 'team' / 'catalog.sqlite'}"
    assert info["data"] == f"{tmp_path / 'team' / 'data'}/" and int(info["snapshot"]) > 0
    assert info["schema"] == str(schema.SCHEMA_VERSION) and info["rows rollouts"] == "1,728"
    assert int(info["data files"].split()[0]) > 0

    code, out, _ = cli(capsys, "copy", str(tmp_path / "team"), str(tmp_path / "mine.duckdb"))
    assert code == 0 and "row counts and sums checked" in out and "rollouts\t1,728" in out
    code, out, _ = cli(capsys, "info", "--db", str(tmp_path / "mine.duckdb"))
    info = dict(line.split("\t") for line in out.splitlines())
    assert info["kind"] == "file" and info["token shards"].startswith("0") and info["rows rollouts"] == "1,728"

    code, _, err = cli(capsys, "copy", str(src), str(tmp_path / "team"))
    assert code == 2 and "already holds rows" in err
    code, _, err = cli(capsys, "create", "--shared", str(tmp_path / "team"))
    assert code == 2 and "already exists and is not an empty folder" in err
    code, _, err = cli(capsys, "create", "--shared", str(tmp_path / "pw"), "--catalog", "postgresql://u:hunter2@h/db")
    assert code == 2 and "hunter2" not in err and not (tmp_path / "pw").exists()
    code, _, err = cli(capsys, "compact", "--db", str(tmp_path / "mine.duckdb"))
    assert code == 2 and "is not a shared store" in err
    code, _, err = cli(capsys, "info", "--db", str(tmp_path / "nowhere"))
    assert code == 2 and "there is no studio store" in err and not (tmp_path / "nowhere").exists()


def test_compact_merges_small_files_and_keeps_every_row(tmp_path, capsys):
    store, _ = store_copy.new_shared(tmp_path / "lake")
    for k in range(8):  # a tailed run's polls: each commit a file of its own (over the inlining limit)
        store.write({"tokens": pa.table({"rollout_id": [f"r{k}"] * 1500, "pos": list(range(1500))}),
                     "runs": pa.table({"run_id": [f"run{k}"], "kind": ["import"]})})
    files = upkeep.inventory(store)["data_files"]
    want = rows(store, "tokens")
    store.close()
    on_disk = len(tree(tmp_path / "lake" / "data"))
    assert files >= 8

    code, out, err = cli(capsys, "compact", "--db", str(tmp_path / "lake"), "--keep-hours", "0")
    assert code == 0, err
    before, after = (int(part.split()[0].replace(",", "")) for part in out.splitlines()[0].split("\t")[1].split("->"))
    assert before == files and after < before
    assert len(tree(tmp_path / "lake" / "data")) < on_disk  # the merged files deleted
    store = Store.open(tmp_path / "lake")
    try:
        pd.testing.assert_frame_equal(rows(store, "tokens"), want)
        assert store.scalar("SELECT count(*) FROM runs") == 8
        assert upkeep.inventory(store)["data_files"] == after
    finally:
        store.close()
    code, _, err = cli(capsys, "compact", "--db", str(tmp_path / "lake"), "--keep-hours", "-1")
    assert code == 2 and "--keep-hours" in err


def test_a_team_store_copy_and_info_never_show_the_password(src, tmp_path, postgres, monkeypatch, capsys):
    db = postgres.new_database("copy_team")
    monkeypatch.setenv("PGPASSWORD", postgres.password)
    counts = copy_store(src, tmp_path / "team", catalog=db.url)
    code, out, err = cli(capsys, "info", "--db", str(tmp_path / "team"))
    assert code == 0 and f"catalog\tpostgres {db.conninfo}" in out and f"rows tokens\t{counts['tokens']:,}" in out
    code, by_url, err = cli(capsys, "info", "--db", db.url)
    assert code == 0 and f"store\t{db.url}" in by_url and f"data\t{tmp_path / 'team' / 'data'}/" in by_url
    assert copy_store(db.url, tmp_path / "back.duckdb") == counts
    # a new folder on a catalog that holds a store already: refused, that store unchanged
    with pytest.raises(StoreError, match=f"the catalog {db.url} already holds rows .*rollouts 1,728"):
        copy_store(src, tmp_path / "second", catalog=db.url)
    code, _, err = cli(capsys, "create", "--shared", str(tmp_path / "third"), "--catalog", db.url)
    assert code == 2 and "already holds rows" in err
    assert not (tmp_path / "second").exists() and not (tmp_path / "third").exists()
    assert copy_store(db.url, tmp_path / "again.duckdb") == counts
    code, compacted, err = cli(capsys, "compact", "--db", db.url)
    assert code == 0 and compacted.startswith("data files\t"), err
    # a password written into the folder's file by hand is used, never shown
    monkeypatch.delenv("PGPASSWORD")
    marker = tmp_path / "team" / lake.MARKER
    spec = json.loads(marker.read_text())
    marker.write_text(json.dumps(spec | {"catalog": f"{spec['catalog']} password={postgres.password}"}))
    code, by_hand, err = cli(capsys, "info", "--db", str(tmp_path / "team"))
    assert code == 0, err
    for text in (out, err, by_url, compacted, by_hand):
        assert postgres.password not in text


def test_a_copy_onto_object_storage_and_back(src, tmp_path, postgres, s3, monkeypatch):
    monkeypatch.setattr(store_copy, "BATCH_ROWS", 10_000)
    for key, value in {**postgres.env, **s3.env}.items():
        monkeypatch.setenv(key, value)
    db = postgres.new_database("copy_s3")

    def objects() -> list[str]:
        listed = s3.client().list_objects_v2(Bucket=s3.bucket, Prefix="copied/")
        return [o["Key"] for o in listed.get("Contents", [])]

    def ctrl_c(table, done, total):
        if table == "tokens" and done >= 30_000:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        copy_store(src, tmp_path / "team", catalog=db.url, data=s3.data_path("copied"), progress=ctrl_c)
    assert not (tmp_path / "team").exists() and objects() == []
    counts = copy_store(src, tmp_path / "team", catalog=db.url, data=s3.data_path("copied"))
    assert objects() and all(k.endswith(".parquet") for k in objects())
    assert copy_store(tmp_path / "team", tmp_path / "back.duckdb") == counts
    before, after = every_table(src), every_table(tmp_path / "back.duckdb")
    for table, frame in before.items():
        pd.testing.assert_frame_equal(after[table], frame, obj=table)
