"""The DuckDB store: one owner process, parameterised SQL, a cursor per call.

The process that opens a :class:`Store` owns the file; workers hand it results as
DataFrames/Arrow tables and :meth:`Store.write` inserts them in one transaction, so a
crash mid-write leaves nothing half-written. A new store is built next to its final path
and renamed into place, so an interrupted seed never leaves a half-seeded file.

Token rows live in the table ``token_rows`` and, for bulk imports, in Parquet shards in the
folder ``<store file>.shards/`` beside the file (``token_shards`` lists them); the view
``tokens`` reads both. The folder belongs to the store: move or copy them together.
"""
from __future__ import annotations

import heapq
import json
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import pyarrow as pa

from studio.errors import NOT_DONE, StudioError
from studio.store import schema
from studio.store.verdicts import fill_verdicts

# a file in the shard folder that no shard lists is deleted on open once untouched this long: an
# import writing it touches it every row group, one killed before its commit never again
STRAY_SHARD_AGE_S = 600


class StoreError(StudioError, RuntimeError):
    """The store cannot be opened or written; the message says why and what to do."""


class QueryTimeout(StoreError):
    """A read ran past its time limit and was interrupted (the store is unchanged)."""

    exit_code = NOT_DONE


def default_query_timeout() -> float:
    """Seconds a read may run: ``$ROLLOUT_STUDIO_QUERY_TIMEOUT`` or 30 (0 disables)."""
    return float(os.environ.get("ROLLOUT_STUDIO_QUERY_TIMEOUT", "30"))


def default_db_path() -> Path:
    """``$ROLLOUT_STUDIO_DB`` or ``~/.local/share/rollout-studio/studio.duckdb``."""
    env = os.environ.get("ROLLOUT_STUDIO_DB")
    if env:
        return Path(env).expanduser()
    base = Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share"))
    return base / "rollout-studio" / "studio.duckdb"


