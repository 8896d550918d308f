r"""Bring a prompt set: a person's data file becomes a task stored in the store.

A JSONL, JSON, Parquet or CSV file, or a folder ``datasets`` wrote with ``save_to_disk`` (a
``DatasetDict`` of splits, or one ``Dataset``), is read with a column mapping
(:class:`PromptSetConfig`): the prompt text *or* a chat ``messages`` column, the gold answer
column (its answer read by :func:`studio.tasks.answers.gold_answer`: GSM8K's ``#### 72``,
MATH's ``\boxed{…}``, a bare answer), and optionally id, split and level columns; every other
column is kept in the prompt's ``meta``. Presets read known shapes without a mapping::

    gsm8k   question → prompt, answer ("… #### 72") → gold
    math    problem → prompt, solution ("… \boxed{72}") → gold, level → level (type is kept in meta)
    auto    gsm8k or math when the columns say so, else the usual names (prompt, question,
            messages, answer, solution, …)

A row's split is its split column's value, else its ``datasets`` split, else the ``split``
setting, else the file's name when that is a split name (``train.jsonl``), else ``train``.

:func:`add_prompt_set` reads and checks everything first; only then does it write the
``tasks`` row (the spec that rebuilds the task: ``studio.tasks.dataset``) and every prompt row
in one transaction, and make the task known to this process (``studio.tasks.define``). Bad
input raises :class:`PromptSetError` naming the file, row and column, and nothing is stored.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import pandas as pd

from studio.configs import problems, setting
from studio.errors import StudioError
from studio.store import Store
from studio.store.files import sha256_of
from studio.store.records import now, prompt_rows
from studio.tasks import Prompt, TaskParseError, define, from_spec, get_task, task_names
from studio.tasks.answers import EXTRACTORS, gold_answer
from studio.tasks.dataset import check_spec
from studio.tasks.text import STEP_MODES

PRESETS: dict[str, dict[str, str]] = {  # preset -> field -> column
    "gsm8k": {"prompt": "question", "answer": "answer"},
    "math": {"prompt": "problem", "answer": "solution", "level": "level"},
}
# what ``auto`` looks for when no preset fits, field -> candidate columns in order
USUAL = {
    "messages": ("messages", "conversation", "chat"),
    "prompt": ("prompt", "question", "problem", "input", "instruction", "query"),
    "answer": ("answer", "solution", "ground_truth", "gold", "target", "reference", "final_answer"),
    "split": ("split",),
    "level": ("level", "difficulty"),
    "id": ("id", "unique_id", "idx"),
}
SPLIT_NAMES = ("train", "test", "validation", "valid", "val", "dev", "eval")  # a file named so gives its split
GOLD_READERS = ("auto", "hash", "boxed", "answer_colon", "last_number", "whole")
FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet", ".pq": "parquet",
           ".csv": "csv"}
MAX_NAMED = 3  # problems named in a refusal's message (the report or the exception lists them all)


class PromptSetError(StudioError, ValueError):
    """A prompt set that cannot be stored; the message names the file, row and column. Nothing was written."""

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = problems or []


@dataclass
class PromptSetConfig:
    """How a data file becomes a task (``rollout-studio task add`` is generated from these fields)."""

    name: str = setting("", "the task's name: letters, digits, '_', '-' or '.', starting with a letter")
    preset: str = setting("auto", "a known shape read without a mapping (auto: picked from the columns; none: "
                                  "only the columns given)", choices=("auto", "gsm8k", "math", "none"))
    prompt: str | None = setting(None, "column of the prompt text")
    messages: str | None = setting(None, "column of chat messages, a list of {role, content} (instead of a "
                                         "prompt column)")
    answer: str | None = setting(None, "column of the gold answer or reference solution")
    id_column: str | None = setting(None, "column of the prompt's id (kept in meta as 'id')", flag="--id",
                                    label="id column")
    split_column: str | None = setting(None, "column of the prompt's split", label="split column")
    split: str | None = setting(None, "split of rows without a split column or datasets split (default: the "
                                      "file's name when it is one, like train.jsonl, else train)")
    level: str | None = setting(None, "column of the prompt's level or difficulty", label="level column")
    gold: str = setting("auto", "how the gold answer is read from the answer column (auto: '#### n', else the "
                                "last \\boxed{}, else a short answer as it is; whole: the text as it is)",
                        choices=GOLD_READERS, label="gold reader")
    extract: str = setting("auto", "how a completion's final answer is read", choices=tuple(EXTRACTORS),
                           label="answer extractor")
    regex: str | None = setting(None, "the regular expression of the 'regex' extractor (its first group is the "
                                      "answer)")
    steps: str = setting("auto", "how a completion is cut into steps", choices=STEP_MODES, label="step mode")
    system: str | None = setting(None, "system prompt given before each prompt")
    thinking: bool | None = setting(None, "the chat template's thinking switch (on / off; unset: the template's "
                                          "default)")
    description: str | None = setting(None, "one line saying what the prompts are")
    skip_unreadable: bool = setting(False, "skip rows that cannot be read (no gold answer, empty prompt, a "
                                           "malformed line) and count them, instead of storing nothing")

    def mapping(self) -> dict[str, str | None]:
        """The columns given, field -> column (None where the preset or auto decides)."""
        return {"prompt": self.prompt, "messages": self.messages, "answer": self.answer, "id": self.id_column,
                "split": self.split_column, "level": self.level}


@dataclass
class TaskReport:
    """What :func:`add_prompt_set` stored."""

    name: str
    n_prompts: int
    splits: dict[str, int]
    files: list[str]
    preset: str
    mapping: dict[str, str | None]
    n_duplicates: int = 0  # rows whose prompt text repeats an earlier row's (stored once)
    skipped: list[str] = field(default_factory=list)  # unreadable rows skipped (skip_unreadable), "where: why"

    def summary(self) -> str:
        splits = ", ".join(f"{s} {n:,}" for s, n in self.splits.items())
        cols = ", ".join(f"{k}={v}" for k, v in self.mapping.items() if v)
        extra = (f"; {self.n_duplicates:,} repeated prompts stored once" if self.n_duplicates else "") + (
            f"; {len(self.skipped):,} unreadable rows skipped" if self.skipped else "")
        return (f"task {self.name!r}: {self.n_prompts:,} prompts ({splits}) from {len(self.files)} "
                f"source{'s' * (len(self.files) != 1)}, preset {self.preset} ({cols}){extra}")


# -- reading ------------------------------------------------------------------------------------
@dataclass
class Source:
    """One file or folder read: its columns and its rows, each with where it is and its split."""

    path: Path
    format: str
    columns: list[str]
    rows: list[tuple[str, dict[str, Any] | str, str | None]]  # (where, record or why unreadable, datasets split)


def _plain(v: Any) -> Any:
    """A value as JSON holds it (numpy scalars and arrays, NaN, timestamps from Parquet or datasets)."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)) or type(v).__name__ == "ndarray":
        return [_plain(x) for x in v]
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        v = v.item()
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)  # timestamps, decimals: as text


