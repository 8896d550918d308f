"""Read-only SQL over the store, for the questions the views do not anticipate.

A query is checked before it runs, from DuckDB's own parse tree (``json_serialize_sql``):
one ``SELECT`` statement, reading only the store's tables (and the CTEs it names), with no
table function but ``range`` / ``generate_series`` / ``unnest`` and none of the functions
that reach outside the store (files, environment, SQL in strings). Anything else is
refused with the reason, before DuckDB executes a thing. It runs under the store's time
limit and returns at most ``limit`` rows.

>>> check("SELECT count(*) FROM rollouts")
>>> check("DELETE FROM rollouts")
Traceback (most recent call last):
...
studio.queries.console.ReadOnlyError: only SELECT queries run here (this is DELETE): the console never changes the store
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass

import duckdb
import pandas as pd

from studio.errors import StudioError
from studio.store import Store, schema

MAX_ROWS = 1000
TABLE_FUNCTIONS = frozenset({"range", "generate_series", "unnest"})
# functions that read files, the environment or run SQL held in a string
DENIED = frozenset({
    "getenv", "query", "query_table", "read_text", "read_blob", "read_csv", "read_csv_auto", "read_json",
    "read_json_auto", "read_json_objects", "read_ndjson", "read_ndjson_auto", "read_ndjson_objects",
    "read_parquet", "parquet_scan", "parquet_metadata", "parquet_schema", "parquet_file_metadata",
    "parquet_kv_metadata", "glob", "sniff_csv", "current_setting", "duckdb_secrets", "which_secret",
})
SCHEMAS = frozenset({"", "main", "information_schema"})
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # a table's name, never a path (replacement scans)

EXAMPLES: dict[str, str] = {
    "Rollouts per run and step": (
        "SELECT run_id, train_step, count(*) AS rollouts, avg(n_tokens) AS mean_tokens\n"
        "FROM rollouts GROUP BY ALL ORDER BY run_id, train_step"),
    "Mean reward per rule version": (
        "SELECT rule_version_id, count(*) AS rollouts, avg(value) AS mean_reward\n"
        "FROM rewards WHERE component = 'total' GROUP BY ALL ORDER BY rollouts DESC"),
    "Highest-entropy tokens": (
        "SELECT rollout_id, pos, token_text, entropy\nFROM tokens WHERE entropy IS NOT NULL\n"
        "ORDER BY entropy DESC LIMIT 50"),
    "Prompts where every completion scored the same": (
        "SELECT ro.group_id, any_value(p.text) AS prompt, count(*) AS n, min(r.value) AS reward\n"
        "FROM rollouts ro JOIN prompts p USING (prompt_id)\n"
        "JOIN rewards r ON r.rollout_id = ro.rollout_id AND r.component = 'total'\n"
        "GROUP BY ro.group_id HAVING count(*) > 1 AND min(r.value) = max(r.value) LIMIT 100"),
    "Imported files": "SELECT * FROM import_files ORDER BY imported_at DESC",
}


class ReadOnlyError(StudioError, ValueError):
    """The query is not a single read of the store's tables; nothing ran."""


@dataclass
class ConsoleResult:
    frame: pd.DataFrame
    truncated: bool  # more rows than ``limit`` matched
    seconds: float
    sql: str


def _walk(node, found: dict, visible: frozenset = frozenset()) -> None:
    """Collect tables (each with the CTE names visible where it is read), table functions and
    functions. A node's ``cte_map`` is visible in that node and below it, nowhere else: a CTE
    defined in a subquery does not name a table of the outer query."""
    if isinstance(node, dict):
        cte = node.get("cte_map")
        if isinstance(cte, dict) and cte.get("map"):
            visible = visible | {str(m.get("key", "")).lower() for m in cte["map"]}
        kind = node.get("type")
        if kind == "BASE_TABLE":
            found["tables"].append((node.get("catalog_name", ""), node.get("schema_name", ""),
                                    node.get("table_name", ""), visible))
        elif kind == "TABLE_FUNCTION":
            found["table_functions"].append((node.get("function") or {}).get("function_name", ""))
        if node.get("class") == "FUNCTION":
            found["functions"].append(node.get("function_name", ""))
        for v in node.values():
            _walk(v, found, visible)
    elif isinstance(node, list):
        for v in node:
            _walk(v, found, visible)


