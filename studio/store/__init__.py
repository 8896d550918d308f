"""The DuckDB store: parameterised SQL, a cursor per call, over one of two kinds of storage.

A **file** store is one DuckDB file (or ``:memory:``) that one process opens at a time. A
**shared** store is a DuckLake (``studio.store.lake``): a catalog in SQLite or PostgreSQL and the
data as Parquet files, which many processes open at once; a write takes the store's write lock
where the catalog needs one (``studio.store.writelock``), and each process marks its own commits
so pages can tell another process's rows from its own (:meth:`Store.change_mark`). Nothing above
this package knows which kind it runs on.

The process that opens a file :class:`Store` owns the file; workers hand it results as
DataFrames/Arrow tables and :meth:`Store.write` inserts them in one transaction, so a
crash mid-write leaves nothing half-written. A new store is built next to its final path
and renamed into place, so an interrupted seed never leaves a half-seeded file.

Token rows live in the table ``token_rows`` and, for bulk imports, in Parquet shards in the
folder ``<store file>.shards/`` beside the file (``token_shards`` lists them); the view
``tokens`` reads both. The folder belongs to the store: move or copy them together.
"""
from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa

from studio.store import lake, local, schema
from studio.store.errors import QueryTimeout as QueryTimeout
from studio.store.errors import StoreError, WriteConflict
from studio.store.owner import OWNER, owner_gone
from studio.store.reads import Reads
from studio.store.token_view import STRAY_SHARD_AGE_S as STRAY_SHARD_AGE_S
from studio.store.token_view import TokenView
from studio.store.verdicts import fill_verdicts
from studio.store.writelock import WriteLock


def default_query_timeout() -> float:
    """Seconds a read may run: ``$ROLLOUT_STUDIO_QUERY_TIMEOUT`` or 30 (0 disables)."""
    return float(os.environ.get("ROLLOUT_STUDIO_QUERY_TIMEOUT", "30"))


def default_db_path() -> Path | str:
    """``$ROLLOUT_STUDIO_DB`` (a file, a shared store's folder, or a team catalog's URL, kept as it is)
    or ``~/.local/share/rollout-studio/studio.duckdb``."""
    env = os.environ.get("ROLLOUT_STUDIO_DB")
    if env:
        return env if "://" in env else Path(env).expanduser()
    return _data_home() / "studio.duckdb"


def _data_home() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share")) / "rollout-studio"




WRITE_RETRIES = 5  # times Store.write runs again after a WriteConflict


def exists(path: str | Path) -> bool:
    """True when there is a store (a file, a shared store's folder, a team catalog's URL) at ``path``."""
    if str(path) == ":memory:" or lake.is_shared(path):
        return True
    try:
        return Path(path).expanduser().exists()
    except RuntimeError as exc:  # "~user/..." for a user that does not exist
        raise StoreError(f"cannot open {path}: {exc}") from None


