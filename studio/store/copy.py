"""A store copied whole, between kinds: a DuckDB file and a shared DuckLake store, either way.

:func:`copy_store` reads every table of the source in one snapshot and streams it, in Arrow record
batches of :data:`BATCH_ROWS` rows, into the destination inside one transaction; before that
transaction commits it checks every table's row count and a few sums against the source. The
source is only read: it is opened read-only (a file) or without the open's bookkeeping (a shared
store), so its runs keep their status, 'running' ones included.

A destination is always new or empty, and a failed copy leaves nothing of itself behind:

- a file is built at a temporary name beside its path and renamed into place after the checks
  (its token rows all in ``token_rows``: a copy has no shards);
- a shared store's folder that does not exist yet is made (:func:`studio.store.lake.create_shared`)
  and removed again if the copy fails; an existing shared store (a folder, a ``postgresql://`` URL)
  must hold no rows, and a failed copy's transaction rolls back, leaving it as empty as it was.

A file store's shard bookkeeping (``token_shards``, ``tokens_moved``) is not copied: the
``tokens`` view's rows are, shards and table alike.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import duckdb
import pyarrow as pa

from studio.store import Store, StoreError, lake, schema

# rows per record batch: a hundred million token rows stream through in pieces this size
BATCH_ROWS = 1_000_000
# a file store's shard bookkeeping: the copy's token rows are all its own (token_rows or data files)
NOT_COPIED = ("token_shards", "tokens_moved")
# beyond the row counts: sums that a lost or doubled batch would change
CHECKS = {"rollouts": "count(DISTINCT rollout_id), sum(n_tokens)",
          "tokens": "count(DISTINCT rollout_id), sum(pos)"}

Progress = Callable[[str, int, int], None]  # (table, rows copied so far, rows it has)


def copy_store(src: str | Path, dst: str | Path, *, catalog: str | None = None, data: str | None = None,
               progress: Progress | None = None) -> dict[str, int]:
    """Copy the store at ``src`` into a new store at ``dst``; returns each copied table's rows.

    ``src`` and ``dst`` are what :meth:`Store.open` takes: a DuckDB file, a shared store's folder,
    a ``postgresql://`` URL. A ``dst`` that does not exist is a file when its name ends in
    ``.duckdb``, otherwise a shared store made there with ``catalog`` and ``data`` (see
    :func:`~studio.store.lake.create_shared`). ``progress`` is called after each batch.

    Raises:
        StoreError: there is no store at ``src``, ``dst`` exists and is not an empty shared store,
            or the copy failed or its counts differ; ``src`` is unchanged and ``dst`` as it was.
    """
    if str(src) == ":memory:" or str(dst) == ":memory:":
        raise StoreError("an in-memory store cannot be copied from or into; give a file or a shared store")
    if _where(src) == _where(dst):
        raise StoreError(f"{src} and {dst} are the same store; give a new path to copy into")
    source = open_source(src)
    try:
        target = _Target(dst, catalog, data)
        try:
            counts = _copy(source, target.store, progress)
        except BaseException as exc:
            target.discard()
            if isinstance(exc, duckdb.Error):
                raise StoreError(f"copying {source.path} into {dst} failed ({str(exc).splitlines()[0]}); "
                                 f"{dst} was left as it was and {source.path} was not changed") from None
            raise
        target.finish()
    finally:
        source.close()
    return counts


def open_source(path: str | Path) -> Store:
    """The store at ``path``, opened to be read only: a file read-only, a shared store without
    marking any run interrupted. Its schema must be this studio's.

    Raises:
        StoreError: there is no store at ``path``, it is in use by a writer (a file), its shards or
            data files are missing, or its schema is not this version's.
    """
    if lake.is_shared(path):
        spec = lake.spec_of(path)
        store = Store(lake.connect(spec), spec.name, kind="shared", spec=spec)
    else:
        file = Path(path).expanduser()
        if not file.is_file():
            raise StoreError(f"there is no studio store at {path} to copy (a DuckDB file, a shared store's folder "
                             "or a postgresql:// URL)")
        try:
            con = duckdb.connect(str(file), read_only=True)
        except duckdb.Error as exc:
            first = str(exc).splitlines()[0]
            if "lock" in first.lower():
                raise StoreError(f"{file} is open in another process (DuckDB allows one writer); stop it, then "
                                 f"copy ({first})") from None
            raise StoreError(f"{file} is not a readable DuckDB store ({first}); nothing was changed") from None
        store = Store(con, str(file))
    try:
        _check_source(store)
    except BaseException:
        store.close()
        raise
    return store


def _check_source(store: Store) -> None:
    version = store.schema_version(store.cursor())
    if version != schema.SCHEMA_VERSION:
        newer = version > schema.SCHEMA_VERSION
        raise StoreError(
            f"{store.path} is at schema {version}, this studio writes schema {schema.SCHEMA_VERSION}: "
            + ("upgrade rollout-studio to copy it" if newer else
               f"open it once with this version (rollout-studio store info --db {store.path}) to migrate it, "
               "then copy it") + "; nothing was changed")
    if store.shared:
        store._check_data_files()
        return
    missing = [f for f in store.shard_paths() if not f.is_file()]
    if missing:
        raise StoreError(f"{store.path} keeps token rows in Parquet shards in {store.shard_dir}, and {len(missing)} "
                         f"of them are missing (first: {missing[0].name}); copy the folder back beside it first")


class _Target:
    """The store a copy writes: made or opened, then finished (kept) or discarded (removed again)."""

    def __init__(self, dst: str | Path, catalog: str | None, data: str | None):
        self.dst = dst
        self._tmp: Path | None = None
        self._undo: Callable[[], None] = lambda: None
        if lake.is_shared(dst):
            if catalog or data:
                raise StoreError(f"{dst} is a shared store already: --catalog and --data are for a new one")
            _refuse_rows(dst)
            self.store = Store.open(dst)
        elif str(dst).endswith(".duckdb"):
            if catalog or data:
                raise StoreError(f"{dst} names a DuckDB file: --catalog and --data are for a shared store "
                                 "(give a folder path)")
            self._open_file(Path(dst).expanduser())
        else:
            self.store, self._undo = new_shared(dst, catalog, data)

    def _open_file(self, path: Path) -> None:
        if path.exists():
            raise StoreError(f"{path} already exists; copy into a new path (nothing was changed)")
        self._tmp = path.with_name(f".{path.name}.copying-{os.getpid()}")
        _remove_file(self._tmp)
        try:
            self.store = Store.open(self._tmp)
        except BaseException:
            _remove_file(self._tmp)
            raise

    def finish(self) -> None:
        """Keep the copy: a file is checkpointed and renamed to its path."""
        if self._tmp is None:
            self.store.close()
            return
        path = Path(self.dst).expanduser()
        self.store._con.execute("CHECKPOINT")
        self.store.close()
        if path.exists():  # made by someone else meanwhile: never replaced
            _remove_file(self._tmp)
            raise StoreError(f"{path} appeared while the copy ran; it was not replaced, and the copy was removed")
        self._tmp.replace(path)

    def discard(self) -> None:
        """Remove what this copy made (an existing shared store's rows rolled back with the transaction)."""
        self.store.close()
        if self._tmp is not None:
            _remove_file(self._tmp)
        self._undo()


def new_shared(path: str | Path, catalog: str | None = None, data: str | None = None,
               seed_dir=None) -> tuple[Store, Callable[[], None]]:
    """Make a shared store at ``path`` (:func:`~studio.store.lake.create_shared`) and open it, its tables
    seeded from ``seed_dir`` (see :meth:`Store.open`); returns it and a function that removes what this
    made (the folder, or an empty folder's contents; a new local data folder). If opening fails,
    that is done before the error is raised.

    Raises:
        SharedStoreError: ``path`` is not new or an empty folder, the URL carries a password, or the
            catalog cannot be reached.
        StoreError: the PostgreSQL catalog already holds a store with rows (open that one instead).
    """
    folder = Path(path).expanduser().resolve()
    existed = folder.is_dir()
    data_dir = Path(data).expanduser().resolve() if data and not data.startswith("s3://") else None
    data_existed = data_dir is not None and data_dir.exists()
    made = lake.create_shared(folder, catalog, data)

    def undo() -> None:
        for child in list(made.iterdir()) if existed else [made]:
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)
        if data_dir is not None and not data_existed:
            shutil.rmtree(data_dir, ignore_errors=True)

    try:
        if catalog:  # a database of its own, but it may hold a store already: never added to
            _refuse_rows(made, f"the catalog {lake.redacted(catalog)}")
        return Store.open(made, seed_dir=seed_dir), undo
    except BaseException:
        undo()
        raise


