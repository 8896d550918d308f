"""``rollout-studio import`` (also ``python -m studio.importers``): a training run's rollouts into the store, or a folder tailed."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from studio.configs import settings_of
from studio.face.cli.common import PROG, _db_argument, command
from studio.ingest.errors import ImportFormatError, MalformedInput
from studio.ingest.formats import FORMATS, ColumnMapping
from studio.ingest.importers import check_task, import_run
from studio.store import Store
from studio.tasks import UnknownTaskError

COMMAND = "import"


@command
def main(argv: list[str] | None = None, prog: str = f"{PROG} import") -> int:
    """``python -m studio.importers PATH... [--format F] [--map field=column ...] [--skip-bad] [--tail]``."""
    import argparse

    from studio.store import StoreError

    ap = argparse.ArgumentParser(prog=prog,
                                 description="Import the rollouts of a training run (TRL, verl, OpenRLHF / "
                                             "RL-Logging-Board, or any JSONL / Parquet with --map), or the agent "
                                             "trajectories of verl, SkyRL, TRL, rLLM, OpenAI chat or Responses, "
                                             "into the store.")
    ap.add_argument("paths", nargs="+", help="files, or run directories (their shards are imported in step order)")
    ap.add_argument("--format", choices=FORMATS, default=None, help="default: detected from the files")
    ap.add_argument("--map", action="append", default=[], metavar="FIELD=COLUMN",
                    help="which column holds a field (repeatable; rewards=a,b for components): "
                         + ", ".join(s.name for s in settings_of(ColumnMapping)))
    ap.add_argument("--skip-bad", action="store_true", help="skip malformed records (default: import nothing)")
    ap.add_argument("--name", default=None, help="the run's name (default: the directory or file name)")
    ap.add_argument("--tokenizer", default=None, metavar="POLICY",
                    help="agent formats: a policy folder (or sample-chat) whose tokenizer decodes token ids given "
                         "without texts")
    ap.add_argument("--task", default="import", help="the task the prompts belong to: a registered one, or 'import' "
                    "(the prompts as they are); anything else is refused")
    _db_argument(ap)
    ap.add_argument("--tail", action="store_true", help="keep importing new steps of one directory until Ctrl-C")
    ap.add_argument("--interval", type=float, default=2.0, help="--tail: seconds between looks")
    args = ap.parse_args(argv)
    def refuse(message: str) -> int:  # bad input: said on stderr, nothing changed (exit 2)
        print(f"error: {message}", file=sys.stderr)
        return 2

    try:
        mapping = ColumnMapping.parse(args.map) if args.map else None
        if args.tail and (len(args.paths) != 1 or not Path(args.paths[0]).is_dir()):
            raise ValueError("--tail follows one directory")
        missing = [p for p in args.paths if not Path(p).expanduser().exists()]
        if missing:  # checked before the store is opened: a typo makes no store
            raise ValueError(f"no such file or directory: {', '.join(missing)}")
        check_task(args.task)
        store = Store.open(args.db, mirror=False)
    except (OSError, ValueError, RuntimeError, StoreError, UnknownTaskError) as exc:  # RuntimeError: '~nouser'
        return refuse(str(exc))
    on_error = "skip" if args.skip_bad else "abort"
    try:
        if args.tail:
            return _tail(store, args, mapping, on_error)
        rep = import_run(store, args.paths, args.format, mapping=mapping, on_error=on_error, name=args.name,
                         task=args.task, tokenizer=args.tokenizer)
    except MalformedInput as exc:
        for p in exc.problems:
            print(p, file=sys.stderr)
        return refuse(str(exc))
    except ImportFormatError as exc:
        return refuse(str(exc))
    finally:
        store.close()
    print(rep.summary())
    for p in rep.skipped:
        print(p)
    return 0


def _tail(store: Store, args, mapping: ColumnMapping | None, on_error: str) -> int:
    from studio.ingest.tail import Tailer

    tailer = Tailer(store, args.paths[0], args.format, mapping, on_error=on_error, interval_s=args.interval,
                    name=args.name, task=args.task, tokenizer=args.tokenizer)
    print(f"following {tailer.directory} every {args.interval:g} s (Ctrl-C stops)", flush=True)
    try:
        while True:
            try:
                rep = tailer.poll()
            except (MalformedInput, ImportFormatError) as exc:
                print(f"error: {exc}", flush=True)
                rep = None
            if rep is not None:
                print(rep.summary(), flush=True)
                for p in rep.skipped:
                    print(p, flush=True)
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:], globals().get("ENTRY_PROG", f"{PROG} {COMMAND}")))
