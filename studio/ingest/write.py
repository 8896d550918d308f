"""Writing an import's rows, inside the import's one transaction.

Per slice of a file (:class:`FileWriter`): ``prompts`` this import has not written yet,
``rollouts`` (a group is one prompt's, or one group value's, completions at one step in one
file: group ids and sample indices carry over from slice to slice, and from an earlier read
of a tailed file), ``tokens`` where token-level fields exist (through the import's
:class:`~studio.store.shards.TokenSink`: over ``SHARD_MIN_ROWS`` token rows they stream into
one Parquet shard beside the store), ``token_scores`` (``value-import@<run id>``) for per-token
critic values, and one ``rule_versions`` row ``import-<format>@<hash of the reward columns>``
(:func:`version_of`) with its ``rewards``. A correctness field (``acc``, ``is_correct``, …:
:func:`~studio.ingest.formats.is_correctness`) also sets ``rollouts.correct`` (value ≥ 1), the
rollout's correctness whatever reward version is shown. Per file, its ``import_files`` row (how far it was
read: importing again resumes there and never duplicates a row); per new run, its ``runs`` row
(kind ``import``).
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from studio.ingest.formats import TOKEN_FIELDS, ColumnMapping, is_correctness
from studio.ingest.normalise import Batch
from studio.ingest.read import Source
from studio.store import Store, records
from studio.store.shards import TokenSink

TOKEN_SLICE = 4_000_000  # token rows per write (DuckDB spreads an insert of millions over its threads)


class Cancelled(Exception):
    """The import's cancel event was set: the transaction rolls back."""


def _const(value: Any, n: int, typ: pa.DataType) -> pa.Array:
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([value], typ)) \
        if typ == pa.string() else pa.repeat(pa.scalar(value, typ), n)


def version_of(fmt: str, m: ColumnMapping) -> tuple[str, str]:
    """``(rule version id, sha256)`` of an import's scores: its format and reward columns."""
    key = json.dumps({"format": fmt, "total": m.reward or "sum", "components": list(m.rewards)})
    sha = hashlib.sha256(key.encode()).hexdigest()
    return f"import-{fmt}@{sha[:10]}", sha


@dataclass
class Ctx:
    """One import in progress: its transaction's cursor and what it has written so far."""

    store: Store
    cur: Any
    run_id: str
    fmt: str
    task: str
    created: Any
    cancel: threading.Event | None
    prompt_ids: dict = field(default_factory=dict)  # prompt key (text, or a chat's chat_key) -> id, prompts written
    versions: dict = field(default_factory=dict)  # version id -> reward columns
    n_rollouts: int = 0
    n_tokens: int = 0
    tokens: TokenSink | None = None  # where token rows go: the table, or a shard for a large import
    run_name: str = ""  # the run's name: the training side's policy version is <run name>@step<k>


def _components(b: Batch) -> tuple[list[str], list[pa.Array], pa.Array]:
    """Component names and values, and the total (the sum of the components when the source has none)."""
    names = [("source_total" if c == "total" else c) for c in b.components]
    values = list(b.components.values())
    correct = [(c, v) for c, v in zip(names, values, strict=True) if is_correctness(c)]
    if correct and "accuracy" not in names:  # the import's version says it under the common name too
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


