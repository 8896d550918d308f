"""A store file's DuckDB connection, its opening failures explained (a shared store's: ``lake.connect``)."""
from __future__ import annotations

from pathlib import Path

import duckdb

from studio.store.errors import StoreError


def connect(path: Path) -> duckdb.DuckDBPyConnection:
    """A connection to the store file at ``path``.

    Raises:
        StoreError: the file is open in another process, was written by a newer DuckDB, or is not
            a DuckDB file; the message says what to do, and the file is left unchanged.
    """
    try:
        con = duckdb.connect(str(path))
        con.execute("SET GLOBAL parquet_metadata_cache = true")  # the tokens view reads shard footers every query; GLOBAL: cursors too
        return con
    except duckdb.Error as exc:
        first = str(exc).splitlines()[0]
        if isinstance(exc, duckdb.IOException) and "lock" in first.lower():
            raise StoreError(
                f"{path} is open in another process (DuckDB allows one). Close the other studio "
                f"or CLI using it, or pass a different --db, or make a shared store that many processes "
                f"open at once (docs/shared-store.md). ({first})") from None
        if isinstance(exc, duckdb.IOException) and "version number" in first.lower():
            raise StoreError(
                f"{path} was written by a newer DuckDB than this studio's {duckdb.__version__} (stores made "
                "with DuckDB 2.0, before the studio moved to 1.5.5 for shared stores); it was not changed. "
                "Convert it once with DuckDB 2.0 in another environment: pip install duckdb==2.0.1, then "
                f"ATTACH '{path}' AS src (READ_ONLY); ATTACH 'converted.duckdb' AS dst (STORAGE_VERSION "
                "'v1.5.0'); COPY FROM DATABASE src TO dst; and open converted.duckdb (move its .shards "
                f"folder beside it too). ({first})") from None
        raise StoreError(
            f"{path} is not a readable DuckDB store ({first}). It may be corrupt, unreadable or not a "
            "DuckDB file; it was not changed. Pass another path with --db to start a fresh store.") from None
