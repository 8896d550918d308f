"""A team's shared store: a real PostgreSQL catalog (with the data in a shared folder or on an
S3-compatible server), written by two processes as two machines would, with credentials only
in the environment."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sample_data import SEED_DIRS
from studio.store import Store, StoreError, lake

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def pg_env(postgres, monkeypatch):
    """The catalog's password in this process's environment (as a user sets PGPASSWORD)."""
    for key, value in postgres.env.items():
        monkeypatch.setenv(key, value)
    return dict(os.environ, PYTHONPATH=str(ROOT))


def other_machine(code: str, env: dict, *args: str) -> str:
    """Run ``code`` in another OS process with only ``env`` (another machine of the team)."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_a_postgres_catalog_store_is_shared_by_two_processes(tmp_path, postgres, pg_env):
    db = postgres.new_database("team_a")
    folder = lake.create_shared(tmp_path / "team", catalog=db.url, data=str(tmp_path / "shared-disk"))
    assert postgres.password not in (folder / lake.MARKER).read_text()
    s = Store.open(folder, seed_dir=SEED_DIRS)
    try:
        n = s.counts()
        assert n["rollouts"] > 0 and s.describe().startswith(f"shared store {folder} (catalog postgres")
        mark = s.change_mark()
        # the other machine names the store by its catalog's URL alone: the data path is in the catalog
        out = other_machine("""
            import sys; import pandas as pd; from studio.store import Store
            s = Store.open(sys.argv[1])
            s.write({"runs": pd.DataFrame([{"run_id": "from-b", "kind": "import", "status": "done"}])})
            print(s.counts()["rollouts"])
        """, pg_env, db.url)
        assert int(out.split()[-1]) == n["rollouts"]
        assert s.scalar("SELECT count(*) FROM runs WHERE run_id = 'from-b'") == 1
        assert s.change_mark() > mark
        # two writers inserting into one table at once both commit (DuckLake merges the inserts)
        writer = """
            import sys; import pandas as pd; from studio.store import Store
            s = Store.open(sys.argv[1])
            for i in range(5):
                s.write({"runs": pd.DataFrame([{"run_id": f"{sys.argv[2]}-{i}", "kind": "import", "status": "done"}])})
        """
        procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(writer), db.url, tag], cwd=ROOT,
                                  env=pg_env, stderr=subprocess.PIPE, text=True) for tag in ("x", "y")]
        errs = [p.communicate(timeout=300)[1] for p in procs]
        assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for e in errs]
        assert s.scalar("SELECT count(*) FROM runs WHERE run_id LIKE 'x-%' OR run_id LIKE 'y-%'") == 10
        # the password is nowhere in the catalog
        con = lake.connect(lake.spec_of(db.url))
        dump = con.execute("SELECT string_agg(value, ' ') FROM __ducklake_metadata_lake.ducklake_metadata").fetchall()
        con.close()
        assert postgres.password not in str(dump)
    finally:
        s.close()


def test_catalog_credentials_refused_or_missing_say_so(postgres, monkeypatch, tmp_path):
    db = postgres.new_database("team_b")
    monkeypatch.setenv("PGPASSWORD", "not-the-password")
    with pytest.raises(StoreError, match=r"refused the credentials.*PGPASSWORD") as err:
        Store.open(db.url)
    assert "not-the-password" not in str(err.value)
    monkeypatch.delenv("PGPASSWORD")
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "no-such-passfile"))
    with pytest.raises(StoreError, match="refused the credentials"):
        Store.open(db.url)
    monkeypatch.setenv("PGPASSWORD", postgres.password)
    with pytest.raises(StoreError, match="catalog database .* does not exist"):
        Store.open(db.url.rsplit("/", 1)[0] + "/no_such_db")


def test_a_passfile_is_read_for_the_catalog(postgres, monkeypatch, tmp_path):
    db = postgres.new_database("team_c")
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"{postgres.host}:{postgres.port}:*:{postgres.user}:{postgres.password}\n")
    passfile.chmod(0o600)
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    folder = lake.create_shared(tmp_path / "team", catalog=db.url)
    s = Store.open(folder, seed_dir=SEED_DIRS)
    try:
        assert s.counts()["rollouts"] > 0
    finally:
        s.close()


def test_data_on_s3_compatible_storage(tmp_path, postgres, pg_env, s3, monkeypatch):
    for key, value in s3.env.items():
        monkeypatch.setenv(key, value)
    env = dict(pg_env, **s3.env)
    db = postgres.new_database("team_s3")
    folder = lake.create_shared(tmp_path / "team", catalog=db.url, data=s3.data_path("studio"))
    s = Store.open(folder, seed_dir=SEED_DIRS)
    try:
        assert s.spec.on_s3
        n = s.counts()
        keys = [o["Key"] for o in s3.client().list_objects_v2(Bucket="rollouts", Prefix="studio/")["Contents"]]
        assert keys and all(k.endswith(".parquet") for k in keys)
        out = other_machine("""
            import sys; from studio.store import Store
            s = Store.open(sys.argv[1]); print(s.counts()["tokens"])
            rid = s.scalar("SELECT rollout_id FROM rollouts ORDER BY rollout_id LIMIT 1")
            print(len(s.df("SELECT * FROM tokens WHERE rollout_id = ?", [rid])))
        """, env, db.url)
        tokens, one = map(int, out.split()[-2:])
        assert tokens == n["tokens"] and one > 0
        assert s3.secret not in (folder / lake.MARKER).read_text()
    finally:
        s.close()
    from tests.services import free_port

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # the object store is down
    s = Store.open(folder)  # the catalog opens; reading the data says what cannot be reached
    try:
        with pytest.raises(StoreError, match=r"data of shared store .* on s3://rollouts/studio/ cannot be reached"):
            s.df("SELECT count(*) FROM tokens WHERE logprob < 0")
    finally:
        s.close()
