"""A shared store's reads through its process's mirror (``studio.store.mirror``): every commit of
another OS process is seen by the next read (rows inserted, updated, deleted, a column added), a
process sees its own writes at once, the per-token tables are read in the lake, and the mirror's
local file goes when the store closes."""
import json
import os
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest

from sample_data import SEED_DIRS
from studio.store import Store, lake, mirror
from tests.test_shared_store import run_py


@pytest.fixture
def shared(tmp_path):
    folder = lake.create_shared(tmp_path / "team-store")
    Store.open(folder, seed_dir=SEED_DIRS).close()
    return folder


@pytest.fixture
def both(shared):
    """The shared store opened twice in this process: read through a mirror, and read in the lake."""
    store, plain = Store.open(shared), Store.open(shared, mirror=False)
    yield store, plain
    store.close()
    plain.close()


def commit_elsewhere(shared, *statements: str | tuple[str, list]) -> None:
    """Run ``statements`` (SQL, or SQL and its parameters) in one transaction of another OS process."""
    listed = [[st, []] if isinstance(st, str) else list(st) for st in statements]
    run_py("""
        import json, sys
        from studio.store import Store
        s = Store.open(sys.argv[1], mirror=False)
        with s.transaction() as cur:
            for sql, params in json.loads(sys.argv[2]):
                cur.execute(sql, params)
        s.close()
    """, str(shared), json.dumps(listed))


def mirror_file(store: Store) -> str | None:
    rows = store.df("SELECT path FROM duckdb_databases() WHERE database_name = 'mirror'")
    return rows["path"].iloc[0] if len(rows) else None


def test_every_commit_of_another_process_reaches_the_next_read(shared):
    reader = Store.open(shared)
    try:
        rollouts = reader.scalar("SELECT count(*) FROM rollouts")
        assert mirror_file(reader)  # the first read made the mirror
        run_id = reader.scalar("SELECT min(run_id) FROM runs")
        group = reader.df("SELECT group_id, count(*) AS n FROM rollouts GROUP BY 1 ORDER BY 1 LIMIT 1").iloc[0]
        runs = reader.scalar("SELECT count(*) FROM runs")
        run_py("""
            import sys
            import pandas as pd
            from studio.store import Store
            s = Store.open(sys.argv[1], mirror=False)
            s.write({"runs": pd.DataFrame({"run_id": ["run_beside"], "kind": ["sample"], "name": ["beside"]})})
            with s.transaction() as cur:
                cur.execute("UPDATE runs SET status = 'failed' WHERE run_id = ?", [sys.argv[2]])
                cur.execute("DELETE FROM rollouts WHERE group_id = ?", [sys.argv[3]])
            s.close()
        """, str(shared), run_id, group["group_id"])
        assert reader.scalar("SELECT count(*) FROM runs") == runs + 1
        assert reader.scalar("SELECT name FROM runs WHERE run_id = 'run_beside'") == "beside"
        assert reader.scalar("SELECT status FROM runs WHERE run_id = ?", [run_id]) == "failed"
        assert reader.scalar("SELECT count(*) FROM rollouts") == rollouts - group["n"]

        # a schema change (as a newer studio's migration makes): the next read has the new column
        commit_elsewhere(shared, "ALTER TABLE prompts ADD COLUMN reviewed_by VARCHAR",
                         "UPDATE prompts SET reviewed_by = 'ana'")
        assert set(reader.df("SELECT DISTINCT reviewed_by FROM prompts")["reviewed_by"]) == {"ana"}
        assert reader.scalar("SELECT count(*) FROM rollouts") == rollouts - group["n"]
    finally:
        reader.close()


def test_a_process_reads_its_own_writes_at_once_and_the_mirror_goes_on_close(shared):
    store = Store.open(shared)
    runs = store.scalar("SELECT count(*) FROM runs")
    path = Path(mirror_file(store))
    assert path.exists() and path.parent != Path(shared)  # a local file of this process, not in the store
    store.write({"runs": pd.DataFrame({"run_id": ["run_mine"], "kind": ["sample"], "name": ["mine"]})})
    assert store.scalar("SELECT count(*) FROM runs") == runs + 1
    with store.transaction() as cur:
        cur.execute("UPDATE runs SET status = 'done' WHERE run_id = 'run_mine'")
    assert store.scalar("SELECT status FROM runs WHERE run_id = 'run_mine'") == "done"
    store.close()
    assert not path.parent.exists()


