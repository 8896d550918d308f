"""``rollout-studio export``: accepted pairs as TRL data, or a rollout / group / fork tree as static HTML."""
from __future__ import annotations

import argparse
import sys

from studio.face.cli.common import OK, PROG, _db_argument, _open, _sample_policy, command
from widgets.base.style import CHANNELS

COMMAND = "export"


@command
def main(argv: list[str], prog: str = f"{PROG} export") -> int:
    from studio.face.cli.curate import add_export_arguments, run_export

    ap = argparse.ArgumentParser(
        prog=prog,
        description="Write the accepted preference pairs in a TRL dataset format (with a provenance sidecar); or, "
                    "with --rollout, --group or --fork-tree, one self-contained HTML page of it that opens in any "
                    "browser without a server (hover cards included).")
    _db_argument(ap)
    add_export_arguments(ap)
    html = ap.add_argument_group("static HTML (instead of pairs)")
    one = html.add_mutually_exclusive_group()
    one.add_argument("--rollout", help="a rollout id: its token strip")
    one.add_argument("--group", help="a group id (or a prompt id: its newest group): every completion")
    one.add_argument("--fork-tree", help="a rollout id: its strip and its tree of branches")
    html.add_argument("--channel", default="entropy", choices=CHANNELS,
                      help="what colours the tokens")
    args = ap.parse_args(argv)


    store = _open(args.db)
    try:
        if args.rollout or args.group or args.fork_tree:
            from studio.face import api

            path = api.Studio(store, _sample_policy()).save_html(
                args.out, rollout=args.rollout, group=args.group, fork_tree=args.fork_tree, channel=args.channel)
            print(f"wrote {path}")
            return OK
        return run_export(store, args)
    finally:
        store.close()

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:], globals().get("ENTRY_PROG", f"{PROG} {COMMAND}")))
