"""The ``tokens`` view of a file store: its table ``token_rows`` and the Parquet shards of bulk imports.

A mixin of :class:`studio.store.Store` (it uses the store's connection, path and transactions);
``studio.store.shards`` writes the shards. A shared store has no shards (its token rows are its
own Parquet data files), so its view is the table alone.
"""
from __future__ import annotations

import time
from pathlib import Path

import duckdb

from studio.store import schema
from studio.store.errors import StoreError

# a file in the shard folder that no shard lists is deleted on open once untouched this long: an
# import writing it touches it every row group, one killed before its commit never again
STRAY_SHARD_AGE_S = 600


class TokenView:
    """The shard half of :class:`~studio.store.Store`."""

    # -- token shards --------------------------------------------------------------------
    @property
    def shard_dir(self) -> Path | None:
        """The folder of this store's token shards (None for an in-memory or a shared store: it writes
        none; a shared store's token rows are its own Parquet data files)."""
        return None if self.kind != "file" else Path(self.path).with_name(Path(self.path).name + ".shards")

    @property
    def bulk_dir(self) -> Path | None:
        """Where a bulk import writes its token rows as one Parquet file (``shards.TokenSink``): a file
        store's shard folder, or a shared store's own folder of ``token_rows`` data files when its data
        is on a local or shared disk (the import's commit adds the file to the lake). None: the rows are
        inserted (an in-memory store; data on object storage)."""
        if self.kind != "shared":
            return self.shard_dir
        from studio.store import lake

        root = self.spec.data_path or lake.kept_data_path(self._con) or ""
        return None if not root or "://" in root else Path(root) / "main" / schema.TOKEN_ROWS

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
        the files that can hold it however many there are; on a shared store read through its mirror, the
        token data files that can hold them (``Mirror.token_source``) where those are the whole table.
        The caller still filters on ``rollout_id``."""
        if self._mirror_wanted:  # a shared store read through its mirror: its data files where it can
            self._mirror_current()  # (the files of the snapshot the next read sees, or a later one)
            return self._mirror.token_source(lo, hi) or "tokens"
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

