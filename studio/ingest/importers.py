"""Import the rollouts of real training runs: TRL GRPO completions tables, verl generation
dumps, OpenRLHF / RL-Logging-Board JSONL, and any JSONL or Parquet with a column mapping.

Every format is a :class:`ColumnMapping` resolved from the file's own field names
(:data:`FORMAT_FIELDS`), so one pipeline reads them all and a user mapping can override any
field of any format. A file is read with Arrow and turned into rows in vectorised passes;
only a slice Arrow cannot read cleanly goes through a line-by-line Python pass, which names
each bad record by file and 1-based line (Parquet and table files: row).

One import is one transaction: an abort on bad input, a cancel or any error leaves the store
as it was. Rows written: ``runs`` (kind ``import``), ``prompts``, ``rollouts`` (a group is
one prompt's completions at one step in one file), ``tokens`` where token-level fields exist,
``token_scores`` (``value-import@<run id>``) for per-token critic values, one
``rule_versions`` row ``import-<format>@<hash of the reward columns>`` with its ``rewards``,
and ``import_files`` (how far each file was read: importing again, or :mod:`studio.ingest.tail`,
resumes there and never duplicates a row).
"""
from __future__ import annotations

import functools
import hashlib
import io
import json
import math
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
import pyarrow.parquet as pq

from studio.errors import StudioError
from studio.store import Store, records
from studio.store.shards import TokenSink

FORMATS = ("trl", "verl", "openrlhf", "generic")
SLICE = 250_000  # rows read, checked and written at a time
TOKEN_SLICE = 4_000_000  # token rows per write (DuckDB spreads an insert of millions over its threads)
MAX_PROBLEMS = 1000  # problems kept per import (all are counted)
_INT32 = 2**31 - 1


class ImportFormatError(StudioError, ValueError):
    """A file is not what its importer expects; the message names the missing fields and the ones it has."""


class MalformedInput(StudioError, ValueError):
    """Records that cannot be imported; ``problems`` lists them (file, line, why). Nothing was written."""

    def __init__(self, problems: list[Problem], total: int | None = None):
        self.problems = problems
        n = total or len(problems)
        head = "; ".join(str(p) for p in problems[:3]) + (" …" if n > 3 else "")
        super().__init__(f"{n} malformed record{'s' * (n != 1)}, nothing was imported "
                         f"(on_error='skip' / --skip-bad imports the rest): {head}")


@dataclass
class Problem:
    """One record (or a whole file, ``line`` None) that could not be imported."""

    file: str
    line: int | None  # 1-based line of a JSONL file; row of a Parquet or table file
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}" if self.line is not None else f"{self.file}: {self.message}"


def _help(text: str):
    return field(default="", metadata={"help": text})


@dataclass(frozen=True)
class ColumnMapping:
    """Which source column holds which rollout field; "" means none (a format's default applies)."""

    prompt: str = _help("the prompt: text, or a list of {role, content} messages (required)")
    completion: str = _help("the completion: text, or a list of {role, content} messages (required)")
    step: str = _help("training step (default: the number in the file name)")
    group: str = _help("rows with the same value at the same step form one group (default: the same prompt)")
    reward: str = _help("total reward (default: the sum of the reward components)")
    rewards: tuple[str, ...] = field(default=(), metadata={
        "help": "reward component columns, each stored as a component named after its column"})
    gold: str = _help('reference answer, stored as the prompt\'s gold {"answer": ...}')
    advantage: str = _help("advantage the trainer used: a number, or a per-token list (its first value)")
    finish_reason: str = _help("why generation stopped (stop / length)")
    token_texts: str = _help("per-token list: the completion's token strings")
    token_ids: str = _help("per-token list: the completion's token ids")
    logprobs: str = _help("per-token list: log-probability of each token under the policy")
    ref_logprobs: str = _help("per-token list: log-probability of each token under the reference policy")
    entropies: str = _help("per-token list: entropy of each next-token distribution (nats)")
    values: str = _help("per-token list: a critic's value before each token (stored as value-import@<run id>)")

    @classmethod
    def parse(cls, pairs: list[str]) -> ColumnMapping:
        """From ``field=column`` strings (``rewards=a,b`` for several components)."""
        known = {f.name for f in fields(cls)}
        kw: dict[str, Any] = {}
        for pair in pairs:
            key, sep, col = pair.partition("=")
            key = key.strip()
            if not sep or key not in known or not col.strip():
                raise ValueError(f"--map {pair!r}: expected field=column with field one of {', '.join(sorted(known))}")
            kw[key] = tuple(c.strip() for c in col.split(",") if c.strip()) if key == "rewards" else col.strip()
        return cls(**kw)

    def as_dict(self) -> dict[str, Any]:
        """The fields that are set."""
        return {f.name: (list(v) if isinstance(v, tuple) else v) for f in fields(self) if (v := getattr(self, f.name))}


@dataclass
class ImportReport:
    run_id: str | None
    n_rollouts: int = 0
    n_tokens: int = 0
    n_files: int = 0
    skipped: list[Problem] = field(default_factory=list)
    seconds: float = 0.0
    status: str = "done"  # done | cancelled
    rule_versions: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)  # tail: Parquet files not readable yet (being written)
    n_skipped: int = 0  # all skipped records (``skipped`` keeps the first MAX_PROBLEMS)

    @property
    def cancelled(self) -> bool:
        return self.status == "cancelled"

    def summary(self) -> str:
        return (f"{self.run_id or '(no run)'}: {self.status}, {self.n_rollouts:,} rollouts, {self.n_tokens:,} tokens "
                f"from {self.n_files} file{'s' * (self.n_files != 1)} in {self.seconds:.1f} s"
                + (f", {self.n_skipped} skipped" if self.n_skipped else ""))


# ----------------------------------------------------------------------------------------- formats

# Each format: a ColumnMapping field -> the source names that may fill it, the first present wins.
FORMAT_FIELDS: dict[str, dict[str, tuple[str, ...]]] = {
    "trl": {"prompt": ("prompt",), "completion": ("completion",), "step": ("step",), "advantage": ("advantage",)},
    "verl": {"prompt": ("input",), "completion": ("output",), "gold": ("gts",), "reward": ("score",),
             "step": ("step",)},
    "openrlhf": {
        "prompt": ("prompt", "prompts", "query", "input"),
        "completion": ("response", "responses", "output", "completion"),
        "reward": ("reward", "rewards", "score"),
        "step": ("step", "global_step", "train_step", "iteration"),
        "gold": ("gold", "answer", "ground_truth", "gts", "label", "reference"),
        "advantage": ("advantage", "advantages"),
        "finish_reason": ("finish_reason", "stop_reason"),
        "token_texts": ("response_tokens", "tokens", "token_texts", "output_tokens"),
        "token_ids": ("response_token_ids", "response_ids", "output_ids", "token_ids"),
        "logprobs": ("logprobs", "action_log_probs", "log_probs", "old_logprobs"),
        "ref_logprobs": ("ref_logprobs", "base_action_log_probs", "ref_log_probs"),
        "entropies": ("entropies", "entropy"),
        "values": ("values",),
    },
    "generic": {},
}
REQUIRED = {"trl": ("prompt", "completion"), "verl": ("prompt", "completion", "reward"),
            "openrlhf": ("prompt", "completion"), "generic": ("prompt", "completion")}
