"""A shared store's read mirror: its tables but the per-token ones, copied into a local DuckDB file and
kept at the catalog's latest snapshot.

DuckLake reads its catalog on every query (the snapshot, the table's data files and their
statistics): 5-10 ms a query with a SQLite catalog before any data is read, where a file store
answers a point read in under one. A token-strip click makes five point reads, a page of the
served studio dozens. The mirror keeps the tables those reads touch (rollouts, rewards, prompts,
runs, ...) in a DuckDB file of this process's own, in a temporary folder deleted on close; the
per-token tables (:data:`PER_TOKEN`, billions of rows in a real run) stay in the lake and the
mirror holds views of them, so a query reads both without naming either. For a rollout's tokens
the mirror also lists the token table's data files with the ids each holds
(:meth:`Mirror.token_source`): the one file that can hold a rollout is read directly.

Before each read :meth:`Mirror.current` compares the catalog's latest snapshot with the
mirror's and applies what the snapshots between say changed (``ducklake_snapshot_changes``):
the rows inserted since (``ducklake_table_insertions``); where rows were deleted or updated
(``ducklake_table_deletions``), the rows of those rollouts (runs, pairs, ...) replaced by the
lake's; everything copied again where a table was created, altered or dropped (a migration).
Reads wait while one thread applies a commit (an import of 400,000 rollouts: about 3 s), so a
read never sees a snapshot older than one committed before it began. Where the
catalog is a SQLite file the check is two file stats (the catalog is asked through DuckDB only
when they changed); a PostgreSQL catalog is asked at most every :data:`PG_CHECK_S` seconds, and
at once after this process's own commit (:meth:`Mirror.stale`).
Writes never go through the mirror: they run on the lake.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import duckdb

from studio.store import lake, schema
from studio.store.owner import OWNER, owner_gone

PREFIX = "rollout-studio-mirror-"  # a mirror's folder in the temporary directory: PREFIX<pid>-<random>
PER_TOKEN = ("token_rows", "token_scores")  # read in the lake, through views
MIRROR = "mirror"  # the attached database's name
META = f"__ducklake_metadata_{lake.LAKE}"  # DuckLake's own name for the attached catalog
RECENT_NS = 100_000_000  # a catalog file changed within 0.1 s: asked again (see Mirror._latest)
PG_CHECK_S = 0.5  # how stale another process's commit may be seen through a PostgreSQL catalog
INSERTS = frozenset({"inserted_into_table", "inlined_insert"})  # rows added: copied as they are
DELETES = frozenset({"deleted_from_table", "inlined_delete"})  # rows gone or updated: replaced
GROUPS = ("pair_id", "rollout_id", "run_id", "build_id", "export_id")  # see _group_of
REPLACE_SHARE = 0.25  # changes reaching more of a table's rows than this: the table copied again
LISTED = 1_000  # up to this many changed ids are named in the replacing query (see Mirror._replace)
QUIET = frozenset({"inline_flush", "merge_adjacent"})  # `store compact`: the same rows, in other files


class Mirror:
    """The mirror of one shared store's connection (see the module)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, spec: lake.LakeSpec):
        self._con = con
        _remove_orphans()
        self._dir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
        con.execute(f"ATTACH {lake._lit(str(self._dir / 'mirror.duckdb'))} AS {MIRROR}")
        self._lock = threading.Lock()
        self.snapshot = -1  # the catalog's snapshot the mirror holds (-1: nothing yet)
        self._writes = 0  # this process's commits (stale), and how many of them the mirror holds
        self._synced_writes = 0
        self._checked = 0.0
        self._sqlite: Path | None = None  # a SQLite catalog's file, whose stamps say when it changed
        self._seen: tuple = ()  # the SQLite catalog's files as last looked at (see _latest)
        self._latest_seen = -1
        self._token_files: list[tuple[str, str, str]] | None = None  # (path, first id, last id) at snapshot
        if spec.catalog.startswith("sqlite:"):
            self._sqlite = Path(spec.catalog[len("sqlite:"):]).resolve()

    def stale(self) -> None:
        """This process committed: its next read waits until the mirror holds the commit."""
        self._writes += 1

    def current(self) -> None:
        """Bring the mirror to the catalog's latest snapshot, where it is behind (every read first:
        a read sees every commit made before it; reads wait while another thread applies one)."""
        writes = self._writes
        own = writes != self._synced_writes
        if self._sqlite is None and not own and time.monotonic() - self._checked < PG_CHECK_S:
            return
        if self._latest() != self.snapshot:
            with self._lock:
                if self._latest() != self.snapshot:
                    self._sync()
        self._synced_writes = max(self._synced_writes, writes)
        self._checked = time.monotonic()

    def close(self) -> None:
        try:
            self._con.execute(f"DETACH {MIRROR}")
        except duckdb.Error:
            pass  # the connection is closing: its file goes with the folder
        shutil.rmtree(self._dir, ignore_errors=True)

    # -- syncing -------------------------------------------------------------------------
    def _latest(self) -> int:
        if self._sqlite is not None:
            # every commit writes the catalog's WAL file: unchanged files (a stat each), the same snapshot
            # (an empty WAL holds no commit); a file written in the last moments may be written again
            # within its clock's tick (the same time, and the same size where the WAL restarted): only
            # an older stamp is trusted. The catalog is never opened here but through DuckDB: a second
            # SQLite library in the process would release DuckDB's locks on the file when it closed it.
            wal = _stamp(self._sqlite.with_name(self._sqlite.name + "-wal"))
            seen = (_stamp(self._sqlite), wal if wal and wal[1] else None)
            recent = any(st is not None and time.time_ns() - st[0] < RECENT_NS for st in seen)
            if seen != self._seen or recent:
                self._latest_seen = self._ask()
                self._seen = seen
            return self._latest_seen
        return self._ask()

    def _ask(self) -> int:
        """The catalog's latest snapshot, read on a cursor of its own (a reader's may hold an older one)."""
        cur = self._con.cursor()
        try:
            return int(cur.execute(f"SELECT max(snapshot_id) FROM {META}.ducklake_snapshot").fetchall()[0][0])
        finally:
            cur.close()

    def _sync(self) -> None:
        cur = self._con.cursor()
        try:
            cur.execute("BEGIN TRANSACTION")
            # the transaction's own snapshot (the latest, or one committed since the check): all of it, at once
            target = int(cur.execute(f"SELECT id FROM {lake.LAKE}.current_snapshot()").fetchone()[0])
            plan = self._plan(cur, target) if self.snapshot >= 0 else None
            if plan is None:
                self._rebuild(cur, target)
            else:
                inserted, reloaded = plan
                for table in reloaded:
                    self._replace(cur, table, target)
                for table in inserted - reloaded:
                    cur.execute(f"INSERT INTO {MIRROR}.main.{table} SELECT * FROM ducklake_table_insertions("
                                f"'{lake.LAKE}', 'main', '{table}', {self.snapshot + 1}, {target})")
            files = self._token_files_at(cur, target)
            cur.execute("COMMIT")
            self.snapshot, self._token_files = target, files
        except BaseException:
            try:
                cur.execute("ROLLBACK")
            except duckdb.Error:
                pass
            raise
        finally:
            cur.close()

    # -- the per-token tables' data files ------------------------------------------------
    def token_source(self, lo: str, hi: str) -> str | None:
        """SQL reading the token rows of rollout ids ``lo``..``hi`` at the mirror's snapshot straight
        from the data files whose ids can hold them (a Parquet read: no DuckLake planning, ~4 ms a
        query); None where the lake must read them (rows deleted or updated, rows kept in the
        catalog, a file without a column of today's schema)."""
        files = self._token_files
        if files is None:
            return None
        paths = [path for path, first, last in files if first <= hi and last >= lo]
        if not paths:
            return None
        cols = ", ".join(schema.columns("tokens"))
        listed = ", ".join(lake._lit(p) for p in paths)
        return f"(SELECT {cols} FROM read_parquet([{listed}], union_by_name = true))"

    def _token_files_at(self, cur: duckdb.DuckDBPyConnection, target: int) -> list[tuple[str, str, str]] | None:
        """``token_rows``' data files at snapshot ``target`` with the first and last rollout id each
        holds (the catalog's statistics of the file), or None where they are not the whole table (see
        :meth:`token_source`)."""
        try:
            rows = cur.execute(f"SELECT data_file, delete_file FROM ducklake_list_files('{lake.LAKE}', "
                               f"'{schema.TOKEN_ROWS}', snapshot_version => {target})").fetchall()
        except duckdb.CatalogException:  # (no such table yet)
            return None
        if any(deletes is not None for _, deletes in rows) or self._inlined_tokens(cur, target):
            return None
        ranges = self._token_ranges(cur, target)
        out = []
        for path, _ in rows:
            got = ranges.get(path.rsplit("/", 1)[-1])  # (the catalog keeps a file's name, the list its whole path)
            if got is None:
                return None
            out.append((path, *got))
        return out

    def _token_ranges(self, cur: duckdb.DuckDBPyConnection, target: int) -> dict[str, tuple[str, str]]:
        """Each ``token_rows`` data file's name at snapshot ``target`` with its least and greatest
        rollout id, from the catalog's statistics (a Parquet footer read: 10 ms a file). A file written
        before the table's newest column was added is left out: read by name, it would give that
        column as NULL (or as a dropped column's values), where the lake gives its default."""
        def alive(x: str) -> str:
            return f"{x}.begin_snapshot <= {target} AND ({x}.end_snapshot IS NULL OR {x}.end_snapshot > {target})"

        columns = f"""{META}.ducklake_table t JOIN {META}.ducklake_column c ON c.table_id = t.table_id
                      AND t.table_name = '{schema.TOKEN_ROWS}' AND {alive('t')} AND {alive('c')}"""
        newest = cur.execute(f"SELECT max(c.begin_snapshot) FROM {columns}").fetchall()[0][0]
        rows = cur.execute(
            f"""SELECT f.path, s.min_value, s.max_value FROM {columns} AND c.column_name = 'rollout_id'
                JOIN {META}.ducklake_data_file f ON f.table_id = t.table_id AND {alive('f')}
                JOIN {META}.ducklake_file_column_stats s ON s.data_file_id = f.data_file_id AND s.column_id = c.column_id
                WHERE f.begin_snapshot >= ? AND s.min_value IS NOT NULL AND s.max_value IS NOT NULL""",
            [newest]).fetchall()
        return {path.rsplit("/", 1)[-1]: (lo, hi) for path, lo, hi in rows}

    def _inlined_tokens(self, cur: duckdb.DuckDBPyConnection, target: int) -> bool:
        """Whether token rows are kept in the catalog at snapshot ``target`` (a write of under
        ``DATA_INLINING_ROW_LIMIT`` rows in a store made before token rows were never inlined)."""
        tables = cur.execute(
            f"""SELECT i.table_name FROM {META}.ducklake_inlined_data_tables i
                JOIN {META}.ducklake_table t USING (table_id)
                WHERE t.table_name = ? AND t.begin_snapshot <= ? AND (t.end_snapshot IS NULL OR t.end_snapshot > ?)""",
            [schema.TOKEN_ROWS, target, target]).fetchall()
        return any(cur.execute(f"SELECT count(*) FROM {META}.{name} WHERE begin_snapshot <= ? AND "
                               "(end_snapshot IS NULL OR end_snapshot > ?)", [target, target]).fetchall()[0][0]
                   for (name,) in tables)

    def _plan(self, cur: duckdb.DuckDBPyConnection, target: int) -> tuple[set[str], set[str]] | None:
        """The mirrored tables with rows inserted, and those to copy again, between the mirror's
        snapshot and ``target``; None where everything is copied again (the schema changed)."""
        versions = cur.execute(f"SELECT DISTINCT schema_version FROM {META}.ducklake_snapshot "
                               "WHERE snapshot_id IN (?, ?)", [self.snapshot, target]).fetchall()
        if len(versions) != 1:
            return None
        names = dict(cur.execute(f"SELECT table_id, table_name FROM {META}.ducklake_table "
                                 "WHERE end_snapshot IS NULL").fetchall())
        inserted: set[str] = set()
        reloaded: set[str] = set()
        for (made,) in cur.execute(f"SELECT changes_made FROM {META}.ducklake_snapshot_changes "
                                   "WHERE snapshot_id > ? AND snapshot_id <= ?", [self.snapshot, target]).fetchall():
            for change in (made or "").split(","):
                kind, _, ident = change.partition(":")
                if not kind or kind in QUIET:
                    continue
                if kind not in INSERTS | DELETES or not ident.isdigit() or int(ident) not in names:
                    return None  # a table created, altered or dropped; a kind of change not known here
                table = names[int(ident)]
                if table not in PER_TOKEN:
                    (inserted if kind in INSERTS else reloaded).add(table)
        return inserted, reloaded

    def _replace(self, cur: duckdb.DuckDBPyConnection, table: str, target: int) -> None:
        """Bring the copy of ``table``, where rows were deleted or updated, to snapshot ``target``:
        every row sharing a changed row's :func:`group column <_group_of>` value is replaced by the
        lake's rows of that value (one rollout enriched: its row, not a million); the whole table is
        copied again where the changes reach more than :data:`REPLACE_SHARE` of it."""
        copy, at = f"{MIRROR}.main.{table}", f"{lake.LAKE}.main.{table} AT (VERSION => {target})"
        col = _group_of(table)
        if col is not None:
            span = f"'{lake.LAKE}', 'main', '{table}', {self.snapshot + 1}, {target}"
            changed = (f"(SELECT DISTINCT {col} FROM (SELECT {col} FROM ducklake_table_deletions({span}) "
                       f"UNION ALL SELECT {col} FROM ducklake_table_insertions({span})))")
            values = [v for (v,) in cur.execute(f"SELECT * FROM {changed}").fetchall()]
            held = cur.execute(f"SELECT count(*) FROM {copy}").fetchone()[0]
            if None not in values and len(values) <= REPLACE_SHARE * held:
                if len(values) <= LISTED and all(isinstance(v, str) for v in values):
                    # named in the query: the lake skips the files, the copy the row groups, that cannot hold
                    # them (by their min/max), where a subquery's values make both read every row (10x)
                    changed = f"({', '.join(lake._lit(v) for v in values)})"
                cur.execute(f"DELETE FROM {copy} WHERE {col} IN {changed}")
                cur.execute(f"INSERT INTO {copy} SELECT * FROM {at} WHERE {col} IN {changed}")
                return
        cur.execute(f"DROP TABLE {copy}")  # (made again with its index: faster than deleting every row)
        _copy(cur, table, target)

    def _rebuild(self, cur: duckdb.DuckDBPyConnection, target: int) -> None:
        for (name,) in cur.execute("SELECT view_name FROM duckdb_views() WHERE database_name = ? AND NOT internal",
                                   [MIRROR]).fetchall():
            cur.execute(f"DROP VIEW {MIRROR}.main.{name}")
        for (name,) in cur.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = ?",
                                   [MIRROR]).fetchall():
            cur.execute(f"DROP TABLE {MIRROR}.main.{name}")
        tables = [r[0] for r in cur.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = ? "
                                            "AND schema_name = 'main' ORDER BY 1", [lake.LAKE]).fetchall()]
        for table in tables:
            if table in PER_TOKEN:
                cur.execute(f"CREATE VIEW {MIRROR}.main.{table} AS SELECT * FROM {lake.LAKE}.main.{table}")
            else:
                _copy(cur, table, target)
        views = cur.execute("SELECT sql FROM duckdb_views() WHERE database_name = ? AND schema_name = 'main' "
                            "AND NOT internal", [lake.LAKE]).fetchall()
        cur.execute(f"USE {MIRROR}")  # a view's unqualified names read the mirror's tables
        for (sql,) in views:
            cur.execute(sql)


