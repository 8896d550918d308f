"""Token shards: a bulk import's token rows as one Parquet file beside the store.

A million imported rollouts carry a hundred million token rows. Inserting them into a DuckDB
table costs several times what writing them to Parquet does, and DuckDB scans Parquet in
place. So an import with more than
:data:`SHARD_MIN_ROWS` token rows streams them into one Parquet file in the store's shard
folder (``<store file>.shards/``) on a thread, while the store inserts the rollouts, rewards
and prompts; the import's transaction lists the file in ``token_shards`` and rewrites the
``tokens`` view to read it. Nothing else changes for readers: every query reads ``tokens``.

An import that fails, is cancelled or aborted deletes its file; one cut off before its
commit leaves a file that no shard lists, which the next :meth:`Store.open` deletes.
Smaller imports (a tailed run's polls) write into the table ``token_rows`` as before.

On a shared store (DuckLake) the same file is written into the lake's own folder of ``token_rows``
data files (``Store.bulk_dir``, with 10,240-row row groups) and the import's transaction adds it to
the lake (``ducklake_add_data_files``) instead of listing a shard: it is then one of the table's
data files like any other, and there is no view to rewrite. Data on object storage is inserted.

In detail (schema 7): Inserting a hundred million token rows into a
DuckDB table costs several times what writing them to Parquet does (on the 2-core machine,
about 0.8 s per 5M rows against 0.3 s), and DuckDB scans Parquet in place. So an import with
more than ``SHARD_MIN_ROWS`` (1M) token rows streams them through a ``TokenSink`` into one Parquet
file in ``<store file>.shards/``, on a thread while the owner inserts the rollouts, rewards and
prompts; the import's transaction lists the file in ``token_shards`` and rewrites the ``tokens``
view (``Store.refresh_tokens_view``: ``token_rows UNION ALL`` one ``read_parquet`` per shard, with
typed NULLs for the columns a shard lacks). Smaller imports, a tailed run's polls and
everything the studio generates go into ``token_rows``. The shards are written uncompressed with
dictionary pages for ids and texts only (texts are written from the importer's dictionary
arrays as they are, not decoded and encoded again; ids with a dictionary per row group, cut from the slice's: ``_ids_by_row_group``), 131,072 rows per row group, statistics on
``rollout_id``: a rollout's tokens are one row group's pages per shard, and the database caches
the footers (``SET GLOBAL parquet_metadata_cache``: cursors too). The point reads of the token
strip and the group view (``queries.tokens``, ``queries.tokens_of``, ``credit.steps_of``, a branch's
parent tokens, the fork panel's token) read from
``Store.tokens_between(lo, hi)``: the view with only the shards whose ``min_rollout_id`` ..
``max_rollout_id`` meets the ids (none: ``token_rows`` alone), so a click opens one file however
many shards there are; ids are made in time order, so an import's range is its own. The
importer reads ahead a file at a time (``_ReadAhead``, three items deep) on its reader
thread, beside the shard's writer thread and the owner's inserts. Nothing ever changes a shard:
enrich moves a rollout's rows into ``token_rows`` first (``Store.unshard`` → ``tokens_moved``, which
the view then excludes), a mini-run's rows are never sharded. An import that fails, aborts or
is cancelled deletes its file; a file no shard lists (an owner killed before the commit) is
deleted by a later ``Store.open`` once untouched for ``STRAY_SHARD_AGE_S`` (10 min: the process may have
the store open twice, one open importing, and a writing import touches its file every row
group). ``Store.open`` rewrites the view only when the store moved (a rewrite under another
open's import would make that import's commit conflict on the view); it also refuses a store whose listed shards are missing
(naming the folder) and points the view at the folder's current path (a moved store). Every
reader keeps reading ``tokens``; the console allows ``tokens``, not ``read_parquet``.
"""
from __future__ import annotations

import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from studio.store import lake, records, schema

# fewer token rows than this in one import: into the table (a shard per small import would make
# every point read open more files; the ingest gain is in the large ones)
SHARD_MIN_ROWS = 1_000_000
# rows per Parquet row group: a point read (one rollout's tokens) reads one row group's pages
ROW_GROUP = 131_072

