"""A shared store (DuckLake, SQLite catalog): the same answers as a store file, several OS processes
writing and reading it at once, and clear errors for what can go wrong with it."""
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import duckdb
import pandas as pd
import pytest

import studio
from sample_data import SEED_DIRS
from studio.face.api import Studio
from studio.store import OWNER, Store, StoreError, lake, schema

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def run_py(code: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``code`` in a new Python process (another OS process on the same store)."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], cwd=ROOT, env=ENV,
                         capture_output=True, text=True, timeout=300)
    if check:
        assert out.returncode == 0, out.stderr[-3000:]
    return out


@pytest.fixture
def shared(tmp_path):
    """A seeded shared store's folder (made, seeded and closed here)."""
    folder = lake.create_shared(tmp_path / "team-store")
    Store.open(folder, seed_dir=SEED_DIRS).close()
    return folder


def test_a_shared_store_gives_the_same_answers_as_a_store_file(tmp_path, shared):
    b = studio.open(shared)
    a = Studio(Store.open(tmp_path / "seeded.duckdb", seed_dir=SEED_DIRS), b.policy)
    try:
        assert b.store.kind == "shared" and a.store.kind == "file"
        assert a.store.counts() == b.store.counts()

        def same(x: pd.DataFrame, y: pd.DataFrame) -> None:
            key = [c for c in x.columns if x[c].map(lambda v: isinstance(v, (str, int, float, bool))).all()]
            pd.testing.assert_frame_equal(x.sort_values(key).reset_index(drop=True),
                                          y.sort_values(key).reset_index(drop=True), check_dtype=False)

        same(a.runs().drop(columns=["owner"], errors="ignore"), b.runs().drop(columns=["owner"], errors="ignore"))
        same(a.rollouts(), b.rollouts())
        rid = a.rollouts(correct=False)["rollout_id"].iloc[0]
        same(a.tokens(rid), b.tokens(rid))
        gid = a.groups()["group_id"].iloc[0]
        same(a.group(gid), b.group(gid))
        same(a.mismatch(), b.mismatch())
        q = "SELECT r.kind, count(*) AS n, sum(ro.n_tokens) AS toks FROM runs r JOIN rollouts ro USING (run_id) GROUP BY 1"
        same(a.sql(q), b.sql(q))  # the SQL console reads the same tables by the same names
        # writes: a new rule version (shared by content hash: scoring twice adds it once), then its rewards
        rule = tmp_path / "short.py"
        rule.write_text("def reward(prompt, completion, gold, steps, **ctx):\n    return {'short': -len(completion) / 100}\n")
        for s in (a, b):
            s.score(rule)
            s.score(rule)
        q = "SELECT count(*) FROM rule_versions"
        assert a.store.scalar(q) == b.store.scalar(q)
        q = "SELECT count(*), round(sum(value), 6) FROM rewards WHERE component = 'short'"
        assert a.store.df(q).equals(b.store.df(q))
    finally:
        a.close()
        b.close()


def test_two_processes_write_while_a_third_reads(shared):
    """The served studio's process keeps the store open and reads; two other processes (an
    import-like writer and a Generate) write at once; every committed row reaches everyone."""
    reader = Store.open(shared)
    try:
        before, mark = reader.counts()["rollouts"], reader.change_mark()
        errors: list[BaseException] = []
        stop = threading.Event()

        def keep_reading():
            while not stop.is_set():
                try:
                    reader.df("SELECT r.rollout_id, count(t.pos) n FROM rollouts r LEFT JOIN tokens t USING "
                              "(rollout_id) GROUP BY 1 ORDER BY n DESC LIMIT 20")
                except BaseException as exc:  # noqa: BLE001 (collected, asserted below)
                    errors.append(exc)

        t = threading.Thread(target=keep_reading)
        t.start()
        writer = """
            import sys, studio
            s = studio.open(sys.argv[1])
            res = s.generate(["Q: 12+30-5=", "Q: 40-13+2="], group_size=4, seed=int(sys.argv[2]))
            print(res.run_id)
        """
        procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(writer), str(shared), str(seed)], cwd=ROOT,
                                  env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for seed in (1, 2)]
        outs = [p.communicate(timeout=300) for p in procs]
        stop.set()
        t.join()
        assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
        assert not errors, errors[:3]
        run_ids = [o[0].strip().splitlines()[-1] for o in outs]
        assert reader.counts()["rollouts"] == before + 16  # both writers' rows, seen by the reader's open store
        assert reader.change_mark() > mark  # what served pages poll to refresh
        assert set(reader.df("SELECT run_id FROM runs WHERE status = 'done'")["run_id"]) >= set(run_ids)
        # and the reader's own write reaches a fourth process, without moving its own change mark
        mark = reader.change_mark()
        reader.write({"runs": pd.DataFrame([{"run_id": "reader-run", "kind": "import", "status": "done"}])})
        assert reader.change_mark() == mark
        out = run_py("""
            import sys; from studio.store import Store
            s = Store.open(sys.argv[1]); print(s.scalar("SELECT owner FROM runs WHERE run_id = 'reader-run'"))
        """, str(shared))
        assert out.stdout.strip() == OWNER
    finally:
        reader.close()