class Store(Reads, TokenView):
    """A rollout store: one DuckDB file, ``:memory:``, or a shared DuckLake.

    Use :meth:`open` rather than the constructor: it creates, seeds and checks the schema.
    ``kind`` is ``"memory"``, ``"file"`` or ``"shared"``.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, path: str, kind: str = "file",
                 spec: lake.LakeSpec | None = None, mirror: bool = True):
        self._con = con
        self.path = path
        self.kind = "memory" if path == ":memory:" else kind
        self.spec = spec
        self._write_lock = threading.Lock()
        # across processes too, where the catalog is a SQLite file (studio.store.writelock)
        self._file_lock = WriteLock(path) if spec is not None and spec.catalog.startswith("sqlite:") else None
        self._sharded = False  # the store lists token shards (see tokens_between)
        self._init_reads(mirror and self.kind == "shared")
        self._column_order: dict[str, list[str]] = {}  # table -> its columns as stored (Store.write)
        self.query_timeout_s = default_query_timeout()

    @property
    def shared(self) -> bool:
        return self.kind == "shared"

    @property
    def home(self) -> Path:
        """The local folder where the studio keeps what belongs beside this store (mini-run
        checkpoints, uploads): the file's folder, a shared store's own folder, or for a team
        catalog named by URL the folder of the embedded default."""
        if self.kind == "memory" or self.path.startswith(("postgresql://", "postgres://")):
            return _data_home()
        return Path(self.path) if self.shared else Path(self.path).expanduser().resolve().parent

    def describe(self) -> str:
        """One line: the kind of store and where it is (no credentials)."""
        if not self.shared:
            return "in memory" if self.kind == "memory" else f"file {self.path}"
        return f"shared store {self.path} (catalog {self.spec.catalog.split(':')[0]}, data {self.spec.data_path or 'kept by the catalog'})"

    # -- opening -------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path = ":memory:", seed_dir: str | Path | Sequence[str | Path] | None = None,
             mirror: bool = True) -> Store:
        """Open ``path``, creating it (seeded from the Parquet files of ``seed_dir``, a folder or
        several, in order) if missing.

        A shared store's reads go through a local mirror of its tables (``studio.store.mirror``),
        made on the first read; ``mirror=False`` reads the lake itself (a command that reads little).

        Raises:
            StoreError: the file is not a DuckDB file, is locked by another process, or was
                written by a newer version of the studio. The file is left untouched.
        """
        if lake.is_shared(path):
            return cls._open_shared(path, seed_dir, mirror)
        if str(path) == ":memory:":
            store = cls(duckdb.connect(":memory:"), ":memory:")
            store._create()
            for folder in _folders(seed_dir):
                store.seed(folder)
            store.define_tasks()
            return store
        path = Path(path).expanduser()
        if not path.exists():
            cls._build(path, seed_dir)
        con = local.connect(path)
        store = cls(con, str(path))
        try:
            store._check_and_migrate()
            store._check_shards()
            store._close_interrupted_runs()
            store.define_tasks()
        except Exception:
            con.close()
            raise
        return store

    @classmethod
    def open_existing(cls, path: str | Path, mirror: bool = True) -> Store:
        """Open a store that must already exist: commands that read or change stored rollouts
        (curation, rules, enrich) must not create an empty store at a mistyped path.

        Raises:
            StoreError: there is no store at ``path``, or :meth:`open` refuses it.
        """
        if not exists(path):
            raise StoreError(f"there is no studio store at {path}; give the path of one with --db")
        return cls.open(path, mirror=mirror)

    @classmethod
    def _build(cls, path: Path, seed_dir: str | Path | Sequence[str | Path] | None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.building-{os.getpid()}")
        tmp.unlink(missing_ok=True)
        con = duckdb.connect(str(tmp))
        try:
            store = cls(con, str(tmp))
            store._create()
            for folder in _folders(seed_dir):
                store.seed(folder)
            con.execute("CHECKPOINT")
        finally:
            con.close()
        tmp.replace(path)

    def _create(self, cur: duckdb.DuckDBPyConnection | None = None) -> None:
        if cur is None:
            with self.transaction() as c:
                return self._create(c)
        for stmt in schema.ddl(shared=self.shared):
            cur.execute(stmt)
        cur.execute("INSERT INTO meta VALUES ('schema_version', ?)", [str(schema.SCHEMA_VERSION)])

    @classmethod
    def _open_shared(cls, path: str | Path, seed_dir, mirror: bool = True) -> Store:
        """Open the shared store at ``path``; make its tables (seeded from ``seed_dir``) when its catalog has none."""
        spec = lake.spec_of(path)
        con = lake.connect(spec)
        store = cls(con, spec.name, kind="shared", spec=spec, mirror=mirror)
        try:
            store._check_data_files()
            fresh = store._no_tables(store._con)  # a read: opening never waits for another process's write
            if fresh:
                with store.transaction() as cur:  # under the write lock: two first opens make the tables once
                    fresh = store._no_tables(cur)
                    if fresh:  # (options first: they apply to the data files written after them)
                        cur.execute(f"CALL {lake.LAKE}.set_option('parquet_row_group_size', {lake.ROW_GROUP_ROWS})")
                        store._create(cur)
            if fresh:
                store._tokens_in_files()  # (a table's own option: once the table is committed)
                for folder in _folders(seed_dir):
                    store.seed(folder)
            store._check_and_migrate()
            store._tokens_in_files()  # a store made before the option was
            store._close_interrupted_runs()
            store.define_tasks()
        except duckdb.Error as exc:
            con.close()
            raise StoreError(lake.explain(spec, exc)) from None
        except BaseException:
            con.close()
            raise
        return store

    def _tokens_in_files(self) -> None:
        """Token rows always in a shared store's data files, never kept in its catalog (the mirror reads a
        rollout's tokens from their file, :meth:`tokens_between`): the table's inlining limit set to 0
        where it is not, and rows an older store kept in the catalog written out to a file, once."""
        if lake.token_inlining(self._con) in ("0", None):  # (None: no token table yet)
            return
        with self.transaction() as cur:
            cur.execute(f"CALL {lake.LAKE}.set_option('data_inlining_row_limit', 0, table_name => '{schema.TOKEN_ROWS}')")
        with self.transaction() as cur:  # counted, not fetched (see upkeep.compact)
            cur.execute(f"SELECT count(*) FROM ducklake_flush_inlined_data('{lake.LAKE}', "
                        f"table_name => '{schema.TOKEN_ROWS}')").fetchall()

    @staticmethod
    def _no_tables(cur: duckdb.DuckDBPyConnection) -> bool:
        return not cur.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = ?",
                               [lake.LAKE]).fetchall()[0][0]

    def _check_data_files(self) -> None:
        """Every Parquet file a shared store's catalog lists must be in its data folder (object
        storage is not listed file by file: a missing object fails the read that needs it)."""
        missing, total, base = lake.missing_data_files(self._con, self.spec)
        if missing:
            table, first = missing[0]
            raise StoreError(
                f"shared store {self.path}: {len(missing)} of its {total} data files are missing from "
                f"{base} (first: {first}, of table {table}). Restore the data folder (or point the store's "
                f"{lake.MARKER} at where it is now); nothing was changed.")

    def schema_version(self, cur: duckdb.DuckDBPyConnection) -> int:
        """The schema version the store records (0: none recorded), read through ``cur``.

        Raises:
            StoreError: the database is not a Rollout Studio store (no ``meta`` table).
        """
        try:
            # fetchall, not fetchone: an unfinished result keeps the connection's transaction open, and
            # then DuckDB can never checkpoint (the WAL grows, CHECKPOINT fails while the store is open)
            rows = cur.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall()
        except duckdb.CatalogException:
            what = "a shared store's catalog" if self.shared else "a DuckDB file"
            raise StoreError(
                f"{self.path} is {what} but not a Rollout Studio store (no meta table); "
                "give a new path with --db, and the studio will create one there") from None
        return int(rows[0][0]) if rows else 0

    def _check_and_migrate(self) -> None:
        version = self.schema_version(self._con)
        if version > schema.SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} was written by a newer Rollout Studio (schema {version}); this "
                f"version reads schema {schema.SCHEMA_VERSION} and older. Upgrade rollout-studio "
                "to open it; the store was not changed.")
        if version == schema.SCHEMA_VERSION:
            return
        try:
            with self.transaction() as cur:
                version = self.schema_version(cur)  # again, under the write lock: another process may have migrated it
                if version < schema.SCHEMA_VERSION:
                    self._migrate(cur, version)
        except duckdb.TransactionException as exc:  # a shared store another process migrated at the same moment
            if not self.shared or self.schema_version(self._con) != schema.SCHEMA_VERSION:
                raise StoreError(f"{self.path}: the migration from schema {version} to {schema.SCHEMA_VERSION} "
                                 f"failed ({str(exc).splitlines()[0]}); the store was not changed. Open it again.") from None

    def _migrate(self, cur: duckdb.DuckDBPyConnection, version: int) -> None:
        for v in range(version + 1, schema.SCHEMA_VERSION + 1):
            for stmt in schema.MIGRATIONS.get(v, []):
                cur.execute(stmt)
        for stmt in schema.ddl(shared=self.shared):
            cur.execute(stmt)
        if version < 8:  # correctness became a column: what SQL could not backfill (schema.MIGRATIONS[8])
            fill_verdicts(cur)
        if version < 9:  # every stored rollout is one assistant turn
            cur.execute(schema.SINGLE_TURN)
        if version < 10:  # the tokens view gains the columns token_rows gained (turn and mask, train_logprob)
            self.refresh_tokens_view(cur)
        if self.shared:  # no primary key to replace on
            cur.execute("DELETE FROM meta WHERE key = 'schema_version'")
            cur.execute("INSERT INTO meta VALUES ('schema_version', ?)", [str(schema.SCHEMA_VERSION)])
        else:
            cur.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", [str(schema.SCHEMA_VERSION)])

    def _close_interrupted_runs(self) -> None:
        """Runs still 'running' when the store is opened were cut off (a killed owner). A file
        opens in one process at a time, so nobody else can be writing them now; in a shared store
        only the runs whose owner ran on this machine and is gone are."""
        if not self.shared:
            with self.transaction() as cur:
                cur.execute("UPDATE runs SET status = 'interrupted' WHERE status = 'running'")
            return
        running = self._con.execute("SELECT run_id, owner FROM runs WHERE status = 'running'").fetchall()
        gone = [run_id for run_id, owner in running if owner_gone(owner)]
        if gone:
            with self.transaction() as cur:
                cur.execute("UPDATE runs SET status = 'interrupted' WHERE status = 'running' "
                            "AND list_contains(?::VARCHAR[], run_id)", [gone])

    def define_tasks(self) -> list[str]:
        """Make the tasks this store defines known to this process (``studio.tasks.define``):
        a task never exists only in the process that added it."""
        from studio.tasks import define

        rows = self.cursor().execute("SELECT spec FROM tasks ORDER BY name").fetchall()
        return [define(json.loads(spec)).name for (spec,) in rows]

    def seed(self, folder: str | Path) -> None:
        """Load ``<table>.parquet`` files from ``folder`` into the matching tables, atomically; then each
        seeded rollout's ``answer`` and ``correct`` from its task (:func:`~studio.store.verdicts.fill_verdicts`) where the files
        do not carry them."""
        folder = Path(folder)
        with self.transaction() as cur:
            for table in schema.SEEDED:
                f = folder / f"{table}.parquet"
                if f.exists():
                    # by name: files written before a column existed leave it NULL; a rule version is
                    # named by its source's hash, so two seeds scored by one built-in rule share its row
                    if table == "rule_versions":
                        self._insert_new(cur, table, "SELECT * FROM read_parquet(?)", [str(f)])
                    else:
                        cur.execute(f"INSERT INTO {schema.physical(table)} BY NAME SELECT * FROM read_parquet(?)",
                                    [str(f)])
            cur.execute(schema.SINGLE_TURN)
            fill_verdicts(cur)

    def close(self) -> None:
        self._close_readers()
        self._close_mirror()
        self._con.close()

    # -- reading -------------------------------------------------------------------------
    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A cursor of the store's connection: use one per call, from any thread."""
        cur = self._con.cursor()
        return lake.use(cur) if self.shared else cur

    def change_mark(self) -> int:
        """A number that changes when another process commits to this store (a shared store's
        latest snapshot not made by this process; 0 for a file store, which no other process can
        change while it is open). Served pages poll it to pick up other processes' rows."""
        if not self.shared:
            return 0
        # the catalog's snapshots themselves: a served page's poll does not wait for the mirror to copy them
        rows = self._read(f"SELECT coalesce(max(snapshot_id), 0) FROM {lake.LAKE}.snapshots() "
                          "WHERE author IS DISTINCT FROM ?", [OWNER], None, lambda cur: cur.fetchall(), current=False)
        return int(rows[0][0] or 0)

    # -- writing -------------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A cursor inside BEGIN/COMMIT; any exception rolls everything back.

        A shared store's commit fails with :class:`WriteConflict` when another process committed a
        change to a table this transaction changed (a PostgreSQL catalog; inserts never conflict).

        On a shared store the commit names this process as its author (:meth:`change_mark`), and
        where the catalog is a SQLite file the transaction holds the store's write lock.

        Raises:
            StoreError: another process kept the write lock past ``$ROLLOUT_STUDIO_WRITE_WAIT``.
        """
        with self._write_lock:
            if self._file_lock is not None:
                try:
                    self._file_lock.acquire()
                except TimeoutError as exc:
                    raise StoreError(f"shared store {self.path}: {exc}; nothing was written. Try again when it "
                                     "is done, or raise ROLLOUT_STUDIO_WRITE_WAIT.") from None
            try:
                cur = self.cursor()
                cur.execute("BEGIN TRANSACTION")
                try:
                    yield cur
                    if self.shared:
                        cur.execute(f"CALL {lake.LAKE}.set_commit_message(?, 'rollout-studio')", [OWNER])
                except BaseException:
                    cur.execute("ROLLBACK")
                    raise
                else:
                    try:
                        cur.execute("COMMIT")
                        self._written()
                    except duckdb.TransactionException as exc:
                        if not self.shared or "conflict" not in str(exc).lower():
                            raise
                        raise WriteConflict(
                            f"shared store {self.path}: another process changed the same table while this write "
                            f"ran, so nothing was written ({str(exc).splitlines()[0][:200]}). Try again.") from None
            finally:
                if self._file_lock is not None:
                    self._file_lock.release()

    def write(self, frames: dict[str, pd.DataFrame], cur: duckdb.DuckDBPyConnection | None = None) -> None:
        """Insert DataFrames (or Arrow tables) into their tables in one transaction.

        Columns are matched by name; columns a frame lacks are NULL. ``tokens`` rows go into the
        table ``token_rows`` (the view ``tokens`` reads them).
        """
        if cur is None:
            for attempt in range(WRITE_RETRIES + 1):
                try:
                    with self.transaction() as c:
                        return self.write(frames, c)
                except WriteConflict:  # nothing was written: the same rows again, on the new snapshot
                    if attempt == WRITE_RETRIES:
                        raise
                    time.sleep(0.05 * 2 ** attempt)
        for i, (table, frame) in enumerate(frames.items()):
            if table not in schema.TABLES:
                raise StoreError(f"unknown table {table!r}")
            if len(frame) == 0:
                continue
            known = schema.columns(table)
            names = list(frame.column_names) if isinstance(frame, pa.Table) else list(frame.columns)
            extra = [c for c in names if c not in known]
            if extra:
                raise StoreError(f"table {table!r} has no columns {extra}")
            if table == "runs" and "owner" not in names:  # whose run it is (a shared store's open reads it)
                frame = _with_column(frame, "owner", OWNER)
                names.append("owner")
            if table not in ("prompts", "rule_versions"):
                # a relation, not a registered view: DuckDB 1.5 keeps a view's frame until the transaction
                # ends, so a large import's batches would all stay in memory
                rel = cur.from_arrow(frame) if isinstance(frame, pa.Table) else cur.from_df(frame)
                order = self._columns_of(cur, schema.physical(table))
                rel.select(", ".join(c if c in names else f"NULL AS {c}" for c in order)).insert_into(
                    schema.physical(table))
                continue
            view = f"_incoming_{i}"  # shared by content hash: a second insert is a no-op
            cur.register(view, frame)
            try:
                cols = ", ".join(names)
                self._insert_new(cur, table, f"SELECT {cols} FROM {view}", [], cols)
            finally:
                cur.unregister(view)

    def _columns_of(self, cur: duckdb.DuckDBPyConnection, table: str) -> list[str]:
        """``table``'s columns in the order the store holds them (a migrated store appends new ones)."""
        if table not in self._column_order:
            self._column_order[table] = [r[0] for r in cur.execute(
                "SELECT column_name FROM duckdb_columns() WHERE database_name = current_database() "
                "AND schema_name = current_schema() AND table_name = ? ORDER BY column_index", [table]).fetchall()]
        return self._column_order[table]

    def _insert_new(self, cur: duckdb.DuckDBPyConnection, table: str, select: str, params: list,
                    cols: str | None = None) -> None:
        """Insert the rows of ``select`` whose key ``table`` does not hold yet (its first column:
        ``prompt_id``, ``rule_version_id``), by name when ``cols`` is None. A file store's primary key
        does it; a shared store has none, so the rows already there (and repeats) are left out."""
        into = f"{table} ({cols})" if cols else f"{table} BY NAME"
        if not self.shared:
            cur.execute(f"INSERT OR IGNORE INTO {into} {select}", params)
            return
        key = schema.columns(table)[0]
        cur.execute(f"""INSERT INTO {into} SELECT * EXCLUDE (_n) FROM (
                            SELECT *, row_number() OVER (PARTITION BY {key}) AS _n FROM ({select}))
                        WHERE _n = 1 AND {key} NOT IN (SELECT {key} FROM {table})""", params)

    def counts(self) -> dict[str, int]:
        return {t: self.scalar(f"SELECT count(*) FROM {t}") for t in ("runs", "prompts", "rollouts", "tokens")}


def _folders(seed_dir: str | Path | Sequence[str | Path] | None) -> list[Path]:
    """The seed folders ``seed_dir`` names (one, several, or none); a missing one is skipped."""
    if seed_dir is None:
        return []
    many = [seed_dir] if isinstance(seed_dir, (str, Path)) else list(seed_dir)
    return [Path(f) for f in many if Path(f).is_dir()]


def _with_column(frame, name: str, value: str):
    """``frame`` (a DataFrame or an Arrow table) with a constant column ``name`` added."""
    if isinstance(frame, pa.Table):
        return frame.append_column(name, pa.array([value] * frame.num_rows, pa.string()))
    return frame.assign(**{name: value})