_TOKEN_FIELDS = {  # mapping field -> (store column, type)
    "token_texts": ("token_text", pa.string()), "token_ids": ("token_id", pa.int32()),
    "logprobs": ("logprob", pa.float32()), "ref_logprobs": ("ref_logprob", pa.float32()),
    "entropies": ("entropy", pa.float32()), "values": ("value", pa.float32())}
_KINDS = {"prompt": {"text", "messages"}, "completion": {"text", "messages"}, "step": {"number"},
          "group": {"text", "number"}, "reward": {"number"}, "advantage": {"number", "list"},
          "finish_reason": {"text"}, **{f: {"list"} for f in _TOKEN_FIELDS}}
_CORRECTNESS = {"acc", "accuracy", "correct", "correctness", "is_correct", "exact_match"}


def _is_correctness(name: str) -> bool:
    base = re.sub(r"(_reward|_score|_func)$", "", name.lower().rsplit("/", 1)[-1])
    return base.removeprefix("reward_") in _CORRECTNESS


def _kind(t: pa.DataType) -> str:
    if pa.types.is_dictionary(t):
        return _kind(t.value_type)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "text"
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return "number"
    if pa.types.is_null(t):
        return "null"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        v = t.value_type
        return "messages" if pa.types.is_struct(v) and v.get_field_index("content") >= 0 else "list"
    return "other"


def _pykind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, str):
        return "text"
    if isinstance(v, (bool, int, float)):
        return "number"
    if isinstance(v, list):
        return "messages" if v and isinstance(v[0], dict) and "content" in v[0] else "list"
    return "other"


def resolve(fmt: str, kinds: dict[str, set[str]], user: ColumnMapping | None, file: str) -> ColumnMapping:
    """The mapping of one file: the format's fields found among its columns (``kinds``: column
    -> kinds of its values), then every field ``user`` sets.

    Raises:
        ImportFormatError: a required field or a mapped column is missing, or holds the wrong kind of value.
    """
    chosen: dict[str, Any] = {}
    for fld, names in FORMAT_FIELDS[fmt].items():
        ok = _KINDS.get(fld)
        for nm in names:
            if nm in kinds and (ok is None or kinds[nm] & ok or kinds[nm] <= {"null"}):
                chosen[fld] = nm
                break
    mapped = set()
    for f in fields(ColumnMapping):
        v = getattr(user, f.name) if user else None
        if v:
            chosen[f.name] = v
            mapped.update([v] if isinstance(v, str) else v)
    absent = sorted(c for c in mapped if c not in kinds)
    missing = [f for f in REQUIRED[fmt] if not chosen.get(f)]
    if absent or missing:
        want = [f"{f} ({' or '.join(FORMAT_FIELDS[fmt].get(f, ())) or 'map a column'})" for f in missing]
        raise ImportFormatError(
            f"{file}: not a {fmt} file: missing {', '.join(want + [repr(c) for c in absent])}; "
            f"it has {', '.join(sorted(kinds)) or 'no fields'}")
    for fld, ok in _KINDS.items():
        col = chosen.get(fld)
        if col and not (kinds[col] & ok or kinds[col] <= {"null"}):
            raise ImportFormatError(f"{file}: column {col!r} ({fld}) holds {'/'.join(sorted(kinds[col]))}, "
                                    f"expected {' or '.join(sorted(ok))}")
    if not chosen.get("rewards"):
        used = {v for k, v in chosen.items() if k != "rewards"}
        numeric = [c for c, k in kinds.items()
                   if "number" in k and k <= {"number", "null"} and c not in used and not c.startswith("__")]
        if fmt in ("trl", "verl"):  # every other number is a reward function / reward_extra_info
            chosen["rewards"] = tuple(numeric)
        elif fmt == "openrlhf":  # only numbers named like rewards: the rest are lengths, KL, ...
            chosen["rewards"] = tuple(c for c in numeric if not c.startswith("ref_") and (
                _is_correctness(c) or re.search(r"(^reward_|_reward$|_score$)", c)))
    for col in chosen.get("rewards", ()):
        if not kinds[col] & {"number"} and not kinds[col] <= {"null"}:
            raise ImportFormatError(f"{file}: reward column {col!r} holds {'/'.join(sorted(kinds[col]))}, "
                                    "expected numbers")
    return ColumnMapping(**{k: (tuple(v) if k == "rewards" else v) for k, v in chosen.items()})


def _field_names(path: Path) -> set[str]:
    if path.suffix == ".parquet":
        return set(pq.read_schema(path).names)
    if path.suffix == ".json":
        return set(_read_table_json(path)[0])
    with open(path, "rb") as f:
        for raw in f:
            if raw.strip():
                try:
                    obj = json.loads(raw)
                except ValueError:
                    raise ImportFormatError(f"{path}: the first line is not JSON") from None
                return set(obj) if isinstance(obj, dict) else set()
    return set()


def detect_format(path: str | Path) -> str:
    """The format of a file or a run directory, from its file names and fields.

    Raises:
        ImportFormatError: nothing to import there, or the fields fit no format (the message lists them).
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise ImportFormatError(f"{p} does not exist")
    if p.is_dir():
        if _trl_dir(p) is not None:
            return "trl"
        files = _shards(p, "generic")
        if not files:
            raise ImportFormatError(f"{p}: no .parquet, .jsonl or completions/*.parquet files to import")
        p = files[0]
    names = _field_names(p)
    if p.suffix in (".parquet", ".json") and {"prompt", "completion"} <= names and (
            "advantage" in names or p.name.startswith("completions")):
        return "trl"
    if p.suffix == ".jsonl":
        if {"input", "output", "score"} <= names:
            return "verl"
        if names & {"prompt", "prompts", "query"} and names & {"response", "responses"}:
            return "openrlhf"
        if {"prompt", "completion", "advantage"} <= names:
            return "trl"
    raise ImportFormatError(f"{p}: cannot tell the format from its fields ({', '.join(sorted(names)) or 'none'}); "
                            f"pass one of {', '.join(FORMATS)} (generic with a column mapping)")


def _step_of_name(path: Path) -> int | None:
    stem = path.name.split(".")[0]
    m = (re.fullmatch(r"\d+", stem) or re.search(r"step[_-]?(\d+)", stem, re.IGNORECASE)
         or re.fullmatch(r"completions_(\d+)", stem))
    if not m:
        return None
    v = int(m.group(m.lastindex or 0))
    return v if v <= _INT32 else None


def _by_step(files: list[Path]) -> list[Path]:
    return sorted(files, key=lambda f: (s if (s := _step_of_name(f)) is not None else math.inf, f.name))


def _trl_dir(root: Path) -> Path | None:
    for d in (root / "completions", root):
        if d.is_dir() and any(d.glob("completions_*.parquet")):
            return d
    return None


def _shards(root: Path, fmt: str) -> list[Path]:
    """The files a path stands for: itself, or a directory's shards sorted by step."""
    if root.is_file():
        return [root]
    if fmt == "trl":
        d = _trl_dir(root) or (root / "completions" if (root / "completions").is_dir() else root)
        return _by_step([*d.glob("*.parquet"), *d.glob("*.table.json")])
    jsonl = [f for f in root.glob("*.jsonl") if f.is_file()]
    if fmt == "verl":  # verl names its dumps {step}.jsonl: other JSONL beside them are not rollouts
        numbered = [f for f in jsonl if f.stem.isdigit()]
        return _by_step(numbered or jsonl)
    if fmt == "openrlhf":
        return _by_step(jsonl)
    return _by_step([*root.glob("*.parquet"), *jsonl])