class FileWriter:
    """Writes one file's good records slice by slice. A group is one prompt's (or one group
    value's) completions at one step in this file, so group ids and sample indices carry over
    from slice to slice."""

    def __init__(self, ctx: Ctx, src: Source, resumed: bool = False):
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
        for (text, step), pid in zip(keys, pids, strict=True):
            hit = found.get((pid, int(step)))
            if hit is not None:
                self.groups[(text, step)] = [hit[0], hit[1]]

    def write(self, b: Batch) -> None:
        ctx, n = self.ctx, b.n
        if n == 0:
            return
        enc = (b.key if b.key is not None else b.prompt).dictionary_encode()  # a prompt is its text, or its chat
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
        keys = list(zip([gtexts[c] for c in gcodes[first[order]].tolist()], step[first[order]].tolist(), strict=True))
        self._earlier([key for key in keys if key not in self.groups], b.group is None)
        fresh = [key for key in keys if key not in self.groups]
        for gid, key in zip(records.new_ids("g", len(fresh)), fresh, strict=True):
            self.groups[key] = [gid, 0]
        counts = np.bincount(inv, minlength=len(first))
        gid_list, base_list = [], []
        for key, c in zip(keys, counts[order].tolist(), strict=True):
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

    def _write_prompts(self, b: Batch, texts: list, codes: np.ndarray, pids: list, pid_arr: pa.Array) -> None:
        """The prompts of this slice that this import has not written yet."""
        _, first = np.unique(codes, return_index=True)
        new = np.array([i for i in first if texts[codes[i]] not in self.ctx.prompt_ids], np.int64)
        if not len(new):
            return
        self.ctx.store.write({"prompts": pa.table({
            "prompt_id": pid_arr.take(pa.array(new)), "task": _const(self.ctx.task, len(new), pa.string()),
            "text": b.prompt.take(pa.array(new)),
            "gold": pa.array(b.gold(new) if b.gold else [None] * len(new), pa.string()),
            "messages": pa.array(b.messages(new) if b.messages else [None] * len(new), pa.string())})}, self.ctx.cur)
        for i in new:
            self.ctx.prompt_ids[texts[codes[i]]] = pids[codes[i]]


def _token_slices(b: Batch) -> list[tuple[int, int]]:
    if b.n_tokens is None or b.n_tokens.clip(0).sum() <= TOKEN_SLICE:
        return [(0, b.n)]
    cum = np.cumsum(b.n_tokens.clip(0))
    cuts = [0]
    while cuts[-1] < b.n:
        base = cum[cuts[-1] - 1] if cuts[-1] else 0
        cuts.append(max(int(np.searchsorted(cum, base + TOKEN_SLICE, side="right")), cuts[-1] + 1))
    return list(zip(cuts[:-1], cuts[1:], strict=True))


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


def _write_rows(ctx: Ctx, src: Source, b: Batch, ids, pids, gids, sample_idx) -> None:
    if ctx.cancel is not None and ctx.cancel.is_set():
        raise Cancelled
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
        "train_advantage": b.advantage if b.advantage is not None else pa.nulls(n, pa.float64()),
        "prompt_text": b.prompt_text if b.prompt_text is not None else pa.nulls(n, pa.string()),
        **_counts(b), **_engines(ctx, b)})
    names, values, total = _components(b)
    checks = [v for c, v in zip(names, values, strict=True) if is_correctness(c)]
    if checks:  # the run's own correctness field: a fact of the rollout (NULL where the field has no value)
        frames["rollouts"] = frames["rollouts"].append_column(
            "correct", pc.greater_equal(checks[0].cast(pa.float64()), 1.0))
    vid, _ = version_of(ctx.fmt, src.mapping)
    if (total is not None or _has_turn_rewards(b)) and vid not in ctx.versions:
        _write_version(ctx, src, vid)
    if total is not None:
        keep = [pc.is_valid(v) for v in values]  # a reward function with no value for a row: no row
        ids_k = [ids] + [ids.filter(k) for k in keep]
        vals_k = [total] + [v.filter(k) for v, k in zip(values, keep, strict=True)]
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
            col, typ = TOKEN_FIELDS[fld]
            if fld == "values":
                values_col = _explode(a, lengths, typ)
            else:
                tok_cols[col] = _explode(a, lengths, typ)
        if b.trained is not None:  # an agent trajectory's loss mask and each token's turn
            tok_cols["trained"] = _explode(b.trained, lengths, pa.bool_())
            tok_cols["turn_idx"] = _explode(b.turn_idx, lengths, pa.int32())
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
    if b.turns is not None:
        frames["turns"] = records.turn_frame(ids.to_pylist(), b.turns)
        if _has_turn_rewards(b):
            frames["turn_rewards"] = _turn_reward_table(ids.to_pylist(), b.turn_rewards, vid)
    ctx.store.write(frames, ctx.cur)
    ctx.n_rollouts += n