def check(sql: str, con: duckdb.DuckDBPyConnection | None = None) -> None:
    """Raise :class:`ReadOnlyError` unless ``sql`` is one SELECT over the store's tables."""
    con = con or duckdb.connect()
    text = sql.strip().rstrip(";").strip()
    if not text:
        raise ReadOnlyError("write a SELECT query first")
    try:
        statements = con.extract_statements(text)
    except duckdb.Error as exc:
        raise ReadOnlyError(f"DuckDB cannot parse this: {str(exc).splitlines()[0]}") from None
    if len(statements) != 1:
        raise ReadOnlyError(f"one statement at a time (this has {len(statements)})")
    kind = statements[0].type
    if text.split(None, 1)[0].upper() == "PRAGMA":  # DuckDB 1.5 parses "PRAGMA version" as a SELECT of pragma_version()
        kind = duckdb.StatementType.PRAGMA
    if kind != duckdb.StatementType.SELECT:
        raise ReadOnlyError(f"only SELECT queries run here (this is {kind.name}): "
                            "the console never changes the store")
    tree = json.loads(con.execute("SELECT json_serialize_sql(?::VARCHAR)", [text]).fetchone()[0])
    if tree.get("error"):
        raise ReadOnlyError(f"DuckDB cannot parse this: {tree.get('error_message')}")
    found: dict[str, list] = {"tables": [], "table_functions": [], "functions": []}
    _walk(tree, found)
    catalogs = {"", con.execute("SELECT current_database()").fetchone()[0].lower()}
    for catalog, sch, name, ctes in found["tables"]:
        known = set(schema.TABLES) | ctes
        if (catalog.lower() not in catalogs or sch.lower() not in SCHEMAS or not IDENTIFIER.match(name)
                or (sch.lower() != "information_schema" and name.lower() not in known)):
            where = ".".join(x for x in (catalog, sch, name) if x)
            raise ReadOnlyError(f"{where!r} is not a table of the store: the console reads "
                                f"{', '.join(sorted(schema.TABLES))} (and information_schema)")
    for fn in found["table_functions"]:
        if fn.lower() not in TABLE_FUNCTIONS:
            raise ReadOnlyError(f"table function {fn}() is not allowed here: the console reads the store's tables "
                                f"only (allowed: {', '.join(sorted(TABLE_FUNCTIONS))})")
    for fn in found["functions"]:
        if fn.lower() in DENIED:
            raise ReadOnlyError(f"{fn}() reaches outside the store (files, environment or SQL in a string) "
                                "and is not allowed in the console")


def run(store: Store, sql: str, limit: int = MAX_ROWS, timeout_s: float | None = None) -> ConsoleResult:
    """Check ``sql`` (see :func:`check`) and run it read-only: at most ``limit`` rows.

    Raises:
        ReadOnlyError: the query is refused (nothing ran).
        QueryTimeout: it ran past the time limit and was stopped.
        duckdb.Error: DuckDB rejected it (unknown column, type error...).
    """
    cur = store.cursor()
    try:
        check(sql, cur)
    finally:
        cur.close()
    text = sql.strip().rstrip(";").strip()
    t = time.perf_counter()
    frame = store.df(f"SELECT * FROM ({text}) AS console_query LIMIT ?", [int(limit) + 1], timeout_s=timeout_s)
    truncated = len(frame) > limit
    return ConsoleResult(frame.head(limit), truncated, time.perf_counter() - t, text)
