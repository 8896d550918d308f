"""Reading an import's files: each file's rows in slices of canonical records, and the bad ones named.

A file is read with Arrow (``pyarrow.json``'s parallel reader for JSONL, ``pyarrow.parquet`` in
slices as they are written, a logged table's JSON as records) and its mapping resolved from
what it holds. Only a slice Arrow cannot read cleanly goes through a line-by-line Python pass,
which names each bad record by file and 1-based line (Parquet and table files: row). A JSONL
file is read from where an earlier import stopped; in tail mode a last line without its
newline, still being written, waits for the next poll.

:func:`read_files` is everything an import reads, in order, and nothing it writes;
:class:`ReadAhead` runs it on a reader thread, a file ahead (three items deep), so the next
slices are read and made canonical (Arrow lets go of the GIL) while the store writes this one.
"""
from __future__ import annotations

import functools
import io
import json
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pj
import pyarrow.parquet as pq

from studio.ingest.agent_formats import agent_batch, skyrl_unfinished
from studio.ingest.errors import ImportFormatError, Problem
from studio.ingest.formats import (
    AGENT_FORMATS,
    TOKEN_FIELDS,
    ColumnMapping,
    columns_of,
    kinds_of_records,
    kinds_of_schema,
    read_table_json,
    resolve,
    step_of_name,
    value_kind,
)
from studio.ingest.normalise import Batch, Slow, arrow_batch, records_batch
from studio.ingest.train_dumps import read_torch_samples

SLICE = 250_000  # rows read, checked and written at a time


@dataclass
class Source:
    """What one read of one file gave: rows in slices (an Arrow table or records), where it ended."""

    file: Path
    mapping: ColumnMapping
    slices: list  # (offset of its first record in this read, pa.Table | list[(line, obj)])
    end: int  # bytes consumed after this read
    problems: list[Problem]
    first_line: Callable[[], int] = lambda: 1  # line (row) of the read's first record, counted when needed


def _read_jsonl(path: Path, start: int, tail: bool) -> tuple[bytes, int]:
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read()
    if tail:  # a last line without its newline is still being written: it waits for the next poll
        data = data[:data.rfind(b"\n") + 1]
    return data, start + len(data)


def _first_line(path: Path, start: int) -> int:
    """1-based number of the line that starts at byte ``start``."""
    if start == 0:
        return 1
    count, left = 0, start
    with open(path, "rb") as f:
        while left > 0:
            chunk = f.read(min(left, 1 << 24))
            if not chunk:
                break
            count += chunk.count(b"\n")
            left -= len(chunk)
    return count + 1