def _frame_rows(label: str, df: pd.DataFrame, split: str | None) -> list:
    return [(f"{label} row {i + 1}", rec, split) for i, rec in enumerate(df.to_dict("records"))]


def read_source(path: str | Path) -> Source:
    """The columns and rows of one file or ``datasets`` folder; :class:`PromptSetError` when it is missing,
    of a format not read here, or unreadable (a malformed JSONL line is a row that cannot be read)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise PromptSetError(f"no such file or folder: {path}")
    if p.is_dir():
        return _read_datasets(p)
    fmt = FORMATS.get(p.suffix.lower())
    if fmt is None:
        raise PromptSetError(f"{p}: cannot read a {p.suffix or 'suffix-less'} file; a prompt set is JSONL, JSON, "
                             f"Parquet or CSV ({', '.join(FORMATS)}), or a folder saved by datasets' save_to_disk")
    try:
        if fmt in ("jsonl", "json"):
            return _read_json(p, fmt)
        if fmt == "parquet":
            df = pd.read_parquet(p)
        else:  # as text: '007' and '1,000' stay what the file says; empty cells are empty
            df = pd.read_csv(p, dtype=str, keep_default_na=False)
    except PromptSetError:
        raise
    except Exception as exc:  # pyarrow / pandas say why in their own words
        raise PromptSetError(f"{p} is not a readable {fmt} file: {str(exc).splitlines()[0] if str(exc) else exc!r}"
                             ) from None
    return Source(p, fmt, [str(c) for c in df.columns], _frame_rows(str(p), df, None))


def _read_json(p: Path, fmt: str) -> Source:
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise PromptSetError(f"{p} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if fmt == "json" and text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PromptSetError(f"{p}:{exc.lineno}: not valid JSON ({exc.msg})") from None
        lines = [(f"{p} record {i + 1}", r) for i, r in enumerate(records)]
    else:
        lines = []
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                lines.append((f"{p}:{i}", json.loads(line)))
            except json.JSONDecodeError as exc:
                lines.append((f"{p}:{i}", f"malformed JSON line ({exc.msg} at column {exc.colno})"))
    columns: dict[str, None] = {}
    rows = []
    for where, rec in lines:
        if not isinstance(rec, (dict, str)):
            rec = f"a record is a JSON object, got {type(rec).__name__}"
        if isinstance(rec, dict):
            columns.update(dict.fromkeys(map(str, rec)))
        rows.append((where, rec, None))
    if not rows:
        raise PromptSetError(f"{p} holds no records")
    return Source(p, fmt, list(columns), rows)


def _read_datasets(p: Path) -> Source:
    if not ((p / "dataset_dict.json").exists() or (p / "dataset_info.json").exists()):
        raise PromptSetError(f"{p} is a folder but not a datasets folder (save_to_disk writes dataset_dict.json or "
                             "dataset_info.json); give a JSONL, JSON, Parquet or CSV file, or such a folder")
    try:
        import datasets
    except ImportError:
        raise PromptSetError("reading a datasets folder needs the 'datasets' package: pip install datasets") from None
    try:
        ds = datasets.load_from_disk(str(p))
        parts = dict(ds) if isinstance(ds, datasets.DatasetDict) else {None: ds}
        frames = {split: part.to_pandas() for split, part in parts.items()}
    except Exception as exc:
        raise PromptSetError(f"{p} is not a readable datasets folder: {str(exc).splitlines()[0] if str(exc) else exc!r}"
                             ) from None
    columns = list(dict.fromkeys(str(c) for df in frames.values() for c in df.columns))
    rows = [r for split, df in frames.items() for r in _frame_rows(f"{p} [{split}]" if split else str(p), df, split)]
    return Source(p, "datasets", columns, rows)


# -- columns ------------------------------------------------------------------------------------
def resolve(config: PromptSetConfig, source: Source) -> tuple[str, dict[str, str | None]]:
    """``(preset used, field -> column)`` for ``source``: the columns given, else the preset's, else
    (unless the preset is ``none``) the usual names. Raises :class:`PromptSetError` naming the file's columns."""
    cols = source.columns
    has = ", ".join(repr(c) for c in cols) or "none"
    given = config.mapping()
    for f, col in given.items():
        if col is not None and col not in cols:
            raise PromptSetError(f"{source.path} has no column {col!r} (given as the {f} column); its columns: {has}")
    if given["prompt"] and given["messages"]:
        raise PromptSetError("give a prompt column or a messages column, not both")
    preset = config.preset
    if preset == "auto":
        preset = next((name for name, m in PRESETS.items() if set(m.values()) <= set(cols)), "none")
    reads = PRESETS.get(preset, {})
    mapping = dict(given)

    def pick(f: str) -> str | None:
        if f in reads:
            if reads[f] in cols:
                return reads[f]
            if f in ("prompt", "answer"):
                raise PromptSetError(f"{source.path} has no column {reads[f]!r}, which preset {preset} reads as the "
                                     f"{f}; its columns: {has}. Name the columns (--prompt or --messages, --answer) "
                                     "or pick another preset")
            return None
        if config.preset == "none":
            return None
        return next((c for c in USUAL[f] if c in cols and c not in mapping.values()), None)

    if not given["prompt"] and not given["messages"]:
        if "prompt" in reads or not (messages := pick("messages")):
            mapping["prompt"] = pick("prompt")
        else:
            mapping["messages"] = messages
    for f in ("answer", "split", "level", "id"):
        if mapping[f] is None:
            mapping[f] = pick(f)
    if not mapping["prompt"] and not mapping["messages"]:
        raise PromptSetError(f"cannot tell which column of {source.path} holds the prompt; its columns: {has}. "
                             "Name it (--prompt COL, or --messages COL for chat messages), or pick a preset "
                             "(--preset gsm8k | math)")
    if not mapping["answer"] and not mapping["messages"]:
        raise PromptSetError(f"cannot tell which column of {source.path} holds the gold answer; its columns: {has}. "
                             "Name it (--answer COL)")
    return preset, mapping