def test_a_run_another_live_process_owns_stays_running(shared):
    """Opening a shared store marks 'running' runs interrupted only when their owner is gone."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host = OWNER.rsplit(":", 1)[0]
    rows = [("live-here", OWNER), ("gone-here", f"{host}:{dead.stdout.strip()}"), ("elsewhere", "gpu-box-7:4242"),
            ("no-owner", None)]
    s = Store.open(shared)
    s.write({"runs": pd.DataFrame([{"run_id": r, "kind": "minirun", "status": "running", "owner": o}
                                   for r, o in rows])})
    s.close()
    s = Store.open(shared)
    try:
        got = dict(s.cursor().execute("SELECT run_id, status FROM runs WHERE kind = 'minirun' AND "
                                      "run_id IN ('live-here', 'gone-here', 'elsewhere', 'no-owner')").fetchall())
        assert got == {"live-here": "running", "gone-here": "interrupted", "elsewhere": "running",
                       "no-owner": "running"}
    finally:
        s.close()


def test_two_processes_migrating_an_older_shared_store_at_once(shared):
    """A store at schema 10 opened by two processes at the same moment migrates once; both open it."""
    s = Store.open(shared)
    with s.transaction() as cur:
        cur.execute("ALTER TABLE runs DROP COLUMN owner")
        cur.execute("DELETE FROM meta WHERE key = 'schema_version'")
        cur.execute("INSERT INTO meta VALUES ('schema_version', '10')")
    n = s.counts()
    s.close()
    opener = """
        import sys; from studio.store import Store
        s = Store.open(sys.argv[1]); print(s.scalar("SELECT value FROM meta WHERE key = 'schema_version'"), s.counts()["rollouts"])
    """
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(opener), str(shared)], cwd=ROOT, env=ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    assert [o[0].split() for o in outs] == [[str(schema.SCHEMA_VERSION), str(n["rollouts"])]] * 2
    s = Store.open(shared)
    try:
        assert s.scalar("SELECT count(*) FROM meta WHERE key = 'schema_version'") == 1
        assert "owner" in s.df("SELECT * FROM runs LIMIT 0").columns
    finally:
        s.close()


def test_a_writer_waits_for_another_process_write(shared):
    """A write transaction holds the store's write lock; a second process's write waits for it
    and then commits (a SQLite catalog takes one writer at a time), and a writer that waits too
    long gives a clear error and writes nothing."""
    s = Store.open(shared)
    try:
        with s.transaction() as cur:
            cur.execute("INSERT INTO runs (run_id, kind, status) VALUES ('held', 'import', 'done')")
            out = run_py("""
                import os, sys; os.environ["ROLLOUT_STUDIO_WRITE_WAIT"] = "0.5"
                import pandas as pd; from studio.store import Store, StoreError
                s = Store.open(sys.argv[1])
                try:
                    s.write({"runs": pd.DataFrame([{"run_id": "impatient", "kind": "import"}])})
                except StoreError as exc:
                    print("refused:", exc)
            """, str(shared))
        assert "refused:" in out.stdout and "has been writing to the store for over 0.5 s" in out.stdout
        assert "nothing was written" in out.stdout
        assert s.scalar("SELECT count(*) FROM runs WHERE run_id = 'impatient'") == 0
        assert s.scalar("SELECT count(*) FROM runs WHERE run_id = 'held'") == 1
    finally:
        s.close()


# -- bad input ---------------------------------------------------------------------------------
def test_a_shared_store_with_missing_data_files_is_refused_and_unchanged(shared):
    files = sorted((shared / "data").rglob("*.parquet"))
    assert files
    aside = files[0].with_suffix(".moved")
    files[0].rename(aside)
    with pytest.raises(StoreError, match=r"data files are missing from .*first: .*Restore the data folder"):
        Store.open(shared)
    aside.rename(files[0])
    s = Store.open(shared)
    assert s.counts()["rollouts"] > 0
    s.close()


def test_a_shared_store_from_a_newer_studio_is_refused(shared):
    s = Store.open(shared)
    with s.transaction() as cur:
        cur.execute("UPDATE meta SET value = '999' WHERE key = 'schema_version'")
    s.close()
    with pytest.raises(StoreError, match="newer Rollout Studio.*schema 999.*not changed"):
        Store.open(shared)


def test_catalog_problems_name_the_store_and_what_to_do(tmp_path):
    with pytest.raises(StoreError, match="password in PGPASSWORD or a password file"):
        Store.open("postgresql://alice:s3cret@127.0.0.1:1/runs")
    with pytest.raises(StoreError) as err:
        lake.create_shared(tmp_path / "x", catalog="postgresql://bob:hunter2@db.example/runs")
    assert "hunter2" not in str(err.value)
    sock = __import__("socket").socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    with pytest.raises(StoreError, match=f"postgresql://alice@127.0.0.1:{port}/runs.*cannot be reached"):
        Store.open(f"postgresql://alice@127.0.0.1:{port}/runs")
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / lake.MARKER).write_text("{not json")
    with pytest.raises(StoreError, match="does not describe a shared store"):
        Store.open(folder)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    with pytest.raises(StoreError, match="not an empty folder"):
        lake.create_shared(tmp_path / "full")
    assert (tmp_path / "full" / "notes.txt").read_text() == "mine"


def test_a_lake_that_is_not_a_studio_store_is_refused(tmp_path):
    folder = lake.create_shared(tmp_path / "other")
    con = lake.connect(lake.spec_of(folder))
    con.execute("CREATE TABLE something_else (x INTEGER)")
    con.close()
    with pytest.raises(StoreError, match="not a Rollout Studio store"):
        Store.open(folder)


def test_extensions_load_from_the_packages_with_downloads_off():
    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    for name in ("ducklake", "sqlite_scanner", "postgres_scanner", "httpfs"):
        con.execute(f"LOAD '{lake.extension_file(name)}'")
    loaded = {r[0] for r in con.execute("SELECT extension_name FROM duckdb_extensions() WHERE loaded").fetchall()}
    assert {"ducklake", "sqlite_scanner", "postgres_scanner", "httpfs"} <= loaded


def test_a_mini_run_and_an_import_beside_an_open_store(shared, tmp_path):
    """A mini-run (CLI, its own worker processes) and a CLI import run on the store while this
    process keeps it open; both runs' rows reach it, and the checkpoints go in the store's folder."""
    s = Store.open(shared)
    try:
        before = s.counts()["rollouts"]
        lines = [{"prompt": f"Q: {a}+{a}=", "completion": f" {2 * a}", "reward": 1.0} for a in range(30)]
        (tmp_path / "run.jsonl").write_text("".join(__import__("json").dumps(x) + "\n" for x in lines))
        cli = [sys.executable, "-m", "studio.face.cli"]
        mini = subprocess.Popen([*cli, "minirun", "--db", str(shared), "--steps", "2", "--prompts-per-step", "2",
                                 "--group-size", "4", "--max-new-tokens", "12", "--checkpoint-every", "2"],
                                cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        imp = subprocess.run([*cli, "import", str(tmp_path / "run.jsonl"), "--db", str(shared), "--format", "generic",
                              "--name", "beside", "--map", "prompt=prompt", "--map", "completion=completion",
                              "--map", "reward=reward"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
        out, err = mini.communicate(timeout=600)
        assert imp.returncode == 0, imp.stderr[-2000:]
        assert mini.returncode == 0, err[-2000:]
        runs = s.df("SELECT name, kind, status FROM runs WHERE kind IN ('minirun', 'import') AND status = 'done'")
        assert "beside" in set(runs["name"]) and (runs["kind"] == "minirun").any()
        assert s.counts()["rollouts"] >= before + 30 + 2 * 2 * 4
        assert any((shared / "checkpoints").rglob("*.safetensors"))  # Store.home: the shared store's folder
    finally:
        s.close()


IMPORTER = """
import sys
from studio.ingest.formats import ColumnMapping
from studio.ingest.importers import import_run
from studio.store import Store
import_run(Store.open(sys.argv[1]), [sys.argv[2]], fmt="generic", name="doomed",
           mapping=ColumnMapping(prompt="prompt", completion="completion", reward="reward", token_texts="tokens"),
           progress=lambda done, total: print("read", done, total, flush=True))