def _jsonl_arrow(data: bytes) -> pa.Table | None:
    """The fast path: Arrow's parallel JSON reader, when every line is one clean object."""
    body = data.rstrip()
    lines = body.count(b"\n") + 1
    # every line must open an object: pyarrow 26's reader crashes the process on a first line `null`
    if not body.startswith(b"{") or body.count(b"\n{") != lines - 1:
        return None
    block = min(max(len(body) // 8 + 1, 16 << 20), 1 << 30)
    try:
        t = pj.read_json(io.BytesIO(body), read_options=pj.ReadOptions(block_size=block))
        t.validate(full=True)  # pyarrow 26 can build broken list offsets (a list with nulls, then a row without it)
    except (pa.ArrowException, ValueError):
        return None
    return t if t.num_rows == lines else None  # blank lines or two objects on a line: count them in Python


def read_source(path: Path, fmt: str, user: ColumnMapping | None, start: int, tail: bool) -> Source:
    """Read ``path`` from byte ``start`` (JSONL) and resolve its mapping.

    Raises:
        ImportFormatError: the file's fields are not what ``fmt`` needs.
        OSError, pa.ArrowException: the file cannot be read (for a Parquet file being written: not yet).
    """
    if path.suffix == ".parquet":
        pf = pq.ParquetFile(path)  # reads the footer: a file still being written fails here
        m = resolve(fmt, kinds_of_schema(pf.schema_arrow), user, str(path))
        return Source(path, m, _parquet_slices(path, pf, m), path.stat().st_size, [])
    if path.suffix == ".pt":  # slime's rollout dump
        recs = read_torch_samples(path)
        m = resolve(fmt, kinds_of_records(o for _, o in recs), user, str(path))
        return Source(path, m, _chunks(recs), path.stat().st_size, [])
    if path.suffix == ".json":
        names, data = read_table_json(path)
        recs = [(i + 1, dict(zip(names, row, strict=True)) if isinstance(row, list) and len(row) == len(names) else row)
                for i, row in enumerate(data)]
        m = resolve(fmt, kinds_of_records(o for _, o in recs), user, str(path))
        return Source(path, m, _chunks(recs), path.stat().st_size, [])
    data, end = _read_jsonl(path, start, tail)
    t = _jsonl_arrow(data) if fmt not in AGENT_FORMATS else None  # a trajectory's nesting: read as it is written
    if t is not None:
        m = resolve(fmt, kinds_of_schema(t.schema), user, str(path))
        return Source(path, m, [(lo, t.slice(lo, SLICE)) for lo in range(0, t.num_rows, SLICE)], end, [],
                      functools.cache(lambda: _first_line(path, start)))  # a tail poll of a long file: only if needed
    # the slow path: each line on its own, so each bad one is named
    first, recs, problems = _first_line(path, start), [], []
    lines = data.split(b"\n")
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            recs.append((first + i, json.loads(raw)))
        except (ValueError, RecursionError) as exc:
            msg = str(exc).split(": line")[0] if isinstance(exc, json.JSONDecodeError) else exc.__class__.__name__
            problems.append(Problem(str(path), first + i, f"not valid JSON ({msg})"))
    cut = skyrl_unfinished(recs) if tail and fmt == "skyrl" else None
    if cut is not None:  # a trajectory still being written: read again from its first step next poll
        end = start + sum(len(raw) + 1 for raw in lines[:cut - first])
        recs = [r for r in recs if r[0] < cut]
        problems = [p for p in problems if p.line < cut]
    objs = [o for _, o in recs if isinstance(o, dict)]
    if not objs:  # no line is an object: every line is a problem, whatever the format
        problems += [Problem(str(path), ln, f"expected a JSON object, got {value_kind(o)}") for ln, o in recs]
        return Source(path, ColumnMapping(), [], end, problems)
    m = resolve(fmt, kinds_of_records(objs), user, str(path))
    return Source(path, m, _chunks(recs), end, problems)


def _parquet_slices(path: Path, pf: pq.ParquetFile, m: ColumnMapping):
    """The file in slices, read as they are written (token lists make a slice big: fewer rows then).

    Token texts are read as a dictionary (distinct strings once, an index per token): building every
    token's string costs more than reading the rest of the file, even where the writer stored them
    plainly, and the store takes the dictionary as it is. Each row group has a dictionary of its own
    and Arrow cannot read a slice across two of them, so those slices keep to one row group; a file of
    small row groups is read plainly instead, in slices across them."""
    rows = SLICE if not any(getattr(m, f) for f in TOKEN_FIELDS) else max(1, SLICE // 8)
    cols = sorted(columns_of(m)) if m.prompt else None  # an agent format reads every column
    sizes = [pf.metadata.row_group(g).num_rows for g in range(pf.metadata.num_row_groups)]
    big_groups = min(sizes[:-1], default=rows) >= rows // 4
    dicts = _dictionary_leaves(pf, m.token_texts) if m.token_texts and big_groups else []
    if dicts:
        pf.close()
        pf = pq.ParquetFile(path, read_dictionary=dicts)
        batches = (rb for g in range(len(sizes))
                   for rb in pf.iter_batches(batch_size=rows, row_groups=[g], columns=cols))
    else:
        batches = pf.iter_batches(batch_size=rows, columns=cols)
    lo = 0
    with pf:
        for rb in batches:
            yield lo, pa.Table.from_batches([rb])
            lo += rb.num_rows


def _dictionary_leaves(pf: pq.ParquetFile, column: str) -> list[str]:
    """The Parquet path of ``column``'s strings when it is a plain list of strings (else none)."""
    schema = pf.schema
    leaves = [schema.column(i) for i in range(len(schema)) if schema.column(i).path.split(".")[0] == column]
    if len(leaves) != 1 or leaves[0].physical_type != "BYTE_ARRAY" or leaves[0].max_repetition_level != 1:
        return []
    return [leaves[0].path]


def _chunks(recs: list) -> list:
    return [(lo, recs[lo:lo + SLICE]) for lo in range(0, len(recs), SLICE)]


def _canonical(src: Source, offset: int, part, file_step: int | None, fmt: str,
               tokenizer: str | Path | None) -> tuple[Batch | None, list[Problem]]:
    if isinstance(part, pa.Table):
        try:
            if fmt in AGENT_FORMATS:
                raise Slow
            return arrow_batch(part, src.mapping, file_step), []
        except Slow:
            first = src.first_line() + offset
            part = list(zip(range(first, first + part.num_rows), part.to_pylist(), strict=True))
    if fmt in AGENT_FORMATS:
        return agent_batch(fmt, part, src.mapping, file_step, str(src.file), tokenizer)
    return records_batch(part, src.mapping, file_step, str(src.file))


def read_files(todo: list, fmt: str, user: ColumnMapping | None, tail: bool, tokenizer: str | Path | None = None):
    """Everything the import reads, in order, and nothing it writes. Per file: ``(f, start, stat,
    source)`` (the source: what :func:`read_source` gave, or the exception it raised), then ``(batch,
    problems)`` per slice (:func:`_canonical`; ``tokenizer`` decodes an agent format's token ids), the
    exception that stopped a file whose data does not read (its footer did), and None at the file's end."""
    for f, start, _ in todo:
        st = f.stat()
        try:
            src = read_source(f, fmt, user, start, tail)
        except (OSError, pa.ArrowException, UnicodeDecodeError, ImportFormatError) as exc:
            yield f, start, st, exc
            continue
        yield f, start, st, src
        file_step = step_of_name(f)
        try:
            for offset, part in src.slices:
                yield _canonical(src, offset, part, file_step, fmt, tokenizer)
        except (OSError, pa.ArrowException) as exc:  # a Parquet file whose footer reads but whose data does not
            yield exc
        yield None  # the file's end


class ReadAhead:
    """Iterates ``items`` ``depth`` items ahead in a reader thread: the next slices are read from their
    files and put in canonical form (Arrow, which lets go of the GIL) while the store writes this one.
    Three items are a file ahead (its header, a slice, its end): with one, the next file's slice was
    only read once the store had written this one's. ``next`` raises what producing the item raised.
    Close it to stop reading."""

    _END = object()

    def __init__(self, items, depth: int = 3):
        self._items = items
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="import-read")  # one: in order
        self._ahead = deque(self._pool.submit(next, items, self._END) for _ in range(depth))

    def __iter__(self):
        return self

    def __next__(self):
        item = self._ahead.popleft().result()
        if item is self._END:
            raise StopIteration
        self._ahead.append(self._pool.submit(next, self._items, self._END))
        return item

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)  # the slice being read finishes first
        self._items.close()
