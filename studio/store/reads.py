"""The store's reads: parameterised SQL to a DataFrame or a value, within a time limit.

A mixin of :class:`studio.store.Store` (its connection, kind and cursors). A read past its limit is
interrupted by the watchdog (``studio.store.watchdog``). On a shared store each thread keeps
its read cursor (a new cursor's ``USE lake`` would cost a catalog transaction per read), and reads
go through the store's mirror (``studio.store.mirror``), brought up to date first.
"""
from __future__ import annotations

import threading
from typing import Any

import duckdb
import pandas as pd

from studio.store import lake
from studio.store.errors import QueryTimeout, StoreError
from studio.store.mirror import MIRROR, Mirror
from studio.store.watchdog import _WATCHDOG


class Reads:
    """The read half of :class:`~studio.store.Store`."""

    def _init_reads(self, mirror: bool) -> None:
        self._mirror_wanted = mirror  # a shared store opened for reading through a mirror
        self._mirror: Mirror | None = None  # made on the first read (or by prepare)
        self._preparing: threading.Thread | None = None  # prepare's thread
        self._readers = threading.local()  # a shared store's read cursor per thread (see _reader)
        self._readers_lock = threading.Lock()
        self._reader_cursors: list[duckdb.DuckDBPyConnection] = []

    def df(self, sql: str, params: list[Any] | dict | None = None, timeout_s: float | None = None) -> pd.DataFrame:
        """Run a parameterised read and return a DataFrame, within the time limit.

        Raises:
            QueryTimeout: the query ran longer than ``timeout_s`` (default
                :attr:`query_timeout_s`) and was interrupted.
        """
        return self._read(sql, params, timeout_s, lambda cur: cur.df())

    def scalar(self, sql: str, params: list[Any] | None = None, timeout_s: float | None = None) -> Any:
        rows = self._read(sql, params, timeout_s, lambda cur: cur.fetchall())  # all: a read leaves no result open
        return rows[0][0] if rows else None

    def _read(self, sql, params, timeout_s, fetch, current: bool = True):
        """``sql`` on the calling thread's cursor; a shared store's mirror brought up to date first
        (``current``; a read of the lake's own catalog, e.g. its snapshots, needs no mirror)."""
        limit = self.query_timeout_s if timeout_s is None else timeout_s
        if current:
            self._mirror_current()
        # a read of the catalog itself on a cursor of its own: the thread's may hold a transaction (_reader)
        own = not self.shared or not current
        cur = self.cursor() if own else self._reader()
        token = _WATCHDOG.watch(cur, limit) if limit and limit > 0 else None
        try:
            return fetch(cur.execute(sql, params or []))
        except duckdb.IOException as exc:  # a shared store's catalog or data out of reach (an S3 server down...)
            if not self.shared:
                raise
            self._end_held(cur)
            raise StoreError(lake.explain(self.spec, exc)) from None
        except duckdb.InterruptException:
            self._drop_reader(cur)
            raise QueryTimeout(
                f"the query was stopped after {limit:g} s (the time limit). Narrow the filter, or raise "
                "ROLLOUT_STUDIO_QUERY_TIMEOUT; nothing was changed.") from None
        except duckdb.Error:  # (a failed query ends its transaction: the next read begins another)
            self._end_held(cur)
            raise
        finally:
            if token is not None:
                _WATCHDOG.release(token)
            # a result left unfinished keeps a transaction open and aborts the process when the store closes
            # before the cursor is collected (DuckDB 2): every read ends here, its result fetched whole
            if own:
                cur.close()

    def _reader(self) -> duckdb.DuckDBPyConnection:
        """A shared store's read cursor: the calling thread's own, kept (a new cursor's ``USE lake``
        costs a catalog transaction of its own). Through a mirror it holds one read transaction
        while the mirror stays at one snapshot, begun again when the mirror moves: DuckLake then
        reads its catalog once per snapshot, not per query (a point read of the per-token tables in
        the lake: 7 ms, not 11, at 100M token rows)."""
        cur = getattr(self._readers, "cur", None)
        if cur is None:
            cur = self._readers.cur = self.cursor()
            self._readers.mirrored = False
            self._readers.held = None  # the mirror's snapshot when the held transaction began
            with self._readers_lock:
                self._reader_cursors.append(cur)
        if self._mirror is not None:
            if not self._readers.mirrored:  # (a cursor may predate the mirror)
                cur.execute(f"USE {MIRROR}")
                self._readers.mirrored = True
            if self._readers.held != self._mirror.snapshot:
                if self._readers.held is not None:
                    cur.execute("COMMIT")  # (reads only: nothing to write)
                    self._readers.held = None
                cur.execute("BEGIN TRANSACTION")
                self._readers.held = self._mirror.snapshot
        return cur

    def _end_held(self, cur: duckdb.DuckDBPyConnection) -> None:
        """A read failed inside the thread's held transaction: end it (the next read begins another)."""
        if getattr(self._readers, "cur", None) is cur and getattr(self._readers, "held", None) is not None:
            self._readers.held = None
            try:
                cur.execute("ROLLBACK")
            except duckdb.Error:
                self._drop_reader(cur)

    def _drop_reader(self, cur: duckdb.DuckDBPyConnection) -> None:
        if self.shared and getattr(self._readers, "cur", None) is cur:
            self._readers.cur = None
            with self._readers_lock:
                self._reader_cursors.remove(cur)
            cur.close()

    def _close_readers(self) -> None:
        with self._readers_lock:
            for cur in self._reader_cursors:
                cur.close()
            self._reader_cursors.clear()

    # -- the mirror ----------------------------------------------------------------------
    def prepare(self) -> None:
        """Make a shared store's mirror now, on a thread of its own, not on the first read (5 s at a
        million rollouts: a served studio's first page then finds it made). A read meanwhile waits for
        it; an error is the next read's. Nothing to do for a store file."""
        if self._mirror_wanted and self._preparing is None:
            self._preparing = threading.Thread(target=self._prepare, name="mirror-prepare", daemon=True)
            self._preparing.start()

    def _prepare(self) -> None:
        try:
            self._mirror_current()
        except Exception:  # noqa: BLE001 -- the next read makes it again and raises what stops it
            pass

    def _mirror_current(self) -> None:
        """Make the mirror on the first read, and bring it up to date (``studio.store.mirror``)."""
        if not self._mirror_wanted:
            return
        try:
            if self._mirror is None:
                with self._readers_lock:
                    if self._mirror is None:
                        self._mirror = Mirror(self._con, self.spec)
            self._mirror.current()
        except duckdb.IOException as exc:  # the catalog or the data out of reach
            raise StoreError(lake.explain(self.spec, exc)) from None

    def _written(self) -> None:
        """This process committed: the mirror looks at the catalog before the next read."""
        if self._mirror is not None:
            self._mirror.stale()

    def _close_mirror(self) -> None:
        if self._preparing is not None:
            self._preparing.join()
        if self._mirror is not None:
            self._mirror.close()
            self._mirror = None