TOKEN_TYPES: dict[str, pa.DataType] = {
    "rollout_id": pa.string(), "pos": pa.int32(), "token_id": pa.int32(), "token_text": pa.string(),
    "logprob": pa.float32(), "entropy": pa.float32(), "topk_ids": pa.list_(pa.int32()),
    "topk_logprobs": pa.list_(pa.float32()), "ref_logprob": pa.float32(), "step_idx": pa.int32(),
    "train_weight": pa.float32(), "turn_idx": pa.int32(), "trained": pa.bool_(),
    "train_logprob": pa.float32(), "train_rank": pa.int32()}
SQL_TYPES = {"rollout_id": "VARCHAR", "pos": "INTEGER", "token_id": "INTEGER", "token_text": "VARCHAR",
             "logprob": "FLOAT", "entropy": "FLOAT", "topk_ids": "INTEGER[]", "topk_logprobs": "FLOAT[]",
             "ref_logprob": "FLOAT", "step_idx": "INTEGER", "train_weight": "FLOAT",
             "turn_idx": "INTEGER", "trained": "BOOLEAN", "train_logprob": "FLOAT", "train_rank": "INTEGER"}
assert list(TOKEN_TYPES) == schema.columns("tokens") == list(SQL_TYPES)


ID_TYPE = pa.dictionary(pa.int32(), pa.string())


def _ids_by_row_group(ids: pa.Array | pa.ChunkedArray) -> pa.ChunkedArray:
    """A slice's rollout ids as one chunk per row group, each with a dictionary of its own rollouts.

    The importer gives each token's id as an index into the slice's ids, in rollout order; a row
    group holds ~1,000 rollouts of a slice's ~25,000, so each gets the part of the dictionary it
    uses: written as it is, with no string decoded or hashed (a quarter of the shard's write, when
    the writer built the dictionaries), and its row-group statistics still bound its ids. Ids given
    otherwise are encoded row group by row group."""
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks() if ids.num_chunks else pa.array([], ids.type)
    chunks = []
    if pa.types.is_dictionary(ids.type) and not ids.null_count:
        idx = ids.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        values = ids.dictionary.cast(pa.string())
        if len(idx) and (np.diff(idx) >= 0).all():
            for a in range(0, len(idx), ROW_GROUP):
                part = idx[a:a + ROW_GROUP]
                lo, hi = int(part[0]), int(part[-1])
                chunks.append(pa.DictionaryArray.from_arrays(pa.array(part - lo, pa.int32()), values.slice(lo, hi - lo + 1)))
            return pa.chunked_array(chunks, ID_TYPE)
    ids = ids.cast(pa.string())
    for a in range(0, len(ids), ROW_GROUP):
        chunks.append(ids.slice(a, ROW_GROUP).dictionary_encode().cast(ID_TYPE))
    return pa.chunked_array(chunks, ID_TYPE)


def select_sql(path: Path, present: list[str]) -> str:
    """The ``tokens`` columns read from one shard file: those it lacks are typed NULLs."""
    quoted = "'" + str(path).replace("'", "''") + "'"
    cols = [c if c in present else f"NULL::{SQL_TYPES[c]} AS {c}" for c in TOKEN_TYPES]
    return f"SELECT {', '.join(cols)} FROM read_parquet({quoted})"


def union_sql(shards: list[tuple[Path, list[str]]]) -> str:
    """Every ``(path, columns)`` shard as ``tokens`` columns, one query."""
    return " UNION ALL ".join(select_sql(f, cols) for f, cols in shards)


