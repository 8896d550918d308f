"""The servers the shared-store tests run against really start and answer (tests/services.py).

PostgreSQL is reached the way a shared store reaches it: DuckDB's postgres extension, loaded from
its package, with the password only in ``PGPASSWORD``; the S3-compatible server through boto3 and
through DuckDB's httpfs with a temporary secret (the recipe of a store whose data is on S3).
"""
from __future__ import annotations

import duckdb
import pytest

from studio.store.lake import extension_file


def _duckdb(*extensions: str) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    for name in extensions:
        con.execute(f"LOAD '{extension_file(name)}'")
    return con


@pytest.fixture()
def pg_password(postgres, monkeypatch):
    """The server's password in ``PGPASSWORD`` for this test only (libpq reads it at connect time)."""
    monkeypatch.setenv("PGPASSWORD", postgres.password)


def test_postgres_answers_with_the_password_from_the_environment(postgres, pg_password):
    assert postgres.password not in postgres.url and postgres.password not in postgres.conninfo
    con = _duckdb("postgres_scanner")
    con.execute(f"ATTACH '{postgres.conninfo}' AS pg (TYPE postgres)")
    assert con.sql("SELECT * FROM postgres_query('pg', 'SELECT current_user, current_database()')").fetchone() \
        == (postgres.user, postgres.dbname)


def test_postgres_refuses_a_wrong_password(postgres, monkeypatch):
    monkeypatch.setenv("PGPASSWORD", "not-the-password")
    con = _duckdb("postgres_scanner")
    with pytest.raises(duckdb.Error, match="password authentication failed"):
        con.execute(f"ATTACH '{postgres.conninfo}' AS pg (TYPE postgres)")


def test_postgres_new_database_is_empty_and_separate(postgres, pg_password):
    other = postgres.new_database("services_separate")
    con = _duckdb("postgres_scanner")
    con.execute(f"ATTACH '{other.conninfo}' AS pg (TYPE postgres)")
    con.execute("CREATE TABLE pg.public.marker (x INTEGER)")
    con.execute(f"ATTACH '{postgres.conninfo}' AS main_db (TYPE postgres)")
    tables = con.sql("SELECT table_catalog FROM information_schema.tables WHERE table_name = 'marker'").fetchall()
    assert tables == [("pg",)]


def test_s3_stores_and_returns_an_object(s3):
    client = s3.client()
    client.put_object(Bucket=s3.bucket, Key="services/hello.txt", Body=b"hello")
    assert client.get_object(Bucket=s3.bucket, Key="services/hello.txt")["Body"].read() == b"hello"
    assert s3.env["AWS_ENDPOINT_URL"] == s3.endpoint_url and s3.secret not in s3.endpoint_url


def test_duckdb_writes_and_reads_parquet_on_the_s3_server(s3):
    con = _duckdb("httpfs")
    con.execute(f"CREATE TEMPORARY SECRET (TYPE s3, KEY_ID '{s3.key_id}', SECRET '{s3.secret}', "
                f"ENDPOINT '{s3.endpoint}', URL_STYLE 'path', USE_SSL false, REGION '{s3.region}')")
    url = s3.data_path("services") + "numbers.parquet"
    con.execute(f"COPY (SELECT range AS n FROM range(1000)) TO '{url}' (FORMAT parquet)")
    assert con.sql(f"SELECT count(*), sum(n) FROM '{url}'").fetchone() == (1000, 499500)
    keys = [o["Key"] for o in s3.client().list_objects_v2(Bucket=s3.bucket, Prefix="services/")["Contents"]]
    assert "services/numbers.parquet" in keys