# ----------------------------------------------------------------------------------------- canonical batches

class _Slow(Exception):
    """The vectorised path cannot take this slice as it is: the Python pass checks it record by record."""


class _Bad(ValueError):
    """One record is malformed (the message says why)."""


@dataclass
class _Batch:
    """Good records of one slice in canonical form, however they were read."""

    n: int
    prompt: pa.Array  # string, messages rendered as `role: content` lines
    completion: pa.Array  # string
    step: pa.Array  # int32
    group: pa.Array | None  # string
    total: pa.Array | None  # float64
    components: dict[str, pa.Array]  # float64
    advantage: pa.Array | None  # float64
    finish_reason: pa.Array | None  # string
    tokens: dict[str, pa.Array]  # mapping field -> list array, same length per row where not null
    n_tokens: np.ndarray | None  # int64 per row, -1 where the row has no token fields
    gold: Callable[[np.ndarray], list] | None  # row indices -> gold JSON text
    meta: Callable[[np.ndarray], list] | None  # row indices -> prompt meta JSON text

    def slice(self, a: int, z: int) -> _Batch:
        """Rows ``a:z``."""
        s = lambda x: x.slice(a, z - a) if x is not None else None
        gold, meta = self.gold, self.meta
        return _Batch(z - a, s(self.prompt), s(self.completion), s(self.step), s(self.group), s(self.total),
                      {k: s(v) for k, v in self.components.items()}, s(self.advantage), s(self.finish_reason),
                      {k: s(v) for k, v in self.tokens.items()},
                      self.n_tokens[a:z] if self.n_tokens is not None else None,
                      (lambda idx: gold(np.asarray(idx) + a)) if gold else None,
                      (lambda idx: meta(np.asarray(idx) + a)) if meta else None)


def _content(m: dict) -> str:
    c = m.get("content")
    if isinstance(c, list):  # content blocks (multimodal): their text, images as a mark
        return "".join(b.get("text") or "" if b.get("type", "text") == "text" else f"<{b.get('type')}>"
                       for b in c if isinstance(b, dict))
    return "" if c is None else str(c)


def render_messages(messages: list[dict], completion: bool = False) -> str:
    """A conversation as text: one ``role: content`` line per message (a completion of one
    message: its content alone)."""
    if completion and len(messages) == 1:
        return _content(messages[0])
    return "\n".join(f"{m.get('role') or ''}: {_content(m)}" for m in messages)


def _arrow_text(a: pa.Array, completion: bool) -> pa.Array:
    """Text of a prompt / completion column (the vectorised twin of :func:`render_messages`)."""
    if a.null_count:
        raise _Slow
    kind = _kind(a.type)
    if kind == "text":
        return a.cast(pa.string())
    if kind != "messages":
        raise _Slow
    lists = a.cast(pa.list_(a.type.value_type)) if pa.types.is_large_list(a.type) else a
    flat = pc.list_flatten(lists)
    st = flat.type
    ct = st.field("content").type
    if flat.null_count or not (pa.types.is_string(ct) or pa.types.is_null(ct)):
        raise _Slow
    content = pc.fill_null(flat.field("content").cast(pa.string()), "")
    role = (pc.fill_null(flat.field("role").cast(pa.string()), "") if st.get_field_index("role") >= 0
            else pa.repeat("", len(flat)))
    offsets = np.asarray(lists.offsets) - lists.offsets[0].as_py()
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array(offsets, pa.int32()),
                                                     pc.binary_join_element_wise(role, content, ": ")), "\n")
    if not completion or len(flat) == 0:
        return joined
    lengths = np.diff(offsets)
    first = content.take(pa.array(np.minimum(offsets[:-1], len(flat) - 1)))
    return pc.if_else(pa.array(lengths == 1), first, joined)


def _arrow_number(a: pa.Array, n: int) -> pa.Array:
    """float64, NaN read as missing (pandas writes a missing number as NaN)."""
    kind = _kind(a.type)
    if kind == "null":
        return pa.nulls(n, pa.float64())
    if kind != "number":
        raise _Slow
    f = a.cast(pa.float64())
    return pc.if_else(pc.is_nan(f), pa.scalar(None, pa.float64()), f) if pa.types.is_floating(a.type) else f


def _arrow_step(a: pa.Array | None, n: int, file_step: int | None) -> pa.Array:
    if a is not None and pa.types.is_boolean(a.type):
        raise _Slow
    f = _arrow_number(a, n) if a is not None else pa.nulls(n, pa.float64())
    v = f.to_numpy(zero_copy_only=False)
    v = v[~np.isnan(v)]
    if ((v != np.round(v)) | (np.abs(v) > _INT32)).any():
        raise _Slow
    s = f.cast(pa.int32())
    return pc.fill_null(s, file_step) if file_step is not None and s.null_count else s


def _list_first(a: pa.Array) -> pa.Array:
    lengths = pc.fill_null(pc.list_value_length(a), 0).to_numpy()
    flat = pc.list_flatten(a)
    starts = np.cumsum(lengths) - lengths
    idx = pa.array(np.where(lengths > 0, np.minimum(starts, max(len(flat) - 1, 0)), 0), mask=lengths == 0)
    return flat.take(idx) if len(flat) else pa.nulls(len(a), flat.type)


_ELEMENT_OK = {"token_texts": lambda t: _kind(t) == "text",  # strings, or a dictionary of them
               "token_ids": pa.types.is_integer}