class TokenSink:
    """Where one import's token rows go (see the module's docstring). ``add`` each slice's token
    table in order; ``finish`` inside the import's transaction; ``discard`` when it fails."""

    def __init__(self, store, cur, run_id: str, min_rows: int | None = None):
        self.store, self.cur, self.run_id = store, cur, run_id
        self.min_rows = SHARD_MIN_ROWS if min_rows is None else min_rows
        self._dir = store.bulk_dir  # read once (a shared store's asks its catalog)
        self.n_rows = 0
        self._pending: list[pa.Table] = []  # held until the import is known to be large
        self._pool: ThreadPoolExecutor | None = None
        self._last: Future | None = None
        self._writer: pq.ParquetWriter | None = None
        self._columns: list[str] | None = None
        self.path: Path | None = None
        self._min_id: str | None = None
        self._max_id: str | None = None

    def add(self, table: pa.Table) -> None:
        self.n_rows += table.num_rows
        if self._pool is None:
            self._pending.append(table)
            if self._dir is None or self.n_rows < self.min_rows:
                return
            self._start()
            pending, self._pending = self._pending, []
            for t in pending:
                self._submit(t)
        else:
            self._submit(table)

    def _start(self) -> None:
        folder = self._dir
        folder.mkdir(parents=True, exist_ok=True)
        self.shard_id = records.new_id("shard_")
        self.path = folder / f"{self.shard_id}-{uuid.uuid4().hex[:6]}.parquet"
        # a shared store's point reads decode a row group (no shard ranges to pick a file by: smaller ones)
        self._row_group = lake.ROW_GROUP_ROWS if self.store.shared else ROW_GROUP
        # the shard's columns: those the first slice has (an import's slices share one mapping)
        first = self._pending[0]
        self._columns = [c for c in TOKEN_TYPES if c in first.column_names]
        # as written: token texts stay dictionary-coded when the importer gives them so (a few hundred
        # distinct pieces: decoding ten million of them to encode them again cost half the write); ids get
        # a dictionary per row group (_ids_by_row_group)
        self._types = dict(TOKEN_TYPES, rollout_id=ID_TYPE)
        if "token_text" in self._columns and pa.types.is_dictionary(first.schema.field("token_text").type):
            self._types["token_text"] = pa.dictionary(pa.int32(), pa.string())
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="token-shard")

    def _submit(self, table: pa.Table) -> None:
        ids = table.column("rollout_id")
        if pa.types.is_dictionary(ids.type):  # the importer's ids: an index into the slice's ids
            ids = pa.chunked_array([c.dictionary for c in ids.chunks], ids.type.value_type)
        lo, hi = (v.as_py() for v in pc.min_max(ids).values())
        self._min_id = lo if self._min_id is None else min(self._min_id, lo)
        self._max_id = hi if self._max_id is None else max(self._max_id, hi)
        prev = self._last
        self._last = self._pool.submit(self._write, table, prev)

    def _write(self, table: pa.Table, prev: Future | None) -> None:
        if prev is not None:
            prev.result()  # in order, and a failed write stops the ones after it
        cols = []
        for c in self._columns:
            a = table.column(c) if c in table.column_names else pa.nulls(table.num_rows, TOKEN_TYPES[c])
            cols.append(_ids_by_row_group(a) if c == "rollout_id" else a.cast(self._types[c]))
        out = pa.Table.from_arrays(cols, names=self._columns)
        if self._writer is None:
            # dictionary pages for the columns that repeat (ids, texts); floats and positions in dictionary
            # pages cost twice the write and save nothing. Statistics where point reads filter (the ids).
            self._writer = pq.ParquetWriter(
                self.path, out.schema, compression="none",
                use_dictionary=[c for c in ("rollout_id", "token_text") if c in self._columns],
                write_statistics=["rollout_id"])
        self._writer.write_table(out, row_group_size=self._row_group)

    def finish(self) -> None:
        """Write what is held into the table, or close the shard, list it and rewrite the view."""
        if self._pool is None:
            for t in self._pending:
                self.store.write({"tokens": t}, self.cur)
            self._pending = []
            return
        try:
            if self._last is not None:
                self._last.result()
            if self._writer is not None:
                self._writer.close()
                self._writer = None
        finally:
            self._pool.shutdown(wait=True)
        if self.store.shared:  # the file becomes one of the lake's own data files (columns it lacks read NULL)
            self.cur.execute(f"CALL ducklake_add_data_files('{lake.LAKE}', '{schema.TOKEN_ROWS}', ?, allow_missing => true)",
                             [str(self.path)])
            return
        self.cur.execute(
            "INSERT INTO token_shards (shard_id, run_id, file, n_rows, min_rollout_id, max_rollout_id, columns, "
            "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, now()::TIMESTAMP)",
            [self.shard_id, self.run_id, self.path.name, self.n_rows, self._min_id, self._max_id, self._columns])
        self.store.refresh_tokens_view(self.cur)

    def discard(self) -> None:
        """The import did not happen: stop writing and delete the file."""
        self._pending = []
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            if self._writer is not None:
                try:
                    self._writer.close()
                except (OSError, pa.ArrowException):
                    pass
                self._writer = None
        if self.path is not None:
            self.path.unlink(missing_ok=True)
