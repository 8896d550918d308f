"""``rollout-studio store``: make a shared store, copy a store between kinds, look at one, compact one.

    rollout-studio store create --shared PATH [--catalog postgresql://user@host:port/db]
                                [--data DIR|s3://bucket/prefix] [--with-samples]
    rollout-studio store copy SRC DST [--catalog URL] [--data DIR|s3://…]
    rollout-studio store info [--db PATH]
    rollout-studio store compact [--db PATH] [--keep-hours H]

The work is :mod:`studio.store.copy`'s and :mod:`studio.store.lake`'s; this module reads the options
and prints. Credentials are never taken as options or printed: a PostgreSQL password comes from
``PGPASSWORD`` or a password file, object storage's keys from ``AWS_*`` (see docs/cli.md).
"""
from __future__ import annotations

import argparse
import sys

from studio.face.cli.common import OK, PROG, _db_argument, command

COMMAND = "store"


@command
def main(argv: list[str] | None = None, prog: str = f"{PROG} {COMMAND}") -> int:
    """``rollout-studio store {create,copy,info,compact} ...`` (see the module's docstring); returns the exit code."""
    ap = argparse.ArgumentParser(prog=prog, description=(
        "Make a shared store (DuckLake: a catalog and Parquet data files that many processes and machines open "
        "at once), copy a store between a single file and a shared store, show what a store holds, compact one."))
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("create", help="make a shared store")
    c.add_argument("--shared", required=True, metavar="PATH", help="the shared store's folder (new or empty)")
    _where_arguments(c)
    c.add_argument("--with-samples", action="store_true", help="seed it with the sample worlds")
    cp = sub.add_parser("copy", help="copy a store into a new one of either kind (counts checked)")
    cp.add_argument("src", help="the store to copy: a .duckdb file, a shared store's folder, a postgresql:// URL")
    cp.add_argument("dst", help="where to copy it: a new .duckdb file, a new folder (a shared store made there), "
                                "or an empty shared store")
    _where_arguments(cp)
    info = sub.add_parser("info", help="what a store is and holds")
    _db_argument(info)
    k = sub.add_parser("compact", help="merge a shared store's small data files, expire old snapshots")
    k.add_argument("--keep-hours", type=float, default=24.0,
                   help="snapshots younger than this are kept (time travel, readers still on them); default 24")
    _db_argument(k)
    args = ap.parse_args(argv)
    return {"create": _create, "copy": _copy, "info": _info, "compact": _compact}[args.cmd](args)


def _where_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--catalog", metavar="URL", help="a PostgreSQL catalog, postgresql://user@host:port/dbname "
                                                     "(password: PGPASSWORD or ~/.pgpass); default a SQLite file "
                                                     "in the folder")
    ap.add_argument("--data", metavar="DIR|s3://BUCKET/PREFIX",
                    help="where the Parquet data files go; default data/ in the folder")


def _create(args: argparse.Namespace) -> int:
    from sample_data import SEED_DIRS
    from studio.store.copy import new_shared

    store, _ = new_shared(args.shared, args.catalog, args.data, seed_dir=SEED_DIRS if args.with_samples else None)
    try:
        rows = store.counts()
        print(f"made {store.describe()}")
        print("rows: " + " · ".join(f"{t} {n:,}" for t, n in rows.items()))
    finally:
        store.close()
    print(f"open it with --db {store.path}, or studio.open({store.path!r}) in a notebook")
    return OK


def _copy(args: argparse.Namespace) -> int:
    from studio.store.copy import copy_store

    def progress(table: str, done: int, total: int) -> None:
        if total >= 1_000_000:  # a large table's progress, batch by batch
            print(f"  {table}: {done:,} of {total:,} rows", file=sys.stderr, flush=True)

    counts = copy_store(args.src, args.dst, catalog=args.catalog, data=args.data, progress=progress)
    print(f"copied {args.src} into {args.dst} (row counts and sums checked)")
    for table, n in counts.items():
        print(f"{table}\t{n:,}")
    return OK


def _info(args: argparse.Namespace) -> int:
    from studio.store import Store
    from studio.store.upkeep import inventory

    store = Store.open_existing(args.db, mirror=False)
    try:
        info = inventory(store)
    finally:
        store.close()
    print(f"kind\t{info['kind']}")
    print(f"store\t{info['store']}")
    if info["kind"] == "shared":
        print(f"catalog\t{info['catalog']}")
        print(f"data\t{info['data']}")
        print(f"snapshot\t{info['snapshot']}")
        print(f"data files\t{info['data_files']:,} ({_size(info['data_bytes'])})")
    elif info["kind"] == "file":
        print(f"file size\t{_size(info['file_bytes'])}")
        print(f"token shards\t{info['shards']:,} ({_size(info['shard_bytes'])})")
    print(f"schema\t{info['schema']}")
    for table, n in info["rows"].items():
        print(f"rows {table}\t{n:,}")
    return OK


def _compact(args: argparse.Namespace) -> int:
    from studio.store import Store
    from studio.store.upkeep import compact

    if args.keep_hours < 0:
        raise ValueError(f"--keep-hours {args.keep_hours:g}: give 0 or more hours")
    store = Store.open_existing(args.db, mirror=False)
    try:
        out = compact(store, keep_hours=args.keep_hours)
    finally:
        store.close()
    print(f"data files\t{out['files_before']:,} ({_size(out['bytes_before'])}) -> "
          f"{out['files_after']:,} ({_size(out['bytes_after'])})")
    print(f"snapshots expired\t{out['snapshots_expired']:,}")
    print(f"old files deleted\t{out['files_deleted'] + out['orphans_deleted']:,}")
    return OK


def _size(n: float) -> str:
    if n < 1024:
        return f"{n:,.0f} B"
    for unit in ("KB", "MB"):
        n /= 1024
        if n < 1024:
            return f"{n:,.1f} {unit}"
    return f"{n / 1024:,.1f} GB"


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:], globals().get("ENTRY_PROG", f"{PROG} {COMMAND}")))