def test_token_rows_are_read_in_the_lake_and_a_command_can_skip_the_mirror(both):
    store, plain = both
    rid = store.scalar("SELECT min(rollout_id) FROM rollouts")
    q = "SELECT count(*), sum(logprob) FROM tokens WHERE rollout_id = ?"
    assert store.df(q, [rid]).equals(plain.df(q, [rid])) and store.scalar(q, [rid]) > 0
    assert mirror_file(store) and mirror_file(plain) is None
    views = store.df("SELECT view_name FROM duckdb_views() WHERE database_name = 'mirror' AND NOT internal")
    assert {"token_rows", "token_scores", "tokens"} <= set(views["view_name"])  # the lake's, read there
    # a row inserted into the lake's token rows is there for the next read of the mirrored store
    plain.write({"tokens": pd.DataFrame({"rollout_id": [rid], "pos": [10_000], "token_id": [1],
                                         "token_text": ["x"], "logprob": [-0.5], "entropy": [0.1]})})
    assert store.scalar("SELECT count(*) FROM tokens WHERE rollout_id = ? AND pos = 10000", [rid]) == 1


def test_the_mirror_of_a_killed_process_is_removed_by_the_next_one(shared):
    out = run_py("""
        import os, sys
        from studio.store import Store
        s = Store.open(sys.argv[1])
        s.scalar("SELECT count(*) FROM rollouts")
        print(s.scalar("SELECT path FROM duckdb_databases() WHERE database_name = 'mirror'"), flush=True)
        os.kill(os.getpid(), 9)  # killed: no close
    """, str(shared), check=False)
    left = Path(out.stdout.strip()).parent
    assert out.returncode == -9 and left.is_dir()
    store = Store.open(shared)
    try:
        store.scalar("SELECT count(*) FROM runs")
        assert not left.exists()
    finally:
        store.close()


def test_token_rows_are_read_from_their_data_files_while_those_are_the_whole_table(shared, both):
    store, plain = both
    rid = store.scalar("SELECT min(rollout_id) FROM rollouts")
    src = store.tokens_between(rid, rid)
    assert "read_parquet" in src  # the files that can hold it, read without the lake's planning
    direct = store.df(f"SELECT * FROM {src} WHERE rollout_id = ? ORDER BY pos", [rid])
    pd.testing.assert_frame_equal(direct, plain.df("SELECT * FROM tokens WHERE rollout_id = ? ORDER BY pos", [rid]))
    assert len(direct) > 0

    # another process changes a token row (DuckLake writes a delete file): the lake reads them again
    commit_elsewhere(shared, ("UPDATE token_rows SET logprob = -9 WHERE rollout_id = ? AND pos = 0", [rid]))
    assert store.tokens_between(rid, rid) == "tokens"
    assert store.scalar("SELECT logprob FROM tokens WHERE rollout_id = ? AND pos = 0", [rid]) == -9
    assert queries_tokens(store, rid)["logprob"].iloc[0] == -9


def test_token_files_written_before_a_column_was_added_are_read_in_the_lake(shared, both):
    """A column added to the token rows after their files were written (a migration): the files lack
    it, and the lake gives its default; read by name they would not."""
    store, plain = both
    rid = store.scalar("SELECT min(rollout_id) FROM rollouts")
    assert "read_parquet" in store.tokens_between(rid, rid)
    commit_elsewhere(shared, "ALTER TABLE token_rows DROP COLUMN train_rank",
                     "ALTER TABLE token_rows ADD COLUMN train_rank INTEGER DEFAULT 3")
    assert store.tokens_between(rid, rid) == "tokens"
    q = "SELECT DISTINCT train_rank FROM tokens WHERE rollout_id = ?"
    assert list(store.df(q, [rid])["train_rank"]) == [3] == list(plain.df(q, [rid])["train_rank"])


def queries_tokens(store: Store, rid: str) -> pd.DataFrame:
    from studio import queries

    return queries.tokens(store, rid)


def test_a_compaction_by_another_process_changes_no_row_read(shared, both):
    store, plain = both
    rid = store.scalar("SELECT max(rollout_id) FROM rollouts")
    q = "SELECT count(*), sum(logprob) FROM tokens WHERE rollout_id = ?"
    before = store.df(q, [rid]), store.scalar("SELECT count(*) FROM rewards")
    run_py("""
        import sys
        from studio.store import Store
        from studio.store.upkeep import compact
        s = Store.open(sys.argv[1], mirror=False)
        compact(s)
        s.close()
    """, str(shared))
    assert store.df(q, [rid]).equals(before[0]) and store.df(q, [rid]).equals(plain.df(q, [rid]))
    assert store.scalar("SELECT count(*) FROM rewards") == before[1]
    assert "read_parquet" in store.tokens_between(rid, rid)  # the merged files, listed again