def _refuse_rows(dst: str | Path, what: str | None = None) -> None:
    """Refuse an existing shared store that holds rows, looking without opening it as a Store (which
    could mark its runs interrupted or migrate it); ``what`` names it in the message."""
    spec = lake.spec_of(dst)
    con = lake.connect(spec)
    try:
        have = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = ?",
                                          [lake.LAKE]).fetchall()}
        rows = {t: con.execute(f"SELECT count(*) FROM {lake.LAKE}.{t}").fetchall()[0][0]
                for t in sorted(have - {"meta"})}
    finally:
        con.close()
    held = {t: n for t, n in rows.items() if n}
    if held:
        listed = ", ".join(f"{t} {n:,}" for t, n in held.items())
        raise StoreError(f"{what or spec.name} already holds rows ({listed}); give a new path, an empty shared "
                         "store or an empty catalog database (nothing was changed)")


def _copy(source: Store, target: Store, progress: Progress | None) -> dict[str, int]:
    """Stream every table of ``source`` into ``target`` in one transaction, checked before it commits."""
    counts: dict[str, int] = {}
    cur = source.cursor()
    cur.execute("BEGIN TRANSACTION")  # every table from one snapshot of the source
    try:
        with target.transaction() as out:
            for table in schema.TABLES:
                if table not in NOT_COPIED:
                    counts[table] = _copy_table(source, cur, table, out, progress)
            for table, sums in CHECKS.items():
                want = cur.execute(f"SELECT {sums} FROM ({_select(source, cur, table)})").fetchall()[0]
                have = out.execute(f"SELECT {sums} FROM {schema.physical(table)}").fetchall()[0]
                if tuple(want) != tuple(have):
                    raise StoreError(f"the copy of {table} differs from {source.path}'s ({sums}: {tuple(have)} "
                                     f"against {tuple(want)}); nothing was kept")
    finally:
        cur.execute("ROLLBACK")
        cur.close()
    return counts


