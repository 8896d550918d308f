"""``rollout-studio curate`` (also ``python -m studio.curation``): build preference pairs, review them, export them."""
from __future__ import annotations

import argparse
import sys

from studio.configs import add_arguments, from_arguments
from studio.curation import (
    FILETYPES,
    FORMATS,
    LEVELS,
    STYLES,
    PairRule,
    build_pairs,
    builds,
    decide,
    export,
    progress,
)
from studio.face.cli.common import PROG, _db_argument, command
from studio.store import Store

COMMAND = "curate"


def add_export_arguments(e: argparse.ArgumentParser) -> None:
    """The options of an export of accepted pairs (``curation export``, ``rollout-studio export``)."""
    e.add_argument("--out", required=True, help="file (.jsonl, .parquet) or folder (a datasets save_to_disk folder)")
    e.add_argument("--format", default="preference", choices=FORMATS)
    e.add_argument("--style", default="standard", choices=STYLES)
    e.add_argument("--filetype", default=None, choices=FILETYPES, help="default: from --out's suffix")
    e.add_argument("--overwrite", action="store_true", help="replace --out if it exists (default: write name-2…)")
    e.add_argument("--skip-stale", action="store_true", help="leave stale pairs out instead of refusing")
    e.add_argument("--build", default=None, help="only pairs of this build")
    e.add_argument("--kind", action="append", choices=LEVELS, default=None,
                   help="only pairs of this kind (repeatable)")
    e.add_argument("--step-source", default=None, help="stepwise: the step-reward source that labels steps")
    e.add_argument("--step-threshold", type=float, default=0.5, help="stepwise: a step is good when its reward > this")
    e.add_argument("--no-answer-step", dest="answer_step", action="store_false",
                   help="stepwise: leave out the text after the last step (default: a step labelled by correctness)")
    e.add_argument("--conflicts", default="drop", choices=("drop", "keep"),
                   help="unpaired: a completion both chosen and rejected is left out (drop) or kept twice")


def run_export(store: Store, args: argparse.Namespace) -> int:
    """Export as :func:`add_export_arguments`' options say; prints what was written. Raises
    what :func:`studio.curation.writer.export` raises (the caller maps it to an exit code)."""
    res = export(store, args.out, args.format, args.style, args.filetype, overwrite=args.overwrite,
                 skip_stale=args.skip_stale, build_id=args.build, kinds=args.kind, step_source=args.step_source,
                 step_threshold=args.step_threshold, answer_step=args.answer_step, conflicts=args.conflicts)
    print(res.message)
    print(f"provenance: {res.provenance_path}")
    return 0


@command
def main(argv: list[str] | None = None, prog: str = f"{PROG} curate") -> int:
    """``python -m studio.curation {build,accept,reject,status,export} --db PATH ...`` (see the
    module's docstring); returns the exit code."""

    ap = argparse.ArgumentParser(prog=prog,
                                 description="Build preference pairs from stored rollouts, review them, and export "
                                             "them in TRL's dataset formats.")
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p):
        _db_argument(p)
        return p

    b = common(sub.add_parser("build", help="make pairs with a rule (stored as pending)"))
    add_arguments(b, PairRule)
    b.add_argument("--run", action="append", default=None, help="only rollouts of this run id (repeatable)")
    b.add_argument("--version", default=None, help="reward version to compare (default: the task's rule)")
    for name, help_ in (("accept", "accept pairs (for review without the UI)"), ("reject", "reject pairs")):
        p = common(sub.add_parser(name, help=help_))
        p.add_argument("--pair", action="append", default=None, help="a pair id (repeatable)")
        p.add_argument("--build", default=None, help="every pair of this build")
        p.add_argument("--all", dest="all_pairs", action="store_true",
                       help="with --build: every pair of the build, decided ones too (default: its pending pairs, "
                            "so a person's decisions stand)")
        p.add_argument("--reviewer", default=None, help="who decided (default: the login name)")
    common(sub.add_parser("status", help="review progress and builds"))
    add_export_arguments(common(sub.add_parser("export", help="write accepted pairs in a TRL format")))
    args = ap.parse_args(argv)
    store = Store.open_existing(args.db, mirror=False)
    try:
        if args.cmd == "build":
            rule = from_arguments(PairRule, args)
            res = build_pairs(store, rule, run_ids=args.run, rule_version_id=args.version)
            print(res.message + (f" [build {res.build_id}]" if res.build_id else ""))
            return 0 if res.pairs else 1
        if args.cmd in ("accept", "reject"):
            if not args.pair and not args.build:
                print("error: give --pair ID (repeatable) or --build ID", file=sys.stderr)
                return 2
            n = decide(store, "accepted" if args.cmd == "accept" else "rejected", args.pair, build_id=args.build,
                       reviewer=args.reviewer, only_pending=not args.all_pairs)
            print(f"{args.cmd}ed {n} pairs")
            return 0
        if args.cmd == "status":
            p = progress(store)
            print(f"{p['total']} pairs: {p['pending']} pending, {p['accepted']} accepted, {p['rejected']} rejected, "
                  f"{p['stale']} stale")
            for r in builds(store).itertuples(index=False):
                print(f"  {r.build_id}  {r.rule} ({r.level}) under {r.rule_version_id}: {r.n_pairs} pairs, "
                      f"{r.pending} pending, {r.accepted} accepted, {r.rejected} rejected")
            return 0
        return run_export(store, args)
    finally:
        store.close()

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:], globals().get("ENTRY_PROG", f"{PROG} {COMMAND}")))
