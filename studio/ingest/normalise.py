"""A slice of one file's records in canonical form (:class:`Batch`): the columns the store's
rows are made from, whatever format the file is in.

Two ways there, the same result: :func:`arrow_batch` turns a clean Arrow slice into canonical
columns in vectorised passes and raises :class:`Slow` at the first thing that needs a
record-by-record look (a null prompt, ragged token lists, a fractional step, ...);
:func:`records_batch` checks every record on its own, keeps the good ones, and names each bad
one as a :class:`~studio.ingest.errors.Problem` (file, 1-based line or row, why).

Chat prompts keep their messages. A prompt given as ``{role, content}`` messages, or as a
string a chat template made (verl logs the templated ``input``; :mod:`studio.tasks.chat` reads
the messages back), becomes: its messages (``prompts.messages``), its last user message as the
prompt's text, the templated string, when the source gave one, as the text the policy continued
(``rollouts.prompt_text``), and a key naming the conversation (:func:`~studio.tasks.chat.chat_key`:
the same messages are one prompt, one GRPO group per step). A completion given as messages is
its assistant content (:func:`completion_text`); when those messages are a trajectory (tool calls,
tool messages) they are its turns too (:func:`~studio.ingest.messages.completion_turns`).
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from studio.ingest.errors import Bad, Problem
from studio.ingest.formats import INT32, TOKEN_FIELDS, ColumnMapping, arrow_kind, columns_of, value_kind
from studio.ingest.messages import completion_turns, turn_counts
from studio.tasks.chat import MARKERS, chat_key, content_text, last_user, parse_templated, plain_messages


class Slow(Exception):
    """The vectorised path cannot take this slice as it is: the Python pass checks it record by record."""


@dataclass
class Batch:
    """Good records of one slice in canonical form, however they were read."""

    n: int
    prompt: pa.Array  # string: the prompt's text (a chat's last user message)
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
    key: pa.Array | None = None  # string: which prompt a row answers (a chat: chat_key); None: its text
    messages: Callable[[np.ndarray], list] | None = None  # row indices -> messages JSON text (None: text only)
    prompt_text: pa.Array | None = None  # string: the templated string the policy continued, where given
    # agent trajectories (studio.ingest.trajectories); None: each row is one assistant turn
    turns: list | None = None  # per row: its list of backends.Turn
    turn_rewards: list | None = None  # per row: {turn index: reward}
    counts: np.ndarray | None = None  # [n, 3] int64: turns, tool calls, failed tool calls
    trained: pa.Array | None = None  # list<bool> per row, as the token lists: the loss mask
    turn_idx: pa.Array | None = None  # list<int32> per row: each token's turn
    sources: dict[str, str] | None = None  # log-prob field -> the source column it came from (rollouts.engine)

    def slice(self, a: int, z: int) -> Batch:
        """Rows ``a:z``."""
        def s(x):
            return x.slice(a, z - a) if x is not None else None
        def rows(f):
            return (lambda idx: f(np.asarray(idx) + a)) if f else None
        def part(x):
            return x[a:z] if x is not None else None
        return Batch(z - a, s(self.prompt), s(self.completion), s(self.step), s(self.group), s(self.total),
                     {k: s(v) for k, v in self.components.items()}, s(self.advantage), s(self.finish_reason),
                     {k: s(v) for k, v in self.tokens.items()}, part(self.n_tokens),
                     rows(self.gold), s(self.key), rows(self.messages), s(self.prompt_text),
                     part(self.turns), part(self.turn_rewards), part(self.counts), s(self.trained), s(self.turn_idx),
                     self.sources)


LOGPROB_FIELDS = ("logprobs", "train_logprobs")  # the behaviour and the recomputed side: checked as log-probs
MAX_LOGPROB = 1e-4  # a log-prob above this is no log-prob (rounding puts a certain token's a hair over 0)


def check_logprobs(values: list, col: str) -> None:
    """Raise :class:`Bad` naming ``col`` when a log-prob list holds NaN / inf or a positive value (None: masked)."""
    for i, v in enumerate(values):
        if v is None:
            continue
        if not math.isfinite(v):
            raise Bad(f"{col} has {v} at token {i}: a log-prob must be finite")
        if v > MAX_LOGPROB:
            raise Bad(f"{col} has {v:g} at token {i}: a log-prob is at most 0")


def _dumps(messages: list[dict]) -> str:
    return json.dumps(messages, ensure_ascii=False)


def text_prompt(text: str) -> tuple[str, str, str | None, str | None]:
    """``(text, key, messages JSON, templated string)`` of a prompt given as a string: a
    templated one is read back into its messages (text: the last user message).

    >>> text_prompt("<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n")[::2]
    ('Hi', '[{"role": "user", "content": "Hi"}]')
    >>> text_prompt("Hi")
    ('Hi', 'Hi', None, None)
    """
    msgs = parse_templated(text)
    if msgs is None:
        return text, text, None, None
    return last_user(msgs), chat_key(msgs), _dumps(msgs), text


def chat_prompt(messages: list) -> tuple[str, str, str, None]:
    """``(text, key, messages JSON, None)`` of a prompt given as ``{role, content}`` messages."""
    msgs = plain_messages(messages)
    return last_user(msgs), chat_key(msgs), _dumps(msgs), None


def completion_text(messages: list) -> str:
    """A completion given as messages: its assistant messages' content (one message: its content).

    >>> completion_text([{"role": "assistant", "content": "It is 4."}])
    'It is 4.'
    >>> completion_text([{"role": "assistant", "content": "Let me check."}, {"role": "tool", "content": "4"},
    ...                  {"role": "assistant", "content": "It is 4."}])
    'Let me check.\\nIt is 4.'
    """
    said = [m for m in messages if isinstance(m, dict) and m.get("role") == "assistant"] or \
        [m for m in messages if isinstance(m, dict)]
    return "\n".join(content_text(m) for m in said)


def _arrow_completion(a: pa.Array) -> pa.Array:
    """Text of a completion column: text, or one message per row (its content); else :class:`Slow`."""
    if a.null_count:
        raise Slow
    kind = arrow_kind(a.type)
    if kind == "text":
        return a.cast(pa.string())
    if kind != "messages":
        raise Slow
    lists = a.cast(pa.list_(a.type.value_type)) if pa.types.is_large_list(a.type) else a
    flat = pc.list_flatten(lists)
    ct = flat.type.field("content").type
    if flat.null_count or not (pa.types.is_string(ct) or pa.types.is_null(ct)) or len(flat) != len(a) \
            or (np.diff(np.asarray(lists.offsets)) != 1).any():
        raise Slow  # several messages per completion: the Python pass picks the assistant's
    if flat.type.get_field_index("tool_calls") >= 0 and flat.field("tool_calls").null_count < len(flat):
        raise Slow  # an assistant message that calls a tool: the Python pass reads its turns
    return pc.fill_null(flat.field("content").cast(pa.string()), "")


_MARKED = "|".join(re.escape(m) for m in MARKERS)


def _arrow_prompt(a: pa.Array) -> tuple[pa.Array, pa.Array | None, Callable | None, pa.Array | None]:
    """``(text, key, messages, templated string)`` of a prompt column (vectorised twin of
    :func:`text_prompt` / :func:`chat_prompt`); :class:`Slow` where it cannot."""
    if a.null_count:
        raise Slow
    kind = arrow_kind(a.type)
    if kind == "text":
        s = a.cast(pa.string())
        if not pc.any(pc.match_substring_regex(s, _MARKED)).as_py():
            return s, None, None, None
        enc = s.dictionary_encode()  # each distinct templated string read once
        text, key, msgs, templated = zip(*map(text_prompt, enc.dictionary.to_pylist()), strict=True)
        def col(vals):
            return pa.array(vals, pa.string()).take(enc.indices)
        per_row = col(msgs)
        return col(text), col(key), (lambda idx: per_row.take(pa.array(idx)).to_pylist()), col(templated)
    if kind != "messages":
        raise Slow
    lists = a.cast(pa.list_(a.type.value_type)) if pa.types.is_large_list(a.type) else a
    flat = pc.list_flatten(lists)
    st = flat.type
    ct = st.field("content").type
    offsets = np.asarray(lists.offsets) - lists.offsets[0].as_py()
    lengths = np.diff(offsets)
    if flat.null_count or not (pa.types.is_string(ct) or pa.types.is_null(ct)) or not len(flat) or (lengths == 0).any():
        raise Slow
    content = pc.fill_null(flat.field("content").cast(pa.string()), "")
    role = (pc.fill_null(flat.field("role").cast(pa.string()), "") if st.get_field_index("role") >= 0
            else pa.array([""] * len(flat), pa.string()))
    # the last user message of each conversation, else its last message (chat.last_user)
    pos = np.where(pc.equal(role, "user").to_numpy(zero_copy_only=False), np.arange(len(flat)), -1)
    last = np.maximum.reduceat(pos, offsets[:-1])
    text = content.take(pa.array(np.where(last >= 0, last, offsets[1:] - 1)))
    turns = pc.binary_join_element_wise(role, content, "\x1f")
    key = pc.binary_join_element_wise("\x1d", pc.binary_join(
        pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), turns), "\x1e"), "")
    return text, key, (lambda idx: [_dumps(plain_messages(v)) for v in a.take(pa.array(idx)).to_pylist()]), None


def _arrow_number(a: pa.Array, n: int) -> pa.Array:
    """float64, NaN read as missing (pandas writes a missing number as NaN)."""
    kind = arrow_kind(a.type)
    if kind == "null":
        return pa.nulls(n, pa.float64())
    if kind != "number":
        raise Slow
    f = a.cast(pa.float64())
    return pc.if_else(pc.is_nan(f), pa.scalar(None, pa.float64()), f) if pa.types.is_floating(a.type) else f


def _arrow_step(a: pa.Array | None, n: int, file_step: int | None) -> pa.Array:
    if a is not None and pa.types.is_boolean(a.type):
        raise Slow
    f = _arrow_number(a, n) if a is not None else pa.nulls(n, pa.float64())
    v = f.to_numpy(zero_copy_only=False)
    v = v[~np.isnan(v)]
    if ((v != np.round(v)) | (np.abs(v) > INT32)).any():
        raise Slow
    s = f.cast(pa.int32())
    return pc.fill_null(s, file_step) if file_step is not None and s.null_count else s


def _list_first(a: pa.Array) -> pa.Array:
    lengths = pc.fill_null(pc.list_value_length(a), 0).to_numpy()
    flat = pc.list_flatten(a)
    starts = np.cumsum(lengths) - lengths
    idx = pa.array(np.where(lengths > 0, np.minimum(starts, max(len(flat) - 1, 0)), 0), mask=lengths == 0)
    return flat.take(idx) if len(flat) else pa.nulls(len(a), flat.type)


_ELEMENT_OK = {"token_texts": lambda t: arrow_kind(t) == "text",  # strings, or a dictionary of them
               "token_ids": pa.types.is_integer}


def arrow_batch(t: pa.Table, m: ColumnMapping, file_step: int | None) -> Batch:
    """Canonical columns of a clean Arrow slice, all vectorised; raises :class:`Slow` at the
    first thing that needs a record-by-record look (a null prompt, ragged token lists, ...)."""
    n = t.num_rows
    col = {name: t.column(name).combine_chunks() for name in columns_of(m) if name in t.column_names}
    tokens, lengths = {}, None
    for fld in TOKEN_FIELDS:
        a = col.get(getattr(m, fld)) if getattr(m, fld) else None
        if a is None or arrow_kind(a.type) == "null":
            continue
        if arrow_kind(a.type) != "list":
            raise Slow
        et = a.type.value_type
        ok = _ELEMENT_OK.get(fld, lambda t: (pa.types.is_integer(t) or pa.types.is_floating(t)))
        if not (ok(et) or pa.types.is_null(et)):
            raise Slow
        flat = pc.list_flatten(a)
        if fld == "token_ids" and len(flat) and pc.max(pc.abs(flat.cast(pa.int64()))).as_py() > INT32:
            raise Slow
        if fld in LOGPROB_FIELDS and len(flat) and pa.types.is_floating(flat.type) and not pc.all(
                pc.and_(pc.is_finite(flat), pc.less_equal(flat, MAX_LOGPROB))).as_py():
            raise Slow  # NaN / inf / positive: the Python pass names the record
        if fld in LOGPROB_FIELDS and len(flat) and pa.types.is_integer(flat.type) and pc.max(flat).as_py() > 0:
            raise Slow
        ln = pc.fill_null(pc.list_value_length(a), -1).to_numpy().astype(np.int64)
        if lengths is None:
            lengths = ln
        elif ((ln >= 0) & (lengths >= 0) & (ln != lengths)).any():
            raise Slow
        else:
            lengths = np.where(lengths < 0, ln, lengths)
        tokens[fld] = a
    adv = col.get(m.advantage) if m.advantage else None
    if adv is not None:
        if arrow_kind(adv.type) == "list":
            if not pa.types.is_floating(adv.type.value_type) and not pa.types.is_integer(adv.type.value_type):
                raise Slow
            adv = _list_first(adv)
        adv = _arrow_number(adv, n)
    fin = col.get(m.finish_reason) if m.finish_reason else None
    grp = col.get(m.group) if m.group else None
    if grp is not None and (grp.null_count or arrow_kind(grp.type) not in ("text", "number")
                            or pa.types.is_floating(grp.type)):
        raise Slow
    gold = col.get(m.gold) if m.gold else None
    text, key, messages, templated = _arrow_prompt(col[m.prompt])
    return Batch(
        n=n, prompt=text, completion=_arrow_completion(col[m.completion]),
        step=_arrow_step(col.get(m.step) if m.step else None, n, file_step),
        group=grp.cast(pa.string()) if grp is not None else None,
        total=_arrow_number(col[m.reward], n) if m.reward else None,
        components={c: _arrow_number(col[c], n) for c in m.rewards},
        advantage=adv,
        finish_reason=fin.cast(pa.string()) if fin is not None and arrow_kind(fin.type) != "null" else None,
        tokens=tokens, n_tokens=lengths, sources={f: getattr(m, f) for f in LOGPROB_FIELDS if f in tokens},
        gold=(lambda idx: [None if v is None else json.dumps({"answer": v}, default=str)
                           for v in gold.take(pa.array(idx)).to_pylist()]) if gold is not None else None,
        key=key, messages=messages, prompt_text=templated)


def _py_text(v: Any, col: str, completion: bool) -> tuple:
    """A completion's text, or a prompt's ``(text, key, messages JSON, templated string)``."""
    if v is None:
        raise Bad(f"missing {col!r}")
    if isinstance(v, str):
        return v if completion else text_prompt(v)
    if isinstance(v, list) and all(isinstance(x, dict) for x in v):
        return completion_text(v) if completion else chat_prompt(v)
    raise Bad(f"{col!r} must be text or a list of {{role, content}} messages, got {value_kind(v)}")


def _nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _py_number(v: Any, col: str) -> float | None:
    if v is None or isinstance(v, (bool, int, float)):
        try:
            return None if v is None or _nan(v) else float(v)
        except OverflowError:
            raise Bad(f"{col!r} is out of range") from None
    raise Bad(f"{col!r} must be a number, got {value_kind(v)} {str(v)[:40]!r}")


def _py_int(v: Any, col: str) -> int | None:
    if v is None:
        return None
    if _nan(v):  # missing
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or abs(v) > INT32 or v != int(v):
        raise Bad(f"{col!r} must be an integer step, got {str(v)[:40]!r}")
    return int(v)


def _py_list(v: Any, col: str, fld: str) -> list | None:
    if v is None:
        return None
    if not isinstance(v, list):
        raise Bad(f"{col!r} must be a list, got {value_kind(v)}")
    if fld == "token_texts":
        if not all(x is None or isinstance(x, str) for x in v):
            raise Bad(f"{col!r} must be a list of strings")
    elif fld == "token_ids":
        if not all(x is None or (isinstance(x, int) and not isinstance(x, bool) and abs(x) <= INT32) for x in v):
            raise Bad(f"{col!r} must be a list of token ids")
    else:
        if not all(x is None or (isinstance(x, (int, float)) and not isinstance(x, bool)) for x in v):
            raise Bad(f"{col!r} must be a list of numbers")
        if fld in LOGPROB_FIELDS:
            v = [None if x is None else float(x) for x in v]
            check_logprobs(v, col)
        else:
            v = [None if x is None or _nan(x) else float(x) for x in v]
    return v


def _normalise(obj: Any, m: ColumnMapping, file_step: int | None) -> tuple:
    """One record's canonical values, or :class:`Bad` saying what is wrong with it."""
    if not isinstance(obj, dict):
        raise Bad(f"expected a JSON object, got {value_kind(obj) if obj is not None else 'null'}")
    prompt = _py_text(obj.get(m.prompt), m.prompt, False)
    completion = _py_text(obj.get(m.completion), m.completion, True)
    step = _py_int(obj.get(m.step), m.step) if m.step else None
    step = file_step if step is None else step
    group = None
    if m.group:
        g = obj.get(m.group)
        if g is None or isinstance(g, (bool, float)) or not isinstance(g, (str, int)):
            raise Bad(f"{m.group!r} (the group) must be text or an integer")
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
        raise Bad(f"{m.finish_reason!r} must be text")
    toks, n_tok, first = {}, -1, None
    for fld in TOKEN_FIELDS:
        col = getattr(m, fld)
        if col and (lst := _py_list(obj.get(col), col, fld)) is not None:
            if n_tok >= 0 and len(lst) != n_tok:
                raise Bad(f"{col!r} has {len(lst)} values but {first!r} has {n_tok}")
            toks[fld], n_tok, first = lst, len(lst), first or col
    g = obj.get(m.gold) if m.gold else None
    gold = None if g is None else json.dumps({"answer": g}, default=str)
    turns = completion_turns(obj[m.completion]) if isinstance(obj[m.completion], list) else None
    return prompt, completion, step, group, total, comps, adv, fin, toks, n_tok, gold, turns