def _messages(value: Any) -> tuple[tuple[dict[str, str], ...], str | None]:
    """``(prompt messages, reference)``: a chat's messages up to its last user turn, and the content
    of a trailing assistant turn (an SFT-style row's solution) when there is one."""
    if isinstance(value, str):
        value = json.loads(value)  # a CSV cell holds the list as JSON text
    if not isinstance(value, list) or not value:
        raise ValueError("is not a non-empty list of {role, content} messages")
    msgs = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"message {i + 1} is not a {{role, content}} object with text content")
        msgs.append({"role": m["role"], "content": m["content"]})
    reference = None
    while msgs and msgs[-1]["role"] == "assistant":
        reference = msgs.pop()["content"]
    if not msgs or msgs[-1]["role"] != "user":
        raise ValueError("has no user message to answer")
    return tuple(msgs), reference


def _text(value: Any) -> str | None:
    value = _plain(value)
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def read_row(rec: dict[str, Any], mapping: dict[str, str | None], split: str, gold_how: str) -> Prompt:
    """One record as a :class:`Prompt`; ``ValueError`` naming the column when it cannot be read."""
    messages, reference = None, None
    if mapping["messages"]:
        col = mapping["messages"]
        if _plain(rec.get(col)) is None:
            raise ValueError(f"column {col!r} is empty")
        try:
            messages, reference = _messages(_plain(rec[col]))
        except (ValueError, json.JSONDecodeError) as exc:
            raise ValueError(f"column {col!r} {exc}") from None
        text = messages[-1]["content"]
    else:
        text = _text(rec.get(mapping["prompt"]))
        if not text or not text.strip():
            raise ValueError(f"column {mapping['prompt']!r} is empty")
    if mapping["answer"]:
        given = _text(rec.get(mapping["answer"]))
        if given and given.strip():
            reference = given
        elif reference is None:  # a chat's trailing assistant turn stands in for an empty answer cell
            raise ValueError(f"column {mapping['answer']!r} is empty: no gold answer")
    answer = reference.strip() if gold_how == "whole" and reference else gold_answer(reference, gold_how)
    if not answer:
        col = mapping["answer"] or mapping["messages"]
        raise ValueError(f"no gold answer can be read from column {col!r} ({_clip(reference)}); it needs "
                         "'#### n', a \\boxed{…} or a short answer (set the gold reader, or skip unreadable rows)")
    meta: dict[str, Any] = {"split": split}
    for f in ("level", "id"):
        if mapping[f] and (v := _text(rec.get(mapping[f]))) not in (None, ""):
            meta[f] = v
    used = {c for c in mapping.values() if c}
    meta |= {k: pv for k, v in rec.items() if k not in used and k not in meta and (pv := _plain(v)) is not None}
    return Prompt(text=text, gold={"answer": answer, "solution": reference}, meta=meta, messages=messages)


