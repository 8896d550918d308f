"""Big synthetic stores for the benchmarks: written in Arrow slices, reused when asked."""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

SLICE = 250_000  # rows per Store.write: bounded memory for the insert, the same file in the end


def write_store(path: Path, small: dict, big: dict[str, pa.Table], t_gen: float):
    """A store at ``path`` holding ``small`` (DataFrames, one write) and ``big`` (Arrow tables,
    written in slices), checkpointed; prints how long generating and writing took."""
    from studio.store import Store

    store = Store.open(path)
    t = time.perf_counter()
    store.write(small)
    for name, table in big.items():
        for lo in range(0, table.num_rows, SLICE):
            store.write({name: table.slice(lo, SLICE)})
    store.cursor().execute("CHECKPOINT")
    print(f"  generated in {t_gen:.1f} s, written with Store.write in {time.perf_counter() - t:.1f} s", flush=True)
    return store


def open_or_build(path: Path, n: int, bench_rewards: tuple[str, list, int], build: Callable[[Path, int], object]):
    """Reuse the store at ``path`` if it holds ``n`` rollouts and the expected count of the
    benchmark's reward rows (``(sql, params, count)``), else build it with ``build``."""
    from studio.store import Store

    if path.exists():
        store = Store.open(path)
        got = store.scalar("SELECT count(*) FROM rollouts")
        sql, params, want = bench_rewards
        got_rw = store.scalar(sql, params)
        if got != n or got_rw != want:
            raise SystemExit(f"{path} holds {got} rollouts / {got_rw} bench rewards, wanted {n} / {want}: "
                             "give another --db (or none, for a temporary store)")
        print(f"store: reusing {path}", flush=True)
        return store
    print(f"store: building {n:,} rollouts at {path}", flush=True)
    return build(path, n)


def write_chunks(store, *chunks, total: int, quiet: bool = False) -> None:
    """Write each ``(run, lo, hi, {table: Arrow table})`` of the iterables in ``chunks`` with
    one ``Store.write`` (one transaction, as a producer writes a chunk), printing progress
    every tenth of ``total`` rollouts."""
    t, done, shown = time.perf_counter(), 0, 0
    for part in chunks:
        for _run, lo, hi, tables in part:
            store.write(tables)
            if lo is None:
                continue
            done += hi - lo
            if not quiet and done * 10 // max(total, 1) > shown:
                shown = done * 10 // max(total, 1)
                print(f"  {done:,} rollouts written in {time.perf_counter() - t:.1f} s", flush=True)