def records_batch(recs: list[tuple[int, Any]], m: ColumnMapping, file_step: int | None,
                  file: str) -> tuple[Batch | None, list[Problem]]:
    """The slow path: every record checked on its own; the good ones as one batch."""
    rows, problems = [], []
    for line, obj in recs:
        try:
            rows.append(_normalise(obj, m, file_step))
        except Bad as exc:
            problems.append(Problem(file, line, str(exc)))
    if not rows:
        return None, problems
    cols = list(zip(*rows, strict=True))  # each row: one tuple of _normalise's values
    n = len(rows)
    tokens = {}
    for fld in TOKEN_FIELDS:
        vals = [t.get(fld) for t in cols[8]]
        if any(v is not None for v in vals):
            tokens[fld] = pa.array(vals, pa.list_(pa.int64() if fld == "token_ids" else
                                                  pa.string() if fld == "token_texts" else pa.float64()))
    gold = cols[10]
    text, key, messages, templated = zip(*cols[0], strict=True)
    chat = any(v is not None for v in messages)
    return Batch(
        n=n, prompt=pa.array(text, pa.string()), completion=pa.array(cols[1], pa.string()),
        step=pa.array(cols[2], pa.int32()), group=pa.array(cols[3], pa.string()) if m.group else None,
        total=pa.array(cols[4], pa.float64()) if m.reward else None,
        components={c: pa.array([r[i] for r in cols[5]], pa.float64()) for i, c in enumerate(m.rewards)},
        advantage=pa.array(cols[6], pa.float64()) if m.advantage else None,
        finish_reason=pa.array(cols[7], pa.string()) if m.finish_reason else None,
        tokens=tokens, n_tokens=np.array(cols[9], np.int64) if tokens else None,
        sources={f: getattr(m, f) for f in LOGPROB_FIELDS if f in tokens},
        gold=(lambda idx: [gold[i] for i in idx]) if m.gold else None,
        key=pa.array(key, pa.string()) if chat else None,
        messages=(lambda idx: [messages[i] for i in idx]) if chat else None,
        prompt_text=pa.array(templated, pa.string()) if any(v is not None for v in templated) else None,
        **_turns(list(cols[11]))), problems


def _turns(turns: list) -> dict:
    """A slice's turns where a completion was given as a trajectory's messages (else none: one assistant turn each)."""
    if all(t is None for t in turns):
        return {}
    return {"turns": turns, "counts": np.array([turn_counts(t) for t in turns], np.int64).reshape(len(turns), 3)}
