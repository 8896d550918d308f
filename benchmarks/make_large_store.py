"""A synthetic store shaped like a real one, at scale (default 1,000,000 rollouts, ~100,000,000 tokens).

Run: ``python benchmarks/make_large_store.py --db /tmp/large.duckdb`` (``--rollouts 100000`` for a
quick one). Prints the build time and the file size. ``benchmarks/bench_scale.py --db PATH``
measures the studio's queries on it.

The shape follows what the studio writes:

* ``--runs`` runs (default 10) of equal size, one after the other; each run's groups of 8
  completions (one prompt each) are sampled 64 groups per training step (``train_step`` 0..N),
  each step stamped 30 s after the previous one.
* ``--rollouts / 8`` prompts (125,000 by default) of the arithmetic task (``Q: a+b-c=``); each
  group draws its prompt from them at random, so prompts recur across steps and runs.
* ids from ``studio.store.records.new_ids`` (they sort in the order they were made; run ids as
  ``new_id`` would have made them on their runs' days), rollouts and
  their tokens inserted in that order, through ``Store.write`` in chunks of ``--chunk``
  rollouts (rollouts + tokens + rewards of a chunk in one transaction, as Generate writes).
* completion lengths from 20 to 300 tokens (20 + Gamma(2, θ), mean ``--tokens-per-rollout``,
  cut at 300 with ``finish_reason = 'length'``); token texts from a ~300-entry vocabulary
  (dictionary-encoded Arrow arrays, so generating 100M rows is cheap), the completion text is
  the join of its tokens; log-probs ≤ 0 and entropies ≥ 0 as float32.
* every 5th run is a ``generate`` run with top-5 alternatives per token and step indices; the
  others are ``import`` runs without them (NULL), as imported rollouts have none.
* rewards in long format under two rule versions: ``synthetic-a`` scores every rollout
  (components ``format``, ``length``, ``accuracy`` and ``total``) in the chunk's transaction;
  ``synthetic-b``, created later, re-scores the second half of the runs afterwards (as
  applying a new rule does), so "the most recent version per rollout" differs across runs.
  Accuracy is drawn per group with p ~ Beta(0.5, 0.5), so many groups are all-equal.

``--shared`` makes ``--db`` a shared store (``studio.store.lake.create_shared``: a folder holding a
SQLite catalog and the Parquet data files) and writes the same chunks into it through ``Store.write``.

The store is built beside ``--db`` and renamed into place when complete (a shared one in place). It prints one JSON
line: the store's path, its row counts and its bytes (a store, not a figure).

``--smoke`` builds 800 rollouts in chunks of 200 with ``--sharded``, in a temporary directory
unless ``--db`` is given: a check, in seconds, that the build still runs against the store.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: import the project's packages

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

from benchmarks import smoke  # noqa: E402

GROUP = 8
GROUPS_PER_STEP = 64
MIN_LEN, MAX_LEN = 20, 300
TOPK = 5
RULE_A = "synthetic-a@0000000000"
RULE_B = "synthetic-b@1111111111"
EOS = "<eos>"
B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"  # studio.store.records' id digits, in byte order
# numbers, operators and a few words, each a token text; "<eos>" ends every completion that stops
VOCAB = ([str(i) for i in range(200)] + list("+-=;:A ") + ["\n", "Q", "so", " is", " the", " answer", " step",
         " carry", " then", " we", " add", " subtract", " get", " check", " wait", ",", "."]
         + [f" {w}" for w in ("first", "next", "result", "sum", "difference", "total", "hmm", "ok")] + [EOS])


@dataclass(frozen=True)
class Shape:
    """How big and how split the synthetic store is."""

    rollouts: int = 1_000_000
    """Rollouts in the store (rounded down to whole groups of 8)."""
    tokens_per_rollout: int = 100
    """Mean completion length in tokens (lengths vary from 20 to 300)."""
    runs: int = 10
    """Runs the rollouts are split over, in equal parts."""
    chunk: int = 50_000
    """Rollouts per ``Store.write`` (one transaction with their tokens and rewards)."""
    seed: int = 20240601
    sharded: bool = False
    """Import runs' token rows in one Parquet shard per run, as ``studio.ingest.importers.import_run`` writes
    a bulk import's (``studio/store/shards.py``); generate runs' in the table. False: every row in the table."""
    shared: bool = False
    """A shared store (``studio.store.lake.create_shared``: a SQLite catalog and Parquet data files in a
    folder) written through the same ``Store.write`` chunks; it has no shards."""


class Plan:
    """Everything decided per group and per rollout up front (small: O(rollouts)); the
    token rows are drawn per chunk by :meth:`chunks`."""

    def __init__(self, shape: Shape):
        from studio.store.records import new_ids, prompt_id

        self.shape = shape
        rng = np.random.default_rng(shape.seed)
        self.rng = rng
        n_groups = max(1, shape.rollouts // GROUP)
        n = n_groups * GROUP
        self.n_groups, self.n = n_groups, n
        # runs: equal shares of whole groups, in order
        self.group_run = np.minimum(np.arange(n_groups) * shape.runs // n_groups, shape.runs - 1)
        self.run_first_group = np.searchsorted(self.group_run, np.arange(shape.runs))
        self.group_step = (np.arange(n_groups) - self.run_first_group[self.group_run]) // GROUPS_PER_STEP
        self.t0 = datetime(2025, 1, 6, 9, 0, 0)
        self.run_ids = [_id_made_at("run_", self.t0 + timedelta(days=i), rng) for i in range(shape.runs)]
        self.run_kind = ["generate" if i % 5 == 0 else "import" for i in range(shape.runs)]

        # prompts: Q: a+b-c= with distinct (a, b, c)
        n_prompts = n_groups
        codes = rng.choice(900 ** 3, size=n_prompts, replace=False)
        a, b, c = codes // 810_000 + 10, (codes // 900) % 900 + 10, codes % 900 + 10
        texts = [f"Q: {x}+{y}-{z}=" for x, y, z in zip(a.tolist(), b.tolist(), c.tolist(), strict=True)]
        self.prompt_text = pa.array(texts, pa.string())
        self.prompt_ids = pa.array([prompt_id("arithmetic", t) for t in texts], pa.string())
        self.prompts = pa.table({
            "prompt_id": self.prompt_ids, "task": pa.array(["arithmetic"] * n_prompts), "text": self.prompt_text,
            "gold": pa.array([json.dumps({"answer": str(x + y - z), "solution": f"{x}+{y}={x + y};{x + y}-{z}="
                                          f"{x + y - z};A:{x + y - z}"}) for x, y, z in
                              zip(a.tolist(), b.tolist(), c.tolist(), strict=True)]),
            "meta": pa.array(["{}"] * n_prompts),
        })
        self.group_prompt = rng.integers(0, n_prompts, size=n_groups)

        # ids in the order they are made and written
        self.group_ids = pa.array(new_ids("g", n_groups), pa.string())
        self.rollout_ids = pa.array(new_ids("r", n), pa.string())

        # lengths: 20 + Gamma(2, θ), mean ≈ tokens_per_rollout, cut at 300
        mean = max(shape.tokens_per_rollout, MIN_LEN + 1)
        raw = MIN_LEN + rng.gamma(2.0, (mean - MIN_LEN) / 2.0, size=n)
        self.length = np.minimum(np.rint(raw), MAX_LEN).astype(np.int32)
        self.length_cut = raw >= MAX_LEN

        # rewards: accuracy with p per group from Beta(0.5, 0.5), format, a length penalty
        p = np.repeat(rng.beta(0.5, 0.5, size=n_groups), GROUP)
        self.accuracy = (rng.random(n) < p).astype(np.float64)
        self.format = (rng.random(n) < 0.9).astype(np.float64)
        self.len_pen = np.where(self.length > 250, -0.5, 0.0)

    def run_rows(self) -> pd.DataFrame:
        return pd.DataFrame([{
            "run_id": rid, "kind": kind, "name": f"synthetic-{i:02d}", "policy": "sample", "task": "arithmetic",
            "config": json.dumps({"synthetic": True}), "created_at": self.t0 + timedelta(days=i), "status": "done",
        } for i, (rid, kind) in enumerate(zip(self.run_ids, self.run_kind, strict=True))])

    def rule_rows(self) -> pd.DataFrame:
        return pd.DataFrame([
            {"rule_version_id": RULE_A, "name": "synthetic-a", "source": "# synthetic: accuracy + 0.2 format + length",
             "sha256": "a" * 64, "created_at": self.t0, "note": "make_large_store"},
            {"rule_version_id": RULE_B, "name": "synthetic-b", "source": "# synthetic: accuracy + 0.1 format + length",
             "sha256": "b" * 64, "created_at": self.t0 + timedelta(days=30), "note": "make_large_store"},
        ])

    def spans(self) -> Iterator[tuple[int, int, int]]:
        """``(run index, first rollout, end rollout)`` of each chunk; a chunk never spans two runs."""
        size = max(GROUP, self.shape.chunk // GROUP * GROUP)
        for r in range(self.shape.runs):
            lo = int(self.run_first_group[r]) * GROUP
            hi = int(self.run_first_group[r + 1]) * GROUP if r + 1 < self.shape.runs else self.n
            for a in range(lo, hi, size):
                yield r, a, min(a + size, hi)

    def rewards(self, lo: int, hi: int, version: str) -> pa.Table:
        """Long-format reward rows of rollouts ``lo:hi`` under ``version``, in rollout order."""
        w = 0.2 if version == RULE_A else 0.1
        acc, fmt, pen = self.accuracy[lo:hi], self.format[lo:hi], self.len_pen[lo:hi]
        comps = ["accuracy", "format", "length", "total"]
        vals = np.stack([acc, fmt, pen, acc + w * fmt + pen], axis=1).ravel()  # [n, 4] rollout-major
        m = hi - lo
        return pa.table({
            "rollout_id": self.rollout_ids.slice(lo, m).take(pa.array(np.repeat(np.arange(m), 4))),
            "rule_version_id": pa.array([version] * (4 * m)),
            "component": pa.DictionaryArray.from_arrays(pa.array(np.tile(np.arange(4, dtype=np.int32), m)),
                                                        pa.array(comps)),
            "value": pa.array(vals, pa.float64()),
        })

    def chunk(self, run: int, lo: int, hi: int) -> dict[str, pa.Table]:
        """Rollout, token and ``synthetic-a`` reward rows of rollouts ``lo:hi`` (one run)."""
        rng = self.rng
        m = hi - lo
        L = self.length[lo:hi]
        total = int(L.sum())
        starts = np.zeros(m + 1, dtype=np.int64)
        np.cumsum(L, out=starts[1:])
        local = np.repeat(np.arange(m), L)
        pos = (np.arange(total) - starts[:-1][local]).astype(np.int32)
        tok = rng.integers(0, len(VOCAB) - 1, size=total, dtype=np.int32)
        stops = ~self.length_cut[lo:hi]
        tok[starts[1:][stops] - 1] = len(VOCAB) - 1  # completions that stop end with <eos>
        vocab = pa.array(VOCAB, pa.string())
        texts = pa.DictionaryArray.from_arrays(pa.array(tok), vocab)
        generate = self.run_kind[run] == "generate"
        if generate:
            alt = rng.integers(0, len(VOCAB) - 1, size=total * TOPK, dtype=np.int32)
            alt_lp = np.sort(-rng.exponential(1.0, size=(total, TOPK)).astype(np.float32), axis=1)[:, ::-1]
            offs = pa.array(np.arange(0, total * TOPK + 1, TOPK, dtype=np.int32))
            topk_ids = pa.ListArray.from_arrays(offs, pa.array(alt))
            topk_lp = pa.ListArray.from_arrays(offs, pa.array(alt_lp.ravel()))
            step_idx = pa.array(pos // 20)
        else:
            topk_ids = pa.nulls(total, pa.list_(pa.int32()))
            topk_lp = pa.nulls(total, pa.list_(pa.float32()))
            step_idx = pa.nulls(total, pa.int32())
        tokens = pa.table({
            "rollout_id": self.rollout_ids.slice(lo, m).take(pa.array(local)),
            "pos": pa.array(pos),
            "token_id": pa.array(tok),
            "token_text": texts,
            "logprob": pa.array(-rng.exponential(0.4, size=total).astype(np.float32)),
            "entropy": pa.array(rng.gamma(0.6, 0.8, size=total).astype(np.float32)),
            "topk_ids": topk_ids,
            "topk_logprobs": topk_lp,
            "step_idx": step_idx,
        })
        token_lists = pa.ListArray.from_arrays(pa.array(starts.astype(np.int32)), vocab.take(pa.array(tok)))
        g = np.arange(lo, hi) // GROUP
        created = (np.datetime64(self.t0, "us") + np.timedelta64(run * 86_400, "s")
                   + self.group_step[g].astype("timedelta64[s]") * 30)
        rollouts = pa.table({
            "rollout_id": self.rollout_ids.slice(lo, m),
            "run_id": pa.array([self.run_ids[run]] * m),
            "train_step": pa.array(self.group_step[g].astype(np.int32)),
            "prompt_id": self.prompt_ids.take(pa.array(self.group_prompt[g])),
            "group_id": self.group_ids.take(pa.array(g)),
            "sample_idx": pa.array((np.arange(lo, hi) % GROUP).astype(np.int32)),
            "text": pc.binary_join(token_lists, ""),
            "n_tokens": pa.array(L),
            "finish_reason": pa.array(np.where(stops, "stop", "length")),
            "policy_version": pa.array([f"sample@{self.run_ids[run]}"] * m),
            "created_at": pa.array(created),
            "correct": pa.array(self.accuracy[lo:hi] >= 1),  # the rollout's own correctness, as the studio writes it
        })
        return {"rollouts": rollouts, "tokens": tokens, "rewards": self.rewards(lo, hi, RULE_A)}

    def chunks(self) -> Iterator[tuple[int, int, int, dict[str, pa.Table]]]:
        for run, lo, hi in self.spans():
            yield run, lo, hi, self.chunk(run, lo, hi)

    def rescored(self) -> tuple[int, int]:
        """Rollouts ``lo:hi`` that ``synthetic-b`` re-scores: the second half of the runs."""
        first_run = self.shape.runs // 2
        return int(self.run_first_group[first_run]) * GROUP if first_run < self.shape.runs else self.n, self.n


def _id_made_at(prefix: str, when: datetime, rng: np.random.Generator) -> str:
    """An id as ``studio.store.records.new_id`` makes it at time ``when`` (7 base-62 digits of the
    milliseconds, then 9 random hex digits), so that runs made days apart sort, and differ in
    their first 8 bytes, as real ones do."""
    ms = int(when.replace(tzinfo=timezone.utc).timestamp() * 1000)
    digits = []
    for _ in range(7):
        ms, r = divmod(ms, 62)
        digits.append(B62[r])
    return prefix + "".join(reversed(digits)) + "".join(rng.choice(list("0123456789abcdef"), 9))


def build(path: Path, shape: Shape, quiet: bool = False):
    """Create the store at ``path`` (which must not exist); returns the open :class:`Store`.

    Built as ``.<name>.building`` beside it and renamed in when complete; a shared store is built in
    place (its catalog holds its data folder's path: it cannot be renamed) and removed if the build fails.
    """
    from benchmarks.synthetic import write_chunks
    from studio.store import Store, lake

    path = Path(path)
    if path.exists():
        raise SystemExit(f"{path} exists: give a new --db (or remove it)")
    if shape.shared and shape.sharded:
        raise SystemExit("a shared store has no token shards: give --shared or --sharded, not both")
    tmp = path if shape.shared else path.with_name(f".{path.name}.building")
    for p in (() if shape.shared else (tmp, tmp.with_name(tmp.name + ".wal"))):
        p.unlink(missing_ok=True)
    t = time.perf_counter()
    plan = Plan(shape)
    if not quiet:
        print(f"planned {plan.n:,} rollouts, {int(plan.length.sum()):,} tokens, {plan.n_groups:,} groups, "
              f"{len(plan.prompts):,} prompts in {time.perf_counter() - t:.1f} s", flush=True)
    if shape.shared:
        lake.create_shared(path)
    store = Store.open(tmp)
    try:
        store.write({"runs": plan.run_rows(), "rule_versions": plan.rule_rows(), "prompts": plan.prompts})
        lo, hi = plan.rescored()
        later = ((None, None, None, {"rewards": plan.rewards(a, min(a + shape.chunk, hi), RULE_B)})
                 for a in range(lo, hi, max(1, shape.chunk)))
        chunks = plan.chunks()
        if shape.sharded:
            chunks = _sharded(store, chunks, plan.run_ids, plan.run_kind)
        write_chunks(store, chunks, later, total=plan.n, quiet=quiet)
        if not shape.shared:  # (on a shared store CHECKPOINT would compact its data files: stored as written)
            store.cursor().execute("CHECKPOINT")
    except BaseException:
        if shape.shared:
            store.close()
            shutil.rmtree(path, ignore_errors=True)
        raise
    finally:
        store.close()
    if not shape.shared:
        tmp.replace(path)
    if shape.sharded and Path(f"{tmp}.shards").is_dir():
        Path(f"{tmp}.shards").replace(f"{path}.shards")  # Store.open points the view at the new place
    if not quiet:
        print(f"built {path} in {time.perf_counter() - t:.1f} s: {size_of(path) / 2**30:.2f} GiB", flush=True)
    return Store.open(path)


def _sharded(store, chunks, run_ids, run_kind):
    """``chunks`` with each import run's token rows taken out into one shard per run, listed when
    the run's last chunk has gone by (a bulk import of the run)."""
    from studio.store.shards import TokenSink

    sink, sink_run = None, None

    def close():
        with store.transaction() as cur:
            sink.cur = cur
            sink.finish()

    for run, lo, hi, tables in chunks:
        if run != sink_run and sink is not None:
            close()
            sink = None
        if run_kind[run] == "import" and "tokens" in tables:
            if sink is None:
                sink, sink_run = TokenSink(store, None, run_ids[run], min_rows=0), run
            tables = dict(tables)
            sink.add(tables.pop("tokens"))
        yield run, lo, hi, tables
    if sink is not None:
        close()


def size_of(path: Path) -> int:
    """Bytes of the store: the file, its WAL and its shards (a shared store: its folder)."""
    if path.is_dir():
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    wal, shards = Path(str(path) + ".wal"), Path(str(path) + ".shards")
    return (path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
            + sum(f.stat().st_size for f in shards.glob("*.parquet")))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rollouts", type=int, default=Shape.rollouts, help="rollouts (groups of 8)")
    ap.add_argument("--tokens-per-rollout", type=int, default=Shape.tokens_per_rollout, help="mean completion length")
    ap.add_argument("--runs", type=int, default=Shape.runs)
    ap.add_argument("--chunk", type=int, default=Shape.chunk, help="rollouts per Store.write")
    ap.add_argument("--seed", type=int, default=Shape.seed)
    ap.add_argument("--sharded", action="store_true", help="import runs' token rows in Parquet shards, one per run")
    ap.add_argument("--shared", action="store_true", help="a shared store (a folder: SQLite catalog, Parquet data)")
    ap.add_argument("--db", type=Path, default=None,
                    help="where to write the store (must not exist; required, except with --smoke)")
    a = smoke.parse_args(ap, argv, rollouts=800, chunk=200, sharded=True)
    if a.db is None and not a.smoke:
        ap.error("--db is required")
    shape = Shape(a.rollouts, a.tokens_per_rollout, a.runs, a.chunk, a.seed, a.sharded and not a.shared, a.shared)
    with tempfile.TemporaryDirectory(prefix="make-large-store-") as tmp:
        db = a.db or Path(tmp) / "large.duckdb"
        store = build(db, shape)
        counts = store.counts()
        store.close()
        print(json.dumps({"db": str(db), **counts, "bytes": size_of(db)}))


if __name__ == "__main__":
    main()