def _clip(text: str | None, n: int = 60) -> str:
    t = " ".join(str(text).split())
    return repr(t if len(t) <= n else t[:n - 1] + "…")


def _split_of(rec: dict, mapping: dict, ds_split: str | None, config: PromptSetConfig, path: Path) -> str:
    if mapping["split"]:
        v = _text(rec.get(mapping["split"]))
        if v and v.strip():
            return v.strip()
    if ds_split:
        return ds_split
    if config.split:
        return config.split
    return path.stem.lower() if path.stem.lower() in SPLIT_NAMES else "train"


# -- adding -------------------------------------------------------------------------------------
def check_config(config: PromptSetConfig) -> dict[str, Any]:
    """The task spec's settings part (name, answer, steps, template), or :class:`PromptSetError`
    naming what is wrong: a setting out of its choices, an unusable extractor or name, a built-in
    task's name."""
    bad = problems(config)
    if bad:
        raise PromptSetError("; ".join(bad))
    if not config.name:
        raise PromptSetError("a prompt set needs a task name")
    if config.name in task_names() and get_task(config.name).spec.get("kind") == "builtin":
        raise PromptSetError(f"{config.name!r} is a built-in task; give the prompt set another name")
    template = {k: v for k, v in (("system", config.system), ("thinking", config.thinking)) if v is not None}
    spec = {"kind": "dataset", "name": config.name, "description": config.description,
            "answer": {"extract": config.extract, "regex": config.regex}, "steps": config.steps, "template": template}
    try:
        check_spec(spec)
    except TaskParseError as exc:
        raise PromptSetError(str(exc)) from None
    return spec


def _existing(store: Store, name: str, cur=None) -> str | None:
    rows = (cur or store.cursor()).execute("SELECT source, n_prompts FROM tasks WHERE name = ?", [name]).fetchall()
    if not rows:
        return None
    source, n = rows[0]
    return (f"this store already has a task {name!r} ({n:,} prompts from {source}); give the new prompt set "
            "another name")