def _arrow_batch(t: pa.Table, m: ColumnMapping, file_step: int | None) -> _Batch:
    """Canonical columns of a clean Arrow slice, all vectorised; raises :class:`_Slow` at the
    first thing that needs a record-by-record look (a null prompt, ragged token lists, ...)."""
    n = t.num_rows
    col = {name: t.column(name).combine_chunks() for name in _columns(m) if name in t.column_names}
    tokens, lengths = {}, None
    for fld in _TOKEN_FIELDS:
        a = col.get(getattr(m, fld)) if getattr(m, fld) else None
        if a is None or _kind(a.type) == "null":
            continue
        if _kind(a.type) != "list":
            raise _Slow
        et = a.type.value_type
        ok = _ELEMENT_OK.get(fld, lambda t: (pa.types.is_integer(t) or pa.types.is_floating(t)))
        if not (ok(et) or pa.types.is_null(et)):
            raise _Slow
        flat = pc.list_flatten(a)
        if fld == "token_ids" and len(flat) and pc.max(pc.abs(flat.cast(pa.int64()))).as_py() > _INT32:
            raise _Slow
        ln = pc.fill_null(pc.list_value_length(a), -1).to_numpy().astype(np.int64)
        if lengths is None:
            lengths = ln
        elif ((ln >= 0) & (lengths >= 0) & (ln != lengths)).any():
            raise _Slow
        else:
            lengths = np.where(lengths < 0, ln, lengths)
        tokens[fld] = a
    adv = col.get(m.advantage) if m.advantage else None
    if adv is not None:
        if _kind(adv.type) == "list":
            if not pa.types.is_floating(adv.type.value_type) and not pa.types.is_integer(adv.type.value_type):
                raise _Slow
            adv = _list_first(adv)
        adv = _arrow_number(adv, n)
    fin = col.get(m.finish_reason) if m.finish_reason else None
    grp = col.get(m.group) if m.group else None
    if grp is not None and (grp.null_count or _kind(grp.type) not in ("text", "number")
                            or pa.types.is_floating(grp.type)):
        raise _Slow
    gold = col.get(m.gold) if m.gold else None
    prompt_raw = col[m.prompt]
    return _Batch(
        n=n, prompt=_arrow_text(prompt_raw, False), completion=_arrow_text(col[m.completion], True),
        step=_arrow_step(col.get(m.step) if m.step else None, n, file_step),
        group=grp.cast(pa.string()) if grp is not None else None,
        total=_arrow_number(col[m.reward], n) if m.reward else None,
        components={c: _arrow_number(col[c], n) for c in m.rewards},
        advantage=adv, finish_reason=fin.cast(pa.string()) if fin is not None and _kind(fin.type) != "null" else None,
        tokens=tokens, n_tokens=lengths,
        gold=(lambda idx: [None if v is None else json.dumps({"answer": v}, default=str)
                           for v in gold.take(pa.array(idx)).to_pylist()]) if gold is not None else None,
        meta=(lambda idx: [json.dumps({"messages": v}, default=str)
                           for v in prompt_raw.take(pa.array(idx)).to_pylist()])
        if _kind(prompt_raw.type) == "messages" else None)


def _py_text(v: Any, col: str, completion: bool) -> tuple[str, list | None]:
    if v is None:
        raise _Bad(f"missing {col!r}")
    if isinstance(v, str):
        return v, None
    if isinstance(v, list) and all(isinstance(x, dict) for x in v):
        return render_messages(v, completion), v
    raise _Bad(f"{col!r} must be text or a list of {{role, content}} messages, got {_pykind(v)}")


def _nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _py_number(v: Any, col: str) -> float | None:
    if v is None or isinstance(v, (bool, int, float)):
        try:
            return None if v is None or _nan(v) else float(v)
        except OverflowError:
            raise _Bad(f"{col!r} is out of range") from None
    raise _Bad(f"{col!r} must be a number, got {_pykind(v)} {str(v)[:40]!r}")


def _py_int(v: Any, col: str) -> int | None:
    if v is None:
        return None
    if _nan(v):  # missing
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or abs(v) > _INT32 or v != int(v):
        raise _Bad(f"{col!r} must be an integer step, got {str(v)[:40]!r}")
    return int(v)


def _py_list(v: Any, col: str, fld: str) -> list | None:
    if v is None:
        return None
    if not isinstance(v, list):
        raise _Bad(f"{col!r} must be a list, got {_pykind(v)}")
    if fld == "token_texts":
        if not all(x is None or isinstance(x, str) for x in v):
            raise _Bad(f"{col!r} must be a list of strings")
    elif fld == "token_ids":
        if not all(x is None or (isinstance(x, int) and not isinstance(x, bool) and abs(x) <= _INT32) for x in v):
            raise _Bad(f"{col!r} must be a list of token ids")
    else:
        if not all(x is None or (isinstance(x, (int, float)) and not isinstance(x, bool)) for x in v):
            raise _Bad(f"{col!r} must be a list of numbers")
        v = [None if x is None or _nan(x) else float(x) for x in v]
    return v


def _normalise(obj: Any, m: ColumnMapping, file_step: int | None) -> tuple:
    """One record's canonical values, or :class:`_Bad` saying what is wrong with it."""
    if not isinstance(obj, dict):
        raise _Bad(f"expected a JSON object, got {_pykind(obj) if obj is not None else 'null'}")
    prompt, messages = _py_text(obj.get(m.prompt), m.prompt, False)
    completion, _ = _py_text(obj.get(m.completion), m.completion, True)
    step = _py_int(obj.get(m.step), m.step) if m.step else None
    step = file_step if step is None else step
    group = None
    if m.group:
        g = obj.get(m.group)
        if g is None or isinstance(g, (bool, float)) or not isinstance(g, (str, int)):
            raise _Bad(f"{m.group!r} (the group) must be text or an integer")
        group = str(g)
    total = _py_number(obj.get(m.reward), m.reward) if m.reward else None
    comps = [_py_number(obj.get(c), c) for c in m.rewards]
    adv = obj.get(m.advantage) if m.advantage else None
    if isinstance(adv, list):
        adv = _py_list(adv, m.advantage, "advantage")
        adv = adv[0] if adv else None
    adv = _py_number(adv, m.advantage)
    fin = obj.get(m.finish_reason) if m.finish_reason else None
    if fin is not None and not isinstance(fin, str):
        raise _Bad(f"{m.finish_reason!r} must be text")
    toks, n_tok, first = {}, -1, None
    for fld in _TOKEN_FIELDS:
        col = getattr(m, fld)
        if col and (lst := _py_list(obj.get(col), col, fld)) is not None:
            if n_tok >= 0 and len(lst) != n_tok:
                raise _Bad(f"{col!r} has {len(lst)} values but {first!r} has {n_tok}")
            toks[fld], n_tok, first = lst, len(lst), first or col
    g = obj.get(m.gold) if m.gold else None
    gold = None if g is None else json.dumps({"answer": g}, default=str)
    meta = json.dumps({"messages": messages}, default=str) if messages is not None else None
    return prompt, completion, step, group, total, comps, adv, fin, toks, n_tok, gold, meta