"""


def test_a_killed_import_leaves_no_rows_and_frees_the_store(shared, tmp_path):
    """SIGKILL an import once it has written data files but not committed: nothing of it is
    visible, the write lock is free again, and the store takes the next write."""
    import json
    import signal
    import time

    src = tmp_path / "big.jsonl"
    toks = [f" t{j}" for j in range(25)]
    with src.open("w") as fh:
        for i in range(150_000):
            fh.write(json.dumps({"prompt": f"Q: {i}+1=", "completion": "".join(toks), "tokens": toks,
                                 "reward": 0.5}) + "\n")
    s = Store.open(shared)
    before = s.counts()
    files = lambda: len(list((shared / "data").rglob("*.parquet")))  # noqa: E731
    n_files = files()
    proc = subprocess.Popen([sys.executable, "-c", IMPORTER, str(shared), str(src)], cwd=ROOT, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        while files() == n_files and proc.poll() is None:  # its first data file is written: mid-transaction
            time.sleep(0.02)
        assert proc.poll() is None, "the import ended before it could be killed"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    try:
        assert files() > n_files  # it had written data, uncommitted
        assert s.counts() == before
        assert s.scalar("SELECT count(*) FROM runs WHERE name = 'doomed'") == 0
        s.write({"runs": pd.DataFrame([{"run_id": "after-kill", "kind": "import", "status": "done"}])})  # lock freed
        assert s.scalar("SELECT count(*) FROM runs WHERE run_id = 'after-kill'") == 1
    finally:
        s.close()
    s = Store.open(shared)  # and it opens again (the orphaned files are not listed by the catalog)
    assert s.counts()["rollouts"] == before["rollouts"]
    s.close()


def test_a_bulk_import_writes_its_tokens_as_one_data_file_of_the_lake(shared, tmp_path, monkeypatch):
    """The file store's shard path on a shared store: a large import's token rows stream into one
    Parquet file in the lake's token_rows folder, which its commit adds to the lake."""
    import json

    from studio.ingest.formats import ColumnMapping
    from studio.ingest.importers import import_run
    from studio.store import shards

    monkeypatch.setattr(shards, "SHARD_MIN_ROWS", 1_000)
    toks = [f" t{j}" for j in range(10)]
    src = tmp_path / "run.jsonl"
    src.write_text("".join(json.dumps({"prompt": f"Q: {i}+1=", "completion": "".join(toks), "tokens": toks,
                                       "reward": 1.0}) + "\n" for i in range(500)))
    s = Store.open(shared)
    try:
        before = s.counts()
        import_run(s, [src], fmt="generic", name="bulk",
                   mapping=ColumnMapping(prompt="prompt", completion="completion", reward="reward", token_texts="tokens"))
        files = list((shared / "data" / "main" / "token_rows").glob("shard_*.parquet"))
        assert len(files) == 1
        listed = s._con.execute("SELECT path FROM __ducklake_metadata_lake.ducklake_data_file "
                                "WHERE end_snapshot IS NULL").fetchall()
        assert files[0].name in {Path(p).name for (p,) in listed}
        assert s.counts()["tokens"] == before["tokens"] + 5_000
        got = s.df("SELECT t.token_text FROM tokens t JOIN rollouts r USING (rollout_id) JOIN runs USING (run_id) "
                   "WHERE runs.name = 'bulk' AND r.prompt_id = (SELECT prompt_id FROM prompts WHERE text = 'Q: 7+1=') "
                   "ORDER BY t.pos")
        assert got["token_text"].tolist() == toks
    finally:
        s.close()


def test_a_shared_store_folder_moved_as_a_whole_still_opens(shared, tmp_path):
    """A local shared store keeps its data path relative to its folder: moved or renamed, it opens
    with every row and takes new ones there."""
    s = Store.open(shared)
    n = s.counts()
    s.close()
    moved = shared.rename(tmp_path / "moved-store")
    s = Store.open(moved)
    try:
        assert s.counts() == n
        s.write({"runs": pd.DataFrame([{"run_id": "after-move", "kind": "import", "status": "done"}])})
        assert not shared.exists() and s.scalar("SELECT count(*) FROM runs WHERE run_id = 'after-move'") == 1
    finally:
        s.close()