class _Watchdog:
    """One thread that interrupts reads past their time limit (a timer thread per read cost
    ~10 ms to start on a busy machine: more than a page of the table takes to read)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int]] = []
        self._live: dict[int, Any] = {}  # token -> cursor of a read still running (released reads drop theirs)
        self._seq = 0
        self._thread: threading.Thread | None = None

    def watch(self, cursor, limit_s: float) -> int:
        with self._cond:
            self._seq += 1
            heapq.heappush(self._heap, (time.monotonic() + limit_s, self._seq))
            self._live[self._seq] = cursor
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="store-watchdog", daemon=True)
                self._thread.start()
            if self._heap[0][1] == self._seq:
                # the earliest deadline now: wake the thread to wait for it. Otherwise the thread already
                # wakes no later than this read's limit (a wake-up per read, hundreds a second under
                # load, made every page wait on this thread for the GIL)
                self._cond.notify()
            return self._seq

    def release(self, token: int) -> None:
        with self._cond:
            self._live.pop(token, None)

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][1] not in self._live:
                    heapq.heappop(self._heap)  # finished in time
                if not self._heap:
                    self._cond.wait()
                    continue
                deadline, token = self._heap[0]
                wait = deadline - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
                self._live.pop(token).interrupt()  # under the lock: release() cannot have run, the read is still going


_WATCHDOG = _Watchdog()


class Store:
    """A rollout store in one DuckDB file (or ``:memory:``).

    Use :meth:`open` rather than the constructor: it creates, seeds and checks the schema.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, path: str):
        self._con = con
        self.path = path
        self._write_lock = threading.Lock()
        self._sharded = False  # the store lists token shards (see tokens_between)
        self.query_timeout_s = default_query_timeout()

    # -- opening -------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path = ":memory:", seed_dir: str | Path | Sequence[str | Path] | None = None) -> Store:
        """Open ``path``, creating it (seeded from the Parquet files of ``seed_dir``, a folder or
        several, in order) if missing.

        Raises:
            StoreError: the file is not a DuckDB file, is locked by another process, or was
                written by a newer version of the studio. The file is left untouched.
        """
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
        con = _connect(path)
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
    def open_existing(cls, path: str | Path) -> Store:
        """Open a store that must already exist: commands that read or change stored rollouts
        (curation, rules, enrich) must not create an empty store at a mistyped path.

        Raises:
            StoreError: there is no store at ``path``, or :meth:`open` refuses it.
        """
        if str(path) != ":memory:" and not Path(path).expanduser().exists():
            raise StoreError(f"there is no studio store at {path}; give the path of one with --db")
        return cls.open(path)

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

    def _create(self) -> None:
        with self.transaction() as cur:
            for stmt in schema.ddl():
                cur.execute(stmt)
            cur.execute("INSERT INTO meta VALUES ('schema_version', ?)", [str(schema.SCHEMA_VERSION)])

    def _check_and_migrate(self) -> None:
        try:
            # fetchall, not fetchone: an unfinished result keeps the connection's transaction open, and
            # then DuckDB can never checkpoint (the WAL grows, CHECKPOINT fails while the store is open)
            rows = self._con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall()
            row = rows[0] if rows else None
        except duckdb.Error:
            raise StoreError(
                f"{self.path} is a DuckDB file but not a Rollout Studio store (no meta table); "
                "give a new path with --db, and the studio will create one there") from None
        version = int(row[0]) if row else 0
        if version > schema.SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} was written by a newer Rollout Studio (schema {version}); this "
                f"version reads schema {schema.SCHEMA_VERSION} and older. Upgrade rollout-studio "
                "to open it; the file was not changed.")
        if version < schema.SCHEMA_VERSION:
            with self.transaction() as cur:
                for v in range(version + 1, schema.SCHEMA_VERSION + 1):
                    for stmt in schema.MIGRATIONS.get(v, []):
                        cur.execute(stmt)
                for stmt in schema.ddl():
                    cur.execute(stmt)
                if version < 8:  # correctness became a column: what SQL could not backfill (schema.MIGRATIONS[8])
                    fill_verdicts(cur)
                if version < 9:  # every stored rollout is one assistant turn
                    cur.execute(schema.SINGLE_TURN)
                if version < 10:  # the tokens view gains the columns token_rows gained (turn and mask, train_logprob)
                    self.refresh_tokens_view(cur)
                cur.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", [str(schema.SCHEMA_VERSION)])

    # -- token shards --------------------------------------------------------------------
    @property
    def shard_dir(self) -> Path | None:
        """The folder of this store's token shards (None for an in-memory store: it writes none)."""
        return None if self.path == ":memory:" else Path(self.path).with_name(Path(self.path).name + ".shards")

    def shard_paths(self, cur: duckdb.DuckDBPyConnection | None = None) -> list[Path]:
        """The token shards the store reads, in the order they were written."""
        return [f for f, _ in self._shards(cur)]

    def _shards(self, cur=None, lo: str | None = None, hi: str | None = None) -> list[tuple[Path, list[str]]]:
        """``(path, columns)`` of the listed shards, in order; with ``lo``, ``hi``: only those whose id
        range meets ``lo``..``hi``."""
        if self.shard_dir is None:
            return []
        where, params = ("WHERE max_rollout_id >= ? AND min_rollout_id <= ?", [lo, hi]) if lo is not None else ("", [])
        rows = (cur or self._con).execute(
            f"SELECT file, columns FROM token_shards {where} ORDER BY created_at, shard_id", params).fetchall()
        return [(self.shard_dir / f, list(c or [])) for f, c in rows]

    @staticmethod
    def _tokens_sql(shards: list[tuple[Path, list[str]]], skip_moved: bool = True) -> str:
        """token_rows and ``shards`` as one ``tokens`` query (the shards' rows of moved rollouts left out)."""
        from studio.store.shards import union_sql

        sql = f"SELECT {', '.join(schema.columns('tokens'))} FROM {schema.TOKEN_ROWS}"
        if shards:
            parts = union_sql(shards)
            where = " WHERE rollout_id NOT IN (SELECT rollout_id FROM tokens_moved)" if skip_moved else ""
            sql += f" UNION ALL SELECT * FROM ({parts}){where}"
        return sql

    def refresh_tokens_view(self, cur: duckdb.DuckDBPyConnection) -> None:
        """(Re)write the ``tokens`` view over token_rows and the shards (inside the caller's transaction)."""
        shards = self._shards(cur)
        if shards:
            self._sharded = True  # (never reset: a stale True costs tokens_between one small query)
        moved = bool(shards) and cur.execute("SELECT count(*) FROM tokens_moved").fetchall()[0][0] > 0
        cur.execute(f"CREATE OR REPLACE VIEW tokens AS {self._tokens_sql(shards, skip_moved=moved)}")

    def tokens_between(self, lo: str, hi: str) -> str:
        """What to read ``tokens`` rows of rollout ids ``lo``..``hi`` from: ``tokens`` itself, or, when
        the store has shards, the same union with only the shards whose id range meets ``lo``..``hi``
        (``token_shards`` keeps each one's; none: the table alone), so a rollout's read opens at most
        the files that can hold it however many there are. The caller still filters on ``rollout_id``."""
        if not self._sharded:
            return "tokens"
        cur = self._con.cursor()  # its own: reads come from many threads
        try:
            shards = self._shards(cur, lo, hi)
        finally:
            cur.close()
        # (a shard is listed in the transaction that makes its rollouts visible: no race)
        return f"({self._tokens_sql(shards)})" if shards else schema.TOKEN_ROWS

    def unshard(self, rollout_ids: list[str], cur: duckdb.DuckDBPyConnection) -> int:
        """Copy the shard rows of ``rollout_ids`` into token_rows, where they can be changed, and stop
        reading them from their shards (``tokens_moved``). Returns how many rollouts moved."""
        if not rollout_ids:
            return 0
        lo, hi = min(rollout_ids), max(rollout_ids)  # the shards that can hold them; their row groups skip on it too
        shards = self._shards(cur, lo, hi)
        if not shards:
            return 0
        from studio.store.shards import union_sql

        parts = union_sql(shards)
        moving = [r[0] for r in cur.execute(
            f"""SELECT DISTINCT rollout_id FROM ({parts}) WHERE rollout_id BETWEEN ? AND ?
                AND list_contains(?::VARCHAR[], rollout_id)
                AND rollout_id NOT IN (SELECT rollout_id FROM tokens_moved)""", [lo, hi, rollout_ids]).fetchall()]
        if not moving:
            return 0
        cols = ", ".join(schema.columns("tokens"))
        cur.execute(f"""INSERT INTO {schema.TOKEN_ROWS} ({cols}) SELECT {cols} FROM ({parts})
                        WHERE rollout_id BETWEEN ? AND ? AND list_contains(?::VARCHAR[], rollout_id)
                        ORDER BY rollout_id, pos""", [min(moving), max(moving), moving])
        cur.execute("INSERT INTO tokens_moved SELECT unnest(?::VARCHAR[])", [moving])
        self.refresh_tokens_view(cur)
        return len(moving)

    def _check_shards(self) -> None:
        """Every listed shard must be there; files in the folder that no shard lists (an import cut
        off between writing its shard and committing) are deleted once untouched for
        ``STRAY_SHARD_AGE_S`` (the same process may have the store open twice, one of them
        importing). The view is rewritten with the folder's path as it is now (the store may have
        been moved)."""
        listed = self.shard_paths()
        self._sharded = bool(listed)
        missing = [f for f in listed if not f.is_file()]
        if missing:
            raise StoreError(
                f"{self.path} keeps token rows in {len(listed)} Parquet shard(s) in {self.shard_dir}, and "
                f"{len(missing)} of them are missing (first: {missing[0].name}). Move or copy the folder "
                "together with the store file; the store was not changed.")
        if self.shard_dir is not None and self.shard_dir.is_dir():
            keep = {f.name for f in listed}
            for f in self.shard_dir.iterdir():
                if f.is_file() and f.name not in keep and time.time() - f.stat().st_mtime > STRAY_SHARD_AGE_S:
                    f.unlink(missing_ok=True)
        if listed:
            with self.transaction() as cur:
                # only when it changed (a moved store): a second open in this process must not rewrite
                # the view under an import of the first, whose commit would then conflict on it
                have = cur.execute("SELECT sql FROM duckdb_views() WHERE view_name = 'tokens'").fetchall()
                if not have or not all(str(f).replace("'", "''") in have[0][0] for f in listed):
                    self.refresh_tokens_view(cur)

    def _close_interrupted_runs(self) -> None:
        """Runs still 'running' when the file is opened were cut off (a killed owner): DuckDB
        lets one process open the file, so nobody else can be writing them now."""
        with self.transaction() as cur:
            cur.execute("UPDATE runs SET status = 'interrupted' WHERE status = 'running'")

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
                    insert = "INSERT OR IGNORE" if table == "rule_versions" else "INSERT"
                    cur.execute(f"{insert} INTO {schema.physical(table)} BY NAME SELECT * FROM read_parquet(?)",
                                [str(f)])
            cur.execute(schema.SINGLE_TURN)
            fill_verdicts(cur)

    def close(self) -> None:
        self._con.close()

    # -- reading -------------------------------------------------------------------------
    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A cursor of the shared connection: use one per call, from any thread."""
        return self._con.cursor()

    def df(self, sql: str, params: list[Any] | dict | None = None, timeout_s: float | None = None) -> pd.DataFrame:
        """Run a parameterised read and return a DataFrame, within the time limit.

        Raises:
            QueryTimeout: the query ran longer than ``timeout_s`` (default
                :attr:`query_timeout_s`) and was interrupted.
        """
        return self._read(sql, params, timeout_s, lambda cur: cur.df())

    def scalar(self, sql: str, params: list[Any] | None = None, timeout_s: float | None = None) -> Any:
        row = self._read(sql, params, timeout_s, lambda cur: cur.fetchone())
        return row[0] if row else None

    def _read(self, sql, params, timeout_s, fetch):
        limit = self.query_timeout_s if timeout_s is None else timeout_s
        cur = self.cursor()
        token = _WATCHDOG.watch(cur, limit) if limit and limit > 0 else None
        try:
            return fetch(cur.execute(sql, params or []))
        except duckdb.InterruptException:
            raise QueryTimeout(
                f"the query was stopped after {limit:g} s (the time limit). Narrow the filter, or raise "
                "ROLLOUT_STUDIO_QUERY_TIMEOUT; nothing was changed.") from None
        finally:
            if token is not None:
                _WATCHDOG.release(token)
            # a result left unfinished (fetchone) keeps a transaction open and aborts the process when the
            # store closes before the cursor is collected (DuckDB 2): every read ends here
            cur.close()

    # -- writing -------------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A cursor inside BEGIN/COMMIT; any exception rolls everything back."""
        with self._write_lock:
            cur = self.cursor()
            cur.execute("BEGIN TRANSACTION")
            try:
                yield cur
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            else:
                cur.execute("COMMIT")

    def write(self, frames: dict[str, pd.DataFrame], cur: duckdb.DuckDBPyConnection | None = None) -> None:
        """Insert DataFrames (or Arrow tables) into their tables in one transaction.

        Columns are matched by name; columns a frame lacks are NULL. ``tokens`` rows go into the
        table ``token_rows`` (the view ``tokens`` reads them).
        """
        if cur is None:
            with self.transaction() as c:
                return self.write(frames, c)
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
            view = f"_incoming_{i}"
            cur.register(view, frame)
            try:
                cols = ", ".join(names)
                # prompts and rule versions are shared by content hash: a second insert is a no-op
                verb = "INSERT OR IGNORE" if table in ("prompts", "rule_versions") else "INSERT"
                cur.execute(f"{verb} INTO {schema.physical(table)} ({cols}) SELECT {cols} FROM {view}")
            finally:
                cur.unregister(view)

    def counts(self) -> dict[str, int]:
        return {t: self.scalar(f"SELECT count(*) FROM {t}") for t in ("runs", "prompts", "rollouts", "tokens")}


def _folders(seed_dir: str | Path | Sequence[str | Path] | None) -> list[Path]:
    """The seed folders ``seed_dir`` names (one, several, or none); a missing one is skipped."""
    if seed_dir is None:
        return []
    many = [seed_dir] if isinstance(seed_dir, (str, Path)) else list(seed_dir)
    return [Path(f) for f in many if Path(f).is_dir()]


def _connect(path: Path) -> duckdb.DuckDBPyConnection:
    try:
        con = duckdb.connect(str(path))
        con.execute("SET GLOBAL parquet_metadata_cache = true")  # the tokens view reads shard footers every query; GLOBAL: cursors too
        return con
    except duckdb.Error as exc:
        first = str(exc).splitlines()[0]
        if isinstance(exc, duckdb.IOException) and "lock" in first.lower():
            raise StoreError(
                f"{path} is open in another process (DuckDB allows one). Close the other studio "
                f"or CLI using it, or pass a different --db. ({first})") from None
        raise StoreError(
            f"{path} is not a readable DuckDB store ({first}). It may be corrupt, unreadable or not a "
            "DuckDB file; it was not changed. Pass another path with --db to start a fresh store.") from None