def _records_batch(recs: list[tuple[int, Any]], m: ColumnMapping, file_step: int | None,
                   file: str) -> tuple[_Batch | None, list[Problem]]:
    """The slow path: every record checked on its own; the good ones as one batch."""
    rows, problems = [], []
    for line, obj in recs:
        try:
            rows.append(_normalise(obj, m, file_step))
        except _Bad as exc:
            problems.append(Problem(file, line, str(exc)))
    if not rows:
        return None, problems
    cols = list(zip(*rows))
    n = len(rows)
    tokens = {}
    for fld, (_, typ) in _TOKEN_FIELDS.items():
        vals = [t.get(fld) for t in cols[8]]
        if any(v is not None for v in vals):
            tokens[fld] = pa.array(vals, pa.list_(pa.int64() if fld == "token_ids" else
                                                  pa.string() if fld == "token_texts" else pa.float64()))
    gold, meta = cols[10], cols[11]
    return _Batch(
        n=n, prompt=pa.array(cols[0], pa.string()), completion=pa.array(cols[1], pa.string()),
        step=pa.array(cols[2], pa.int32()), group=pa.array(cols[3], pa.string()) if m.group else None,
        total=pa.array(cols[4], pa.float64()) if m.reward else None,
        components={c: pa.array([r[i] for r in cols[5]], pa.float64()) for i, c in enumerate(m.rewards)},
        advantage=pa.array(cols[6], pa.float64()) if m.advantage else None,
        finish_reason=pa.array(cols[7], pa.string()) if m.finish_reason else None,
        tokens=tokens, n_tokens=np.array(cols[9], np.int64) if tokens else None,
        gold=(lambda idx: [gold[i] for i in idx]) if m.gold else None,
        meta=(lambda idx: [meta[i] for i in idx]) if any(v is not None for v in meta) else None), problems


# ----------------------------------------------------------------------------------------- reading files

def _columns(m: ColumnMapping) -> set[str]:
    """The source columns a mapping reads."""
    return {c for f in fields(m) for c in ([getattr(m, f.name)] if f.name != "rewards" else m.rewards) if c}


def _kinds_of_schema(schema: pa.Schema) -> dict[str, set[str]]:
    return {f.name: {_kind(f.type)} for f in schema}


def _kinds_of_records(objs) -> dict[str, set[str]]:
    kinds: dict[str, set[str]] = {}
    for obj in objs:
        if isinstance(obj, dict):
            for k, v in obj.items():
                kinds.setdefault(k, set()).add(_pykind(v))
    return kinds


def _read_table_json(path: Path) -> tuple[list[str], list]:
    """A logged completions table saved as JSON (``{"columns": [...], "data": [[...], ...]}``)."""
    try:
        obj = json.loads(path.read_bytes())
        cols, data = obj["columns"], obj["data"]
        if not isinstance(cols, list) or not isinstance(data, list):
            raise TypeError
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise ImportFormatError(f"{path}: not a logged table ({{\"columns\": [...], \"data\": [[...]]}}): "
                                f"{exc.__class__.__name__}") from None
    return [str(c) for c in cols], data


@dataclass
class _Source:
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


def _read(path: Path, fmt: str, user: ColumnMapping | None, start: int, tail: bool) -> _Source:
    """Read ``path`` from byte ``start`` (JSONL) and resolve its mapping.

    Raises:
        ImportFormatError: the file's fields are not what ``fmt`` needs.
        OSError, pa.ArrowException: the file cannot be read (for a Parquet file being written: not yet).
    """
    if path.suffix == ".parquet":
        pf = pq.ParquetFile(path)  # reads the footer: a file still being written fails here
        m = resolve(fmt, _kinds_of_schema(pf.schema_arrow), user, str(path))
        return _Source(path, m, _parquet_slices(path, pf, m), path.stat().st_size, [])
    if path.suffix == ".json":
        names, data = _read_table_json(path)
        recs = [(i + 1, dict(zip(names, row)) if isinstance(row, list) and len(row) == len(names) else row)
                for i, row in enumerate(data)]
        m = resolve(fmt, _kinds_of_records(o for _, o in recs), user, str(path))
        return _Source(path, m, _chunks(recs), path.stat().st_size, [])
    data, end = _read_jsonl(path, start, tail)
    t = _jsonl_arrow(data)
    if t is not None:
        m = resolve(fmt, _kinds_of_schema(t.schema), user, str(path))
        return _Source(path, m, [(lo, t.slice(lo, SLICE)) for lo in range(0, t.num_rows, SLICE)], end, [],
                       functools.cache(lambda: _first_line(path, start)))  # a tail poll of a long file: only if needed
    # the slow path: each line on its own, so each bad one is named
    first, recs, problems = _first_line(path, start), [], []
    for i, raw in enumerate(data.split(b"\n")):
        if not raw.strip():
            continue
        try:
            recs.append((first + i, json.loads(raw)))
        except (ValueError, RecursionError) as exc:
            msg = str(exc).split(": line")[0] if isinstance(exc, json.JSONDecodeError) else exc.__class__.__name__
            problems.append(Problem(str(path), first + i, f"not valid JSON ({msg})"))
    objs = [o for _, o in recs if isinstance(o, dict)]
    if not objs:  # no line is an object: every line is a problem, whatever the format
        problems += [Problem(str(path), ln, f"expected a JSON object, got {_pykind(o)}") for ln, o in recs]
        return _Source(path, ColumnMapping(), [], end, problems)
    m = resolve(fmt, _kinds_of_records(objs), user, str(path))
    return _Source(path, m, _chunks(recs), end, problems)


def _parquet_slices(path: Path, pf: pq.ParquetFile, m: ColumnMapping):
    """The file in slices, read as they are written (token lists make a slice big: fewer rows then).

    Token texts are read as a dictionary (distinct strings once, an index per token): building every
    token's string costs more than reading the rest of the file, even where the writer stored them
    plainly, and the store takes the dictionary as it is. Each row group has a dictionary of its own
    and Arrow cannot read a slice across two of them, so those slices keep to one row group; a file of
    small row groups is read plainly instead, in slices across them."""
    rows = SLICE if not any(getattr(m, f) for f in _TOKEN_FIELDS) else max(1, SLICE // 8)
    cols = sorted(_columns(m))
    sizes = [pf.metadata.row_group(g).num_rows for g in range(pf.metadata.num_row_groups)]
    dicts = _dictionary_leaves(pf, m.token_texts) if m.token_texts and min(sizes[:-1], default=rows) >= rows // 4 else []
    if dicts:
        pf.close()
        pf = pq.ParquetFile(path, read_dictionary=dicts)
        batches = (rb for g in range(len(sizes)) for rb in pf.iter_batches(batch_size=rows, row_groups=[g], columns=cols))
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


def _canonical(src: _Source, offset: int, part, file_step: int | None) -> tuple[_Batch | None, list[Problem]]:
    if isinstance(part, pa.Table):
        try:
            return _arrow_batch(part, src.mapping, file_step), []
        except _Slow:
            first = src.first_line() + offset
            part = list(zip(range(first, first + part.num_rows), part.to_pylist()))
    return _records_batch(part, src.mapping, file_step, str(src.file))


# ----------------------------------------------------------------------------------------- rows

def _const(value: Any, n: int, typ: pa.DataType) -> pa.Array:
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([value], typ)) \
        if typ == pa.string() else pa.repeat(pa.scalar(value, typ), n)


def version_of(fmt: str, m: ColumnMapping) -> tuple[str, str]:
    """``(rule version id, sha256)`` of an import's scores: its format and reward columns."""
    key = json.dumps({"format": fmt, "total": m.reward or "sum", "components": list(m.rewards)})
    sha = hashlib.sha256(key.encode()).hexdigest()
    return f"import-{fmt}@{sha[:10]}", sha


