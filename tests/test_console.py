"""The SQL console: reads answer, anything that writes or reaches outside the store is refused."""
from __future__ import annotations

import pytest

from studio.queries import console
from studio.store import QueryTimeout


def test_a_select_answers_with_the_stores_rows(seeded_store):
    res = console.run(seeded_store, "SELECT run_id, count(*) AS n FROM rollouts GROUP BY run_id;")
    assert res.frame["n"].sum() == seeded_store.counts()["rollouts"] and not res.truncated


def test_ctes_joins_and_information_schema_are_reads(seeded_store):
    res = console.run(seeded_store, """WITH t AS (SELECT rollout_id FROM rollouts LIMIT 3)
                                       SELECT count(*) AS n FROM t JOIN tokens USING (rollout_id)""")
    assert res.frame["n"][0] > 0
    tables = console.run(seeded_store, "SELECT table_name FROM information_schema.tables")
    assert {"rollouts", "tokens", "import_files"} <= set(tables.frame["table_name"])


def test_results_are_capped_and_say_so(seeded_store):
    res = console.run(seeded_store, "SELECT * FROM tokens", limit=10)
    assert len(res.frame) == 10 and res.truncated


@pytest.mark.parametrize("sql, why", [
    ("DELETE FROM rollouts", "only SELECT"),
    ("UPDATE runs SET name = 'x'", "only SELECT"),
    ("DROP TABLE tokens", "only SELECT"),
    ("ATTACH 'other.duckdb'", "only SELECT"),
    ("COPY rollouts TO '/tmp/x.csv'", "only SELECT"),
    ("PRAGMA version", "only SELECT"),
    ("SET memory_limit = '1GB'", "only SELECT"),
    ("SELECT 1; DELETE FROM rollouts", "one statement"),
    ("SELECT * FROM read_csv('/etc/passwd')", "read_csv"),
    ("SELECT * FROM '/etc/passwd'", "not a table of the store"),
    ("SELECT getenv('HOME')", "getenv"),
    ("SELECT (SELECT read_text('x'))", "read_text"),
    ("SELECT * FROM query('DELETE FROM rollouts')", "query"),
    ("SELECT * FROM duckdb_settings()", "duckdb_settings"),
    ("SELECT * FROM other.main.rollouts", "not a table of the store"),
    ("SELECT * FROM system.main.duckdb_settings", "not a table of the store"),
    ("SELECT * FROM frame_in_memory", "not a table of the store"),  # no Python replacement scans
    # a CTE named like a file, defined in a subquery, does not make the file a table outside it
    ('SELECT *, (WITH "/etc/passwd.csv" AS (SELECT 1) SELECT 1) FROM "/etc/passwd.csv"', "not a table of the store"),
    ('WITH "x.csv" AS (SELECT 1) SELECT * FROM "x.csv"', "not a table of the store"),
    ("", "SELECT query first"),
])
def test_anything_but_a_read_of_the_store_is_refused_before_it_runs(seeded_store, sql, why):
    before = seeded_store.counts()
    with pytest.raises(console.ReadOnlyError, match=why):
        console.run(seeded_store, sql)
    assert seeded_store.counts() == before


def test_a_runaway_query_is_stopped(seeded_store):
    with pytest.raises(QueryTimeout):
        console.run(seeded_store, "SELECT sum(a.range * b.range) AS s FROM range(300000) a, range(300000) b",
                    timeout_s=0.5)