def add_prompt_set(store: Store, paths: str | Path | list[str | Path], config: PromptSetConfig) -> TaskReport:
    """Read ``paths`` (files or ``datasets`` folders) as the prompt set ``config`` describes and store
    it as a task: the ``tasks`` row and every prompt row in one transaction, then the task is known to
    this process (and to every process that opens the store).

    Raises:
        PromptSetError: a missing or unreadable file, a column the mapping names that a file lacks (its
            columns are listed), rows that cannot be read (their file, row and column; all of them in
            ``.problems``) unless ``skip_unreadable``, an invalid setting, or a name a built-in task or a
            stored task has. Nothing is stored then.
    """
    spec = check_config(config)
    if (why := _existing(store, config.name)) is not None:
        raise PromptSetError(why)
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if not paths:
        raise PromptSetError("no files given: name the prompt set's file(s)")
    sources = [read_source(p) for p in paths]
    preset, mapping = resolve(config, sources[0])
    for s in sources[1:]:
        lacking = [c for c in mapping.values() if c and c not in s.columns]
        if lacking:
            raise PromptSetError(f"{s.path} has no column {lacking[0]!r}, which {sources[0].path} has; its "
                                 f"columns: {', '.join(map(repr, s.columns))}. The files of one prompt set share "
                                 "their columns")
    prompts, bad, files = [], [], []
    for s in sources:
        n_rows = 0
        for where, rec, ds_split in s.rows:
            if isinstance(rec, str):
                bad.append(f"{where}: {rec}")
                continue
            try:
                prompts.append(read_row(rec, mapping, _split_of(rec, mapping, ds_split, config, s.path), config.gold))
                n_rows += 1
            except ValueError as exc:
                bad.append(f"{where}: {exc}")
        files.append({"path": str(s.path.resolve()), "sha256": sha256_of(s.path), "format": s.format,
                      "rows": n_rows})
    if bad and not config.skip_unreadable:
        head = "; ".join(bad[:MAX_NAMED]) + (" …" if len(bad) > MAX_NAMED else "")
        raise PromptSetError(f"{len(bad)} unreadable row{'s' * (len(bad) != 1)}, nothing was stored "
                             f"(skip_unreadable / --skip-unreadable stores the rest): {head}", bad)
    task = from_spec(spec)
    rows = prompt_rows(task, prompts) if prompts else pd.DataFrame()
    if rows.empty:
        raise PromptSetError(f"no readable prompts in {', '.join(str(s.path) for s in sources)}"
                             + (f" ({len(bad)} unreadable rows: {bad[0]} …)" if bad else ""), bad)
    splits: dict[str, int] = {}
    for m in rows["meta"]:
        split = json.loads(m)["split"]
        splits[split] = splits.get(split, 0) + 1
    spec |= {"splits": list(splits), "steps": config.steps,
             "source": {"files": files, "preset": preset, "mapping": mapping, "gold": config.gold}}
    task = from_spec(spec)  # the spec as stored rebuilds the task: checked before anything is written
    one = len(files) == 1
    task_row = pd.DataFrame([{
        "name": config.name, "kind": "dataset", "spec": json.dumps(spec),
        "source": files[0]["path"] if one else "; ".join(f["path"] for f in files),
        "sha256": files[0]["sha256"] if one else hashlib.sha256("".join(f["sha256"] for f in files).encode()).hexdigest(),
        "n_prompts": len(rows), "created_at": now()}])
    with store.transaction() as cur:
        if (why := _existing(store, config.name, cur)) is not None:  # added meanwhile by another caller
            raise PromptSetError(why)
        store.write({"tasks": task_row, "prompts": rows}, cur)
    define(spec)
    return TaskReport(name=task.name, n_prompts=len(rows), splits=splits, files=[f["path"] for f in files],
                      preset=preset, mapping=mapping, n_duplicates=len(prompts) - len(rows), skipped=bad)


def config_from(settings: dict[str, Any]) -> PromptSetConfig:
    """A :class:`PromptSetConfig` from keyword settings (the Python API's), naming an unknown one."""
    known = {f.name for f in fields(PromptSetConfig)}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise PromptSetError(f"unknown prompt set setting{'s' * (len(unknown) > 1)} {', '.join(unknown)}; "
                             f"known: {', '.join(sorted(known))}")
    return PromptSetConfig(**settings)