@dataclass
class _Ctx:
    """One import in progress."""

    store: Store
    cur: Any
    run_id: str
    fmt: str
    task: str
    created: Any
    cancel: threading.Event | None
    prompt_ids: dict = field(default_factory=dict)  # text -> id, prompts written by this import
    versions: dict = field(default_factory=dict)  # version id -> reward columns
    n_rollouts: int = 0
    n_tokens: int = 0
    tokens: TokenSink | None = None  # where token rows go: the table, or a shard for a large import


def _components(b: _Batch) -> tuple[list[str], list[pa.Array], pa.Array]:
    """Component names and values, and the total (the sum of the components when the source has none)."""
    names = [("source_total" if c == "total" else c) for c in b.components]
    values = list(b.components.values())
    correct = [(c, v) for c, v in zip(names, values) if _is_correctness(c)]
    if correct and "accuracy" not in names:  # the studio reads correctness from `accuracy` >= 1
        names.append("accuracy")
        values.append(pc.if_else(pc.greater_equal(correct[0][1], 1.0), 1.0, 0.0))
    if b.total is not None:
        total = b.total
    elif b.components:
        vals = np.column_stack([v.to_numpy(zero_copy_only=False) for v in b.components.values()])
        seen = ~np.isnan(vals).all(axis=1)  # TRL sums with nansum; a row no function scored has no total
        total = pa.array(np.nansum(vals, axis=1), mask=~seen)
    else:
        total = None
    return names, values, total