def _copy(cur: duckdb.DuckDBPyConnection, table: str, target: int) -> None:
    """Copy the lake's ``table`` at snapshot ``target`` into the mirror, sorted and indexed."""
    key = schema.key_of(table)
    # in the order of ids (made in time order, as later rows come): a read of one rollout's rows skips
    # every other row group by its min/max
    by = "rollout_id" if "rollout_id" in schema.columns(table) else key
    cur.execute(f"CREATE TABLE {MIRROR}.main.{table} AS SELECT * FROM {lake.LAKE}.main.{table} "
                f"AT (VERSION => {target})" + (f" ORDER BY {by}" if by else ""))
    if key:  # a point read by id, as fast as through a store file's primary key
        cur.execute(f"CREATE INDEX {table}_by_{key} ON {MIRROR}.main.{table} ({key})")


def _group_of(table: str) -> str | None:
    """The column whose values group ``table``'s rows for :meth:`Mirror._replace`: its key, else the
    id it hangs from (a pair, rollout, run, build or export); None where it has none (copied whole)."""
    columns = schema.columns(table)
    return schema.key_of(table) or next((c for c in GROUPS if c in columns), None)


def _stamp(path: Path) -> tuple[int, int] | None:
    """A file's modification time and size; None where it is not there (a WAL file comes and goes)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_size


def _remove_orphans() -> None:
    """Delete the mirror folders of processes of this machine that are gone (killed before closing)."""
    host = OWNER.rpartition(":")[0]
    for folder in Path(tempfile.gettempdir()).glob(f"{PREFIX}*-*"):
        pid = folder.name[len(PREFIX):].split("-")[0]
        if pid.isdigit() and owner_gone(f"{host}:{pid}"):
            shutil.rmtree(folder, ignore_errors=True)
