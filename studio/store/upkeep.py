"""Looking after a store: what it holds (:func:`inventory`, for ``rollout-studio store info``) and a
shared store's compaction (:func:`compact`, for ``rollout-studio store compact``).

A shared store's small writes leave small Parquet files and snapshots behind (a write of up to
:data:`~studio.store.lake.INLINE_ROWS` rows is kept in the catalog itself); :func:`compact` flushes
those rows into files, merges adjacent small files, expires old snapshots and deletes the files
no snapshot needs any more.
"""
from __future__ import annotations

import re
from pathlib import Path

from studio.store import Store, StoreError, lake, schema


def inventory(store: Store) -> dict:
    """What ``store`` is and holds, for ``rollout-studio store info``: kind, where it is (never a
    credential), schema version, rows per table; a file's size and shards; a shared store's
    catalog, data path, live data files and their bytes, and its DuckLake snapshot id."""
    out: dict = {"kind": store.kind, "store": store.path, "schema": store.schema_version(store.cursor()),
                 "rows": {t: store.scalar(f"SELECT count(*) FROM {t}") for t in schema.TABLES}}
    if store.shared:
        files, size = _data_files(store)
        cur = store.cursor()
        out |= {"catalog": _public(store.spec.catalog), "data": store.spec.data_path or lake.kept_data_path(cur) or "?",
                "snapshot": cur.execute(f"SELECT * FROM ducklake_current_snapshot('{lake.LAKE}')").fetchall()[0][0],
                "data_files": files, "data_bytes": size}
    elif store.kind == "file":
        shards = store.shard_paths()
        out |= {"file_bytes": Path(store.path).stat().st_size, "shards": len(shards),
                "shard_bytes": sum(f.stat().st_size for f in shards if f.is_file())}
    return out


def compact(store: Store, keep_hours: float = 24.0) -> dict[str, int]:
    """DuckLake maintenance of a shared store: the rows kept in the catalog written out as files, adjacent
    small files merged, snapshots older than ``keep_hours`` expired (no time travel before them), the
    files only they used deleted, and files no snapshot lists (a killed writer's) deleted once older
    than ``keep_hours`` and at least an hour (a running writer's are younger). Each step is its own
    commit, under the write lock. Returns live data files and bytes before and after, snapshots
    expired and files deleted.

    Raises:
        StoreError: ``store`` is not a shared store.
    """
    if not store.shared:
        raise StoreError(f"{store.describe()} is not a shared store: only a shared store has data files to "
                         "compact (nothing was changed)")
    keep = f"now() - INTERVAL '{float(keep_hours) * 3600:.0f} seconds'"
    orphans = f"now() - INTERVAL '{max(float(keep_hours), 1.0) * 3600:.0f} seconds'"
    out: dict[str, int] = {}
    out["files_before"], out["bytes_before"] = _data_files(store)
    steps = [  # (what the count of its rows is, the call)
        (None, f"ducklake_flush_inlined_data('{lake.LAKE}')"),
        (None, f"ducklake_merge_adjacent_files('{lake.LAKE}')"),
        ("snapshots_expired", f"ducklake_expire_snapshots('{lake.LAKE}', older_than => {keep})"),
        ("files_deleted", f"ducklake_cleanup_old_files('{lake.LAKE}', cleanup_all => true)"),
        ("orphans_deleted", f"ducklake_delete_orphaned_files('{lake.LAKE}', older_than => {orphans})"),
    ]
    for name, call in steps:
        with store.transaction() as cur:
            # counted, not fetched: the rows carry time zones, which DuckDB hands Python through pytz
            n = cur.execute(f"SELECT count(*) FROM {call}").fetchall()[0][0]
        if name is not None:
            out[name] = n
    out["files_after"], out["bytes_after"] = _data_files(store)
    return out


def _data_files(store: Store) -> tuple[int, int]:
    """Live data files of the lake and their bytes (the catalog's count; inlined rows have none)."""
    files, size = store.cursor().execute(f"SELECT coalesce(sum(file_count), 0), coalesce(sum(file_size_bytes), 0) "
                                         f"FROM ducklake_table_info('{lake.LAKE}')").fetchall()[0]
    return int(files), int(size)


_PASSWORD = re.compile(r"\s*password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def _public(catalog: str) -> str:
    """A catalog's description without any password a hand-written connection string may carry."""
    kind, _, where = catalog.partition(":")
    return f"{kind} {_PASSWORD.sub('', where).strip()}"