class _FileWriter:
    """Writes one file's good records slice by slice. A group is one prompt's (or one group
    value's) completions at one step in this file, so group ids and sample indices carry over
    from slice to slice."""

    def __init__(self, ctx: _Ctx, src: _Source, resumed: bool = False):
        self.ctx, self.src = ctx, src
        self.groups: dict[tuple, list] = {}  # (prompt or group value, step) -> [group id, rollouts so far]
        self.n = 0
        # a file read on from where an earlier import stopped (a tailed JSONL): a prompt's completions at
        # a step may straddle the two reads, and must stay one group with sample indices that go on
        self.resumed = resumed

    def _earlier(self, keys: list[tuple], by_prompt: bool) -> None:
        """Continue the groups an earlier read of this file began (newest group per prompt and step)."""
        if not (self.resumed and by_prompt and keys):
            return
        pids = [self.ctx.prompt_ids.get(t) or records.prompt_id(self.ctx.task, t) for t, _ in keys]
        rows = self.ctx.cur.execute("""
            WITH last AS (SELECT prompt_id, coalesce(train_step, -1) AS st, arg_max(group_id, rollout_id) AS g
                          FROM rollouts WHERE run_id = ? AND list_contains(?, prompt_id) GROUP BY ALL)
            SELECT l.prompt_id, l.st, l.g, max(ro.sample_idx) + 1 AS n
            FROM last l JOIN rollouts ro ON ro.group_id = l.g GROUP BY ALL""", [self.ctx.run_id, pids]).fetchall()
        found = {(pid, int(st)): (g, int(n)) for pid, st, g, n in rows}
        for (text, step), pid in zip(keys, pids):
            hit = found.get((pid, int(step)))
            if hit is not None:
                self.groups[(text, step)] = [hit[0], hit[1]]

    def write(self, b: _Batch) -> None:
        ctx, n = self.ctx, b.n
        if n == 0:
            return
        enc = b.prompt.dictionary_encode()
        texts, codes = enc.dictionary.to_pylist(), enc.indices.to_numpy().astype(np.int64)
        pids = [ctx.prompt_ids.get(t) or records.prompt_id(ctx.task, t) for t in texts]
        pid_arr = pa.array(pids, pa.string()).take(enc.indices)
        self._write_prompts(b, texts, codes, pids, pid_arr)
        step = b.step.to_numpy(zero_copy_only=False)
        step = np.where(np.isnan(step), -1, step).astype(np.int64) if step.dtype.kind == "f" else step.astype(np.int64)
        if b.group is not None:
            genc = b.group.dictionary_encode()
            gtexts, gcodes = genc.dictionary.to_pylist(), genc.indices.to_numpy().astype(np.int64)
        else:
            gtexts, gcodes = texts, codes
        _, first, inv = np.unique((gcodes << 32) | (step & 0xFFFFFFFF), return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")  # groups in the order they first appear
        keys = list(zip([gtexts[c] for c in gcodes[first[order]].tolist()], step[first[order]].tolist()))
        self._earlier([key for key in keys if key not in self.groups], b.group is None)
        fresh = [key for key in keys if key not in self.groups]
        for gid, key in zip(records.new_ids("g", len(fresh)), fresh):
            self.groups[key] = [gid, 0]
        counts = np.bincount(inv, minlength=len(first))
        gid_list, base_list = [], []
        for key, c in zip(keys, counts[order].tolist()):
            state = self.groups[key]
            gid_list.append(state[0])
            base_list.append(state[1])
            state[1] += c
        gid_of, base = np.empty(len(first), object), np.empty(len(first), np.int64)
        gid_of[order], base[order] = gid_list, base_list
        by_group = np.argsort(inv, kind="stable")
        sample_idx = np.empty(n, np.int64)
        sample_idx[by_group] = np.arange(n) - np.repeat(np.cumsum(counts) - counts, counts)
        sample_idx += base[inv]
        ids = pa.array(records.new_ids("r", n), pa.string())
        gids = pa.array(gid_of, pa.string()).take(pa.array(inv))
        for a, z in _token_slices(b):
            _write_rows(ctx, self.src, b.slice(a, z) if (a, z) != (0, n) else b, ids.slice(a, z - a),
                        pid_arr.slice(a, z - a), gids.slice(a, z - a), sample_idx[a:z])
        self.n += n

    def _write_prompts(self, b: _Batch, texts: list, codes: np.ndarray, pids: list, pid_arr: pa.Array) -> None:
        """The prompts of this slice that this import has not written yet."""
        _, first = np.unique(codes, return_index=True)
        new = np.array([i for i in first if texts[codes[i]] not in self.ctx.prompt_ids], np.int64)
        if not len(new):
            return
        self.ctx.store.write({"prompts": pa.table({
            "prompt_id": pid_arr.take(pa.array(new)), "task": _const(self.ctx.task, len(new), pa.string()),
            "text": b.prompt.take(pa.array(new)),
            "gold": pa.array(b.gold(new) if b.gold else [None] * len(new), pa.string()),
            "meta": pa.array(b.meta(new) if b.meta else [None] * len(new), pa.string())})}, self.ctx.cur)
        for i in new:
            self.ctx.prompt_ids[texts[codes[i]]] = pids[codes[i]]


def _token_slices(b: _Batch) -> list[tuple[int, int]]:
    if b.n_tokens is None or b.n_tokens.clip(0).sum() <= TOKEN_SLICE:
        return [(0, b.n)]
    cum = np.cumsum(b.n_tokens.clip(0))
    cuts = [0]
    while cuts[-1] < b.n:
        base = cum[cuts[-1] - 1] if cuts[-1] else 0
        cuts.append(max(int(np.searchsorted(cum, base + TOKEN_SLICE, side="right")), cuts[-1] + 1))
    return list(zip(cuts[:-1], cuts[1:]))


def _explode(a: pa.Array, lengths: np.ndarray, typ: pa.DataType) -> pa.Array:
    """A list column's values, one per token row; rows where the list is null get nulls."""
    flat = pc.list_flatten(a)
    if a.null_count:
        valid = np.repeat(a.is_valid().to_numpy(zero_copy_only=False), lengths)
        idx = np.full(len(valid), 0, np.int64)
        idx[valid] = np.arange(int(valid.sum()))
        flat = flat.take(pa.array(idx, mask=~valid)) if len(flat) else pa.nulls(len(valid), flat.type)
    if pa.types.is_dictionary(flat.type) and typ == pa.string():  # token texts: the store reads the dictionary
        return flat.cast(pa.dictionary(flat.type.index_type, typ))
    return flat.cast(typ)


def _write_rows(ctx: _Ctx, src: _Source, b: _Batch, ids, pids, gids, sample_idx) -> None:
    if ctx.cancel is not None and ctx.cancel.is_set():
        raise _Cancelled
    n = b.n
    frames: dict[str, pa.Table] = {}
    n_tok = b.n_tokens
    frames["rollouts"] = pa.table({
        "rollout_id": ids, "run_id": _const(ctx.run_id, n, pa.string()), "train_step": b.step,
        "prompt_id": pids, "group_id": gids, "sample_idx": pa.array(sample_idx, pa.int32()),
        "text": b.completion,
        "n_tokens": pa.array(n_tok, pa.int32(), mask=n_tok < 0) if n_tok is not None else pa.nulls(n, pa.int32()),
        "finish_reason": b.finish_reason if b.finish_reason is not None else pa.nulls(n, pa.string()),
        "created_at": pa.repeat(pa.scalar(ctx.created, pa.timestamp("us")), n),
        "train_advantage": b.advantage if b.advantage is not None else pa.nulls(n, pa.float64())})
    names, values, total = _components(b)
    if total is not None:
        vid, _ = version_of(ctx.fmt, src.mapping)
        if vid not in ctx.versions:
            _write_version(ctx, src, vid)
        keep = [pc.is_valid(v) for v in values]  # a reward function with no value for a row: no row
        ids_k = [ids] + [ids.filter(k) for k in keep]
        vals_k = [total] + [v.filter(k) for v, k in zip(values, keep)]
        sizes = [len(x) for x in vals_k]
        frames["rewards"] = pa.table({
            "rollout_id": pa.concat_arrays(ids_k),
            "rule_version_id": _const(vid, sum(sizes), pa.string()),
            "component": pa.DictionaryArray.from_arrays(
                pa.array(np.repeat(np.arange(len(sizes), dtype=np.int32), sizes)), pa.array(["total"] + names)),
            "value": pa.concat_arrays([v.cast(pa.float64()) for v in vals_k])})
    if b.tokens:
        lengths = n_tok.clip(0)
        total_tok = int(lengths.sum())
        rows = np.repeat(np.arange(n), lengths)
        pos = np.arange(total_tok) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        # each token's rollout id as an index into the slice's ids: no string copied per token
        tok_cols = {"rollout_id": pa.DictionaryArray.from_arrays(pa.array(rows, pa.int32()), ids),
                    "pos": pa.array(pos, pa.int32())}
        values_col = None
        for fld, a in b.tokens.items():
            col, typ = _TOKEN_FIELDS[fld]
            if fld == "values":
                values_col = _explode(a, lengths, typ)
            else:
                tok_cols[col] = _explode(a, lengths, typ)
        if len(tok_cols) > 2:
            ctx.tokens.add(pa.table(tok_cols))
            ctx.n_tokens += total_tok
        if values_col is not None:
            keep = pc.is_valid(values_col)
            frames["token_scores"] = pa.table({
                "rollout_id": tok_cols["rollout_id"].filter(keep), "pos": tok_cols["pos"].filter(keep),
                "policy_version": _const(f"value-import@{ctx.run_id}", int(pc.sum(keep.cast(pa.int64())).as_py() or 0),
                                         pa.string()),
                "value": values_col.filter(keep)})
    ctx.store.write(frames, ctx.cur)
    ctx.n_rollouts += n


def _write_version(ctx: _Ctx, src: _Source, vid: str) -> None:
    m = src.mapping
    total = m.reward or ("the sum of " + ", ".join(m.rewards))
    source = (f"# import {ctx.fmt}: scores as the training run logged them (not re-runnable)\n"
              f"# total = {total}\n# components = {', '.join(m.rewards) or 'none'}\n")
    ctx.store.write({"rule_versions": pa.table({
        "rule_version_id": [vid], "name": [f"import-{ctx.fmt}"], "source": [source],
        "sha256": [version_of(ctx.fmt, m)[1]],
        "created_at": pa.array([ctx.created], pa.timestamp("us")),
        "note": [f"imported with run {ctx.run_id} from {src.file}"]})}, ctx.cur)
    ctx.versions[vid] = list(m.rewards)


# ----------------------------------------------------------------------------------------- import

def _find_run(cur, config: dict) -> str | None:
    """An import run made from the same request (format, paths, mapping, task): importing again continues it."""
    for run_id, cfg in cur.execute("SELECT run_id, config FROM runs WHERE kind = 'import' "
                                   "ORDER BY created_at DESC").fetchall():
        try:
            if json.loads(cfg or "null") == config:
                return run_id
        except ValueError:
            continue
    return None


def _file_state(cur, run_id: str) -> dict[str, int]:
    """Bytes consumed so far of each file of an import run."""
    return dict(cur.execute("SELECT path, max(consumed) FROM import_files WHERE run_id = ? GROUP BY path",
                            [run_id]).fetchall())


def import_run(store: Store, paths: str | Path | list, fmt: str | None = None, *, mapping: ColumnMapping | None = None,
               on_error: str = "abort", name: str | None = None, task: str = "import", run_id: str | None = None,
               progress: Callable[[int, int], None] | None = None, cancel: threading.Event | None = None,
               tail: bool = False) -> ImportReport:
    """Import rollouts from files or run directories, in one transaction.

    Args:
        paths: files, or directories (expanded to their shards, sorted by step).
        fmt: one of :data:`FORMATS`; None detects it from the first path.
        mapping: overrides the format's fields (``generic`` needs one: prompt and completion at least).
        on_error: ``"abort"`` raises :class:`MalformedInput` at the first file with bad records and
            writes nothing; ``"skip"`` imports the rest and lists them in ``report.skipped``.
        run_id: an import run to append to. Without one, a run made from the same format, paths,
            mapping and task is continued (only what it has not read yet is imported), else a new run.
        progress: called with (bytes read, bytes to read).
        cancel: set it to stop; nothing is written and the report says ``cancelled``.
        tail: read only complete lines and leave unreadable Parquet files for later
            (``report.waiting``): a run still being written (:class:`studio.ingest.tail.Tailer`).

    Raises:
        ImportFormatError: a file's fields are not what the format needs (nothing written).
        MalformedInput: bad records with ``on_error="abort"`` (nothing written).
    """
    t0 = time.perf_counter()
    if on_error not in ("abort", "skip"):
        raise ValueError(f"on_error must be 'abort' or 'skip', not {on_error!r}")
    roots = [Path(p).expanduser().resolve() for p in (paths if isinstance(paths, (list, tuple)) else [paths])]
    if not roots:
        raise ImportFormatError("no paths to import")
    for r in roots:
        if not r.exists():
            raise ImportFormatError(f"{r} does not exist")
    fmt = fmt or detect_format(roots[0])
    if fmt not in FORMATS:
        raise ImportFormatError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
    if fmt == "generic" and (mapping is None or not (mapping.prompt and mapping.completion)):
        raise ImportFormatError("the generic format needs a column mapping naming prompt and completion "
                                "(--map prompt=COLUMN --map completion=COLUMN)")
    files = list(dict.fromkeys(f for r in roots for f in _shards(r, fmt)))
    config = {"format": fmt, "paths": [str(r) for r in roots], "mapping": mapping.as_dict() if mapping else None,
              "task": task}
    report = ImportReport(run_id)
    sink: TokenSink | None = None
    try:
        with store.transaction() as cur:
            if run_id is not None:
                kind = cur.execute("SELECT kind FROM runs WHERE run_id = ?", [run_id]).fetchall()
                if not kind or kind[0][0] != "import":
                    raise ValueError(f"{run_id} is not an import run in this store")
            run_id = run_id or _find_run(cur, config)
            new_run = run_id is None
            run_id = run_id or records.new_id("run_")
            report.run_id = run_id
            done = {} if new_run else _file_state(cur, run_id)
            todo = []
            for f in files:
                size = f.stat().st_size
                start = done.get(str(f))
                if start is None:
                    todo.append((f, 0, size))
                elif f.suffix == ".jsonl" and size > start:  # lines appended since: read from there
                    todo.append((f, start, size - start))
            ctx = _Ctx(store, cur, run_id, fmt, task, records.now(), cancel)
            ctx.tokens = sink = TokenSink(store, cur, run_id)
            total_bytes, read_bytes = sum(s for *_, s in todo), 0
            if progress:
                progress(0, total_bytes)
            reads = _ReadAhead(_reads(todo, fmt, mapping, tail))
            try:
                for *_, size in todo:
                    if cancel is not None and cancel.is_set():
                        raise _Cancelled
                    _import_file(ctx, report, reads, on_error, tail)
                    read_bytes += size
                    if progress:
                        progress(read_bytes, total_bytes)
                sink.finish()
            finally:
                reads.close()
            if new_run and (report.n_files or not tail):
                store.write({"runs": pa.table({
                    "run_id": [run_id], "kind": ["import"], "name": [name or _default_name(roots[0])],
                    "policy": pa.nulls(1, pa.string()), "task": [task], "config": [json.dumps(config)],
                    "created_at": pa.array([ctx.created], pa.timestamp("us")), "status": ["done"]})}, cur)
            elif new_run:
                report.run_id = None
            report.n_rollouts, report.n_tokens = ctx.n_rollouts, ctx.n_tokens
            report.rule_versions = list(ctx.versions)
    except BaseException as exc:
        if sink is not None:
            sink.discard()  # the transaction rolled back: its shard goes too
        if not isinstance(exc, _Cancelled):
            raise
        report = ImportReport(report.run_id if not new_run else None, status="cancelled")
    report.seconds = time.perf_counter() - t0
    return report


class _Cancelled(Exception):
    pass


def _default_name(root: Path) -> str:
    if root.is_file():
        return root.stem
    return root.parent.name if root.name == "completions" else root.name


def _reads(todo: list, fmt: str, user: ColumnMapping | None, tail: bool):
    """Everything the import reads, in order, and nothing it writes. Per file: ``(f, start, stat,
    source)`` (the source: what :func:`_read` gave, or the exception it raised), then ``(batch,
    problems)`` per slice (:func:`_canonical`), the exception that stopped a file whose data does not
    read (its footer did), and None at the file's end."""
    for f, start, _ in todo:
        st = f.stat()
        try:
            src = _read(f, fmt, user, start, tail)
        except (OSError, pa.ArrowException, UnicodeDecodeError, ImportFormatError) as exc:
            yield f, start, st, exc
            continue
        yield f, start, st, src
        file_step = _step_of_name(f)
        try:
            for offset, part in src.slices:
                yield _canonical(src, offset, part, file_step)
        except (OSError, pa.ArrowException) as exc:  # a Parquet file whose footer reads but whose data does not
            yield exc
        yield None  # the file's end


class _ReadAhead:
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


def _import_file(ctx: _Ctx, report: ImportReport, reads: _ReadAhead, on_error: str, tail: bool) -> None:
    """Write the next file of ``reads`` (see :func:`_reads`)."""
    f, start, st, src = next(reads)
    if isinstance(src, Exception):
        exc = src
        being_written = f.suffix == ".json" or (f.suffix == ".parquet" and not isinstance(exc, ImportFormatError))
        if tail and being_written:  # no Parquet footer yet, or the JSON's end is missing: try again next poll
            report.waiting.append(str(f))
            return
        if isinstance(exc, ImportFormatError):
            raise exc
        _problems(report, [Problem(str(f), None, f"cannot read it ({str(exc).splitlines()[0][:200]})")], on_error)
        return
    problems, writer = list(src.problems), _FileWriter(ctx, src, resumed=start > 0)
    for item in reads:
        if item is None:
            break
        if isinstance(item, Exception):
            problems.append(Problem(str(f), None, f"cannot read the rest ({str(item).splitlines()[0][:200]})"))
            continue
        b, probs = item
        problems += probs
        if b is not None and not (problems and on_error == "abort"):  # aborting: only look for the rest
            writer.write(b)
    problems.sort(key=lambda p: p.line or 0)
    _problems(report, problems, on_error)
    if src.end == start and not writer.n:
        return  # tail: nothing complete yet
    n = writer.n
    report.n_files += 1
    ctx.store.write({"import_files": pa.table({
        "run_id": [ctx.run_id], "path": [str(f)], "format": [ctx.fmt],
        "size": pa.array([max(st.st_size, src.end)], pa.int64()),
        "mtime": [st.st_mtime], "consumed": pa.array([src.end], pa.int64()), "n_rows": pa.array([n], pa.int32()),
        "n_skipped": pa.array([len(problems)], pa.int32()),
        "imported_at": pa.array([records.now()], pa.timestamp("us"))})}, ctx.cur)


def _problems(report: ImportReport, problems: list[Problem], on_error: str) -> None:
    if not problems:
        return
    if on_error == "abort":
        raise MalformedInput(problems[:MAX_PROBLEMS], len(problems))
    report.n_skipped += len(problems)
    report.skipped.extend(problems[:max(0, MAX_PROBLEMS - len(report.skipped))])




def __getattr__(name: str):
    if name == "Tailer":  # studio.ingest.tail builds on import_run; importers.Tailer saves a second import
        from studio.ingest.tail import Tailer

        return Tailer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
