"""``rollout-studio task``: bring a prompt set (``add``), list the tasks (``list``), look at one (``show``).

    rollout-studio task add NAME FILE... [--preset gsm8k|math|auto|none] [--prompt COL | --messages COL]
                            [--answer COL] [--id COL] [--split-column COL] [--split NAME] [--level COL]
                            [--extract HOW] [--regex RE] [--steps MODE] [--system TEXT] [--thinking on|off]
    rollout-studio task list
    rollout-studio task show NAME [--split S] [--level L] [--n 5] [--seed 0]

``add``'s options are generated from :class:`studio.ingest.prompt_sets.PromptSetConfig`.
"""
from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from studio.configs import add_arguments, from_arguments
from studio.face.cli.common import PROG, _db_argument, _open, command
from studio.ingest.prompt_sets import PromptSetConfig, PromptSetError, add_prompt_set, check_config
from studio.queries.prompts import draw_prompts, split_counts, stored_tasks, task_choices
from studio.store import Store
from studio.tasks import get_task

COMMAND = "task"


@command
def main(argv: list[str] | None = None, prog: str = f"{PROG} task") -> int:
    """``rollout-studio task {add,list,show} ...`` (see the module's docstring); returns the exit code."""
    ap = argparse.ArgumentParser(prog=prog, description="Bring a prompt set as a task, list the tasks, show one.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("add", help="store a data file (JSONL, JSON, Parquet, CSV, a datasets folder) as a task")
    a.add_argument("name", help="the task's name")
    a.add_argument("paths", nargs="+", metavar="FILE", help="files or datasets folders (save_to_disk)")
    add_arguments(a, PromptSetConfig, skip=("name",))
    _db_argument(a)
    lst = sub.add_parser("list", help="the tasks prompts can be drawn from")
    _db_argument(lst)
    s = sub.add_parser("show", help="a task's settings, splits and a few of its prompts")
    s.add_argument("name", help="the task's name")
    s.add_argument("--split", default=None, help="draw from this split")
    s.add_argument("--level", default=None, help="draw prompts of this level")
    s.add_argument("--n", type=int, default=5, help="prompts shown (default 5)")
    s.add_argument("--seed", type=int, default=0, help="seed of the draw (default 0)")
    _db_argument(s)
    args = ap.parse_args(argv)
    if args.cmd == "add":
        return _add(args)
    store = _open(args.db)
    try:
        return _list(store) if args.cmd == "list" else _show(store, args)
    finally:
        store.close()


def _add(args: argparse.Namespace) -> int:
    config = from_arguments(PromptSetConfig, args, name=args.name)
    check_config(config)  # a bad setting or a missing file makes no store at a new --db path
    missing = [p for p in args.paths if not Path(p).expanduser().exists()]
    if missing:
        raise PromptSetError(f"no such file or folder: {', '.join(missing)}")
    store = Store.open(args.db, mirror=False)
    try:
        rep = add_prompt_set(store, args.paths, config)
    except PromptSetError as exc:
        for p in exc.problems[:50]:
            print(p, file=sys.stderr)
        raise
    finally:
        store.close()
    print(rep.summary())
    for p in rep.skipped:
        print(f"skipped {p}")
    return 0


def _list(store: Store) -> int:
    stored = stored_tasks(store).set_index("name")
    for name in task_choices(store):
        if name in stored.index:
            row = stored.loc[name]
            splits = ", ".join(f"{s} {n:,}" for s, n in row["splits"].items())
            print(f"{name}\t{row['kind']}\t{row['n_prompts']:,} prompts ({splits})\t{row['source']}")
        else:
            print(f"{name}\tbuilt-in\tmakes its prompts\t{get_task(name).description}")
    return 0


def _show(store: Store, args: argparse.Namespace) -> int:
    task = get_task(args.name)
    counts = split_counts(store, args.name)
    prompts = draw_prompts(store, args.name, args.n, seed=args.seed, split=args.split, level=args.level)
    spec = task.spec
    print(f"{task.name}: {task.description}")
    if counts:
        print("splits: " + ", ".join(f"{s} {n:,}" for s, n in counts.items()))
        src = spec.get("source", {})
        for f in src.get("files", []):
            print(f"source: {f['path']} ({f['format']}, sha256 {f['sha256'][:12]})")
        print(f"preset: {src.get('preset')}; columns: "
              + ", ".join(f"{k}={v}" for k, v in (src.get("mapping") or {}).items() if v))
        answer = spec.get("answer") or {}
        print(f"answer: {answer.get('extract', 'auto')}" + (f" /{answer['regex']}/" if answer.get("regex") else "")
              + f"; steps: {spec.get('steps', 'auto')}; template: {spec.get('template') or 'default'}")
    for i, p in enumerate(prompts, 1):
        where = " · ".join(f"{k} {p.meta[k]}" for k in ("split", "level", "id") if k in p.meta)
        print(f"\n[{i}]{' ' + where if where else ''}")
        body = "\n".join(f"{m['role']}: {m['content']}" for m in p.messages) if p.messages else p.text
        print(textwrap.shorten(body, 300, placeholder=" …") if len(body) > 300 else body)
        print(f"gold: {p.gold.get('answer')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:], globals().get("ENTRY_PROG", f"{PROG} {COMMAND}")))