_FORMAT_NAMES = {"verl-agent": "verl", "trl-tools": "trl"}  # the framework an agent format's engine names


def _engines(ctx: Ctx, b: Batch) -> dict[str, pa.Array]:
    """``engine`` (who reported the behaviour log-probs: ``<format> <field>``), ``train_engine`` and
    ``train_policy_version`` (who recomputed them: ``<format> <field>``, ``<run name>@step<k>``) of every
    rollout; NULL where its list is missing."""
    n, src, fmt = b.n, b.sources or {}, _FORMAT_NAMES.get(ctx.fmt, ctx.fmt)
    null = pa.nulls(n, pa.string())

    def named(fld: str, value: pa.Array | str) -> pa.Array:
        a = b.tokens.get(fld)
        if a is None:
            return null
        v = pa.array([value] * n, pa.string()) if isinstance(value, str) else value
        return pc.if_else(pc.is_valid(a), v, null)

    steps = pc.cast(b.step, pa.string())
    version = pc.if_else(pc.is_valid(b.step), pc.binary_join_element_wise(f"{ctx.run_name}@step", steps, ""),
                         pa.array([ctx.run_name] * n, pa.string()))
    return {"engine": named("logprobs", f"{fmt} {src.get('logprobs', 'logprobs')}"),
            "train_policy_version": named("train_logprobs", version),
            "train_engine": named("train_logprobs", f"{fmt} {src.get('train_logprobs', 'train_logprobs')}")}


def _counts(b: Batch) -> dict[str, pa.Array]:
    """``n_turns``, ``n_tool_calls``, ``n_tool_errors`` of every rollout (a single answer: 1, 0, 0)."""
    c = b.counts if b.counts is not None else np.tile(np.array([1, 0, 0], np.int64), (b.n, 1))
    return {name: pa.array(c[:, i], pa.int32()) for i, name in enumerate(("n_turns", "n_tool_calls", "n_tool_errors"))}


def _has_turn_rewards(b: Batch) -> bool:
    return b.turn_rewards is not None and any(b.turn_rewards)


def _turn_reward_table(ids: list[str], per_rollout: list[dict], source: str) -> pa.Table:
    """``turn_rewards`` rows: each rollout's per-turn rewards, under the import's rule version."""
    rows = [(rid, i, v) for rid, rewards in zip(ids, per_rollout, strict=True) for i, v in sorted(rewards.items())]
    return pa.table({"rollout_id": pa.array([r[0] for r in rows], pa.string()),
                     "turn_idx": pa.array([r[1] for r in rows], pa.int32()),
                     "source": pa.array([source] * len(rows), pa.string()),
                     "value": pa.array([r[2] for r in rows], pa.float64())})


def _write_version(ctx: Ctx, src: Source, vid: str) -> None:
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


def write_run(ctx: Ctx, name: str, config: dict) -> None:
    """The ``runs`` row of a new import run; ``config`` is the request that made it (the next import of it continues
    this run)."""
    ctx.store.write({"runs": pa.table({
        "run_id": [ctx.run_id], "kind": ["import"], "name": [name],
        "policy": pa.nulls(1, pa.string()), "task": [ctx.task], "config": [json.dumps(config)],
        "created_at": pa.array([ctx.created], pa.timestamp("us")), "status": ["done"]})}, ctx.cur)


def write_file(ctx: Ctx, path: Path, st: os.stat_result, end: int, n_rows: int, n_skipped: int) -> None:
    """The ``import_files`` row of one file read: how far (``end``: bytes consumed), where importing again resumes."""
    ctx.store.write({"import_files": pa.table({
        "run_id": [ctx.run_id], "path": [str(path)], "format": [ctx.fmt],
        "size": pa.array([max(st.st_size, end)], pa.int64()),
        "mtime": [st.st_mtime], "consumed": pa.array([end], pa.int64()), "n_rows": pa.array([n_rows], pa.int32()),
        "n_skipped": pa.array([n_skipped], pa.int32()),
        "imported_at": pa.array([records.now()], pa.timestamp("us"))})}, ctx.cur)