def _copy_table(source: Store, cur: duckdb.DuckDBPyConnection, table: str, out: duckdb.DuckDBPyConnection,
                progress: Progress | None) -> int:
    """Copy one table's rows in record batches; returns how many, checked against the target's count."""
    into = schema.physical(table)
    # by position, in the target's column order (a migrated store's columns may be in another)
    cols = ", ".join(d[0] for d in out.execute(f"SELECT * FROM {into} LIMIT 0").description)
    select = _select(source, cur, table)
    total = cur.execute(f"SELECT count(*) FROM ({select})").fetchall()[0][0]
    where = " WHERE key <> 'schema_version'" if table == "meta" else ""  # the target wrote its own
    done = 0
    for batch in cur.execute(f"SELECT {cols} FROM ({select}){where}").to_arrow_reader(BATCH_ROWS):
        # a relation, not a registered view: a transaction keeps every registered object until it ends
        out.from_arrow(pa.Table.from_batches([batch])).insert_into(into)
        done += batch.num_rows
        if progress is not None:
            progress(table, done, total)
    got = out.execute(f"SELECT count(*) FROM {into}").fetchall()[0][0]
    if got != total:
        raise StoreError(f"the copy of {table} has {got:,} rows, {source.path}'s {total:,}; nothing was kept")
    return total


def _select(source: Store, cur: duckdb.DuckDBPyConnection, table: str) -> str:
    """The query of every row of ``table`` in ``source`` (``tokens``: the table and any shards)."""
    if table == "tokens":
        return source._tokens_sql(source._shards(cur))
    return f"SELECT {', '.join(schema.columns(table))} FROM {table}"


def _where(path: str | Path) -> str:
    text = str(path)
    return text if text.startswith(("postgresql://", "postgres://")) else str(Path(text).expanduser().resolve())


def _remove_file(path: Path) -> None:
    """A DuckDB file and its write-ahead log."""
    path.unlink(missing_ok=True)
    path.with_name(path.name + ".wal").unlink(missing_ok=True)