@pytest.mark.parametrize("listed", [mirror.LISTED, 0], ids=["ids-named", "ids-in-a-subquery"])
def test_rows_updated_or_deleted_elsewhere_are_replaced_in_the_mirror_as_in_the_lake(shared, both, monkeypatch, listed):
    """A few rollouts changed in a big table: their rows are replaced (the rest of the copy kept); a
    row inserted and deleted between two reads, an update of most rows, a keyless table: after
    each, every mirrored table reads as the lake does (the changed ids named in the query, and, as
    where there are more than ``LISTED`` of them, read by a subquery)."""
    monkeypatch.setattr(mirror, "LISTED", listed)
    store, plain = both
    ids = list(store.df("SELECT rollout_id FROM rollouts ORDER BY rollout_id")["rollout_id"])
    assert len(ids) >= 20
    run_py("""
        import sys
        import pandas as pd
        from studio.store import Store
        s = Store.open(sys.argv[1], mirror=False)
        first, second = sys.argv[2], sys.argv[3]
        with s.transaction() as cur:
            cur.execute("UPDATE rollouts SET correct = NOT coalesce(correct, false) WHERE rollout_id = ?", [first])
            cur.execute("DELETE FROM rewards WHERE rollout_id = ?", [second])
            cur.execute("UPDATE rewards SET value = value + 1 WHERE rollout_id = ?", [first])
        s.write({"runs": pd.DataFrame({"run_id": ["run_brief"], "kind": ["sample"], "name": ["brief"]})})
        with s.transaction() as cur:
            cur.execute("DELETE FROM runs WHERE run_id = 'run_brief'")
        s.close()
    """, str(shared), ids[0], ids[1])
    assert_mirror_reads_as_the_lake(store, plain)
    assert store.scalar("SELECT count(*) FROM rewards WHERE rollout_id = ?", [ids[1]]) == 0
    assert store.scalar("SELECT count(*) FROM runs WHERE run_id = 'run_brief'") == 0
    commit_elsewhere(shared, "UPDATE rollouts SET answer = 'x' || coalesce(answer, '')",  # every row: copied again
                     "UPDATE metrics SET value = value * 2")
    assert_mirror_reads_as_the_lake(store, plain)
    assert store.scalar("SELECT count(*) FROM rollouts WHERE NOT starts_with(answer, 'x')") == 0


def assert_mirror_reads_as_the_lake(store: Store, plain: Store) -> None:
    for table in ("rollouts", "rewards", "runs", "prompts", "metrics", "pairs", "rule_versions"):
        q = f"SELECT * FROM {table} ORDER BY ALL"
        pd.testing.assert_frame_equal(store.df(q), plain.df(q), obj=table)


def test_token_rows_an_older_store_kept_in_its_catalog_go_to_a_data_file_when_it_is_opened(shared):
    plain = Store.open(shared, mirror=False)
    rid = plain.scalar("SELECT min(rollout_id) FROM rollouts")
    with plain.transaction() as cur:  # as stores made before the option was: small writes kept in the catalog
        cur.execute(f"CALL {lake.LAKE}.set_option('data_inlining_row_limit', 1000, table_name => 'token_rows')")
    plain.write({"tokens": pd.DataFrame({"rollout_id": [rid] * 3, "pos": [10_000, 10_001, 10_002], "token_id": [1] * 3,
                                         "token_text": ["a", "b", "c"], "logprob": [-0.5] * 3, "entropy": [0.1] * 3})})
    assert lake.token_inlining(plain.cursor()) == "1000"
    plain.close()
    store = Store.open(shared)
    try:
        assert lake.token_inlining(store.cursor()) == "0"
        assert "read_parquet" in store.tokens_between(rid, rid)  # every token row in a file: read there
        q = f"SELECT token_text FROM {store.tokens_between(rid, rid)} WHERE rollout_id = ? AND pos >= 10000 ORDER BY pos"
        assert list(store.df(q, [rid])["token_text"]) == ["a", "b", "c"]
    finally:
        store.close()


def test_prepare_makes_the_mirror_before_any_read_and_close_waits_for_it(shared):
    """A served studio's store: its mirror made on a thread while the server starts (``Store.prepare``),
    so the first page's read finds it; a store closed meanwhile leaves no mirror behind."""
    store = Store.open(shared)
    try:
        store.prepare()
        made = "SELECT count(*) FROM duckdb_tables() WHERE database_name = 'mirror' AND table_name = 'rollouts'"
        deadline = time.time() + 60
        while not store.cursor().execute(made).fetchall()[0][0] and time.time() < deadline:
            time.sleep(0.05)
        assert store.cursor().execute(made).fetchall()[0][0] == 1  # no read asked for it
        assert store.scalar("SELECT count(*) FROM rollouts") > 0
    finally:
        store.close()
    mine = f"{mirror.PREFIX}{os.getpid()}-*"
    early = Store.open(shared)
    early.prepare()
    early.close()  # while the mirror may still be being made: waits for it, then removes it
    assert not list(Path(tempfile.gettempdir()).glob(mine))
