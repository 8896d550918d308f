"""``rollout-studio generate``: sample completions from a policy in a worker, score and store them as a run."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from studio.configs import add_arguments
from studio.face.cli.common import BAD_INPUT, FAILED, OK, PROG, _db_argument, _err, _open, _sample_policy, command

COMMAND = "generate"


@command
def main(argv: list[str], prog: str = f"{PROG} generate") -> int:
    from studio.runs.generation import GenerateConfig

    ap = argparse.ArgumentParser(prog=prog, description="Sample completions from a policy in a worker, "
                                 "score them with the task's rule (and the active rule version) and store them as a run.")
    _db_argument(ap)
    ap.add_argument("--policy", default=None, help="policy folder (default: the sample policy)")
    ap.add_argument("--prompt", action="append", default=[], help="a prompt, e.g. 'Q: 23+48-7=' (repeatable)")
    ap.add_argument("--prompts", type=Path, default=None, help="a file of prompts, one per line")
    ap.add_argument("--fresh", type=int, default=0, help="also draw this many prompts from the task: new ones from the "
                    "sample task's generator, or a seeded draw of a stored prompt set's --split")
    ap.add_argument("--difficulty", default="medium", help="difficulty of --fresh prompts of the sample task "
                    "(easy, medium, hard)")
    ap.add_argument("--split", default=None, help="the split --fresh draws from (a stored prompt set: default its "
                    "train split)")
    ap.add_argument("--task", default="arithmetic", help="the task the prompts belong to: arithmetic, or a prompt set "
                    "the store holds (rollout-studio task list)")
    ap.add_argument("--name", default=None, help="the run's name")
    add_arguments(ap, GenerateConfig)
    args = ap.parse_args(argv)

    from backends import PolicyLoadError
    from studio.runs.generation import ConfigError
    from studio.store import StoreError
    from studio.tasks import TaskParseError, UnknownTaskError, get_task

    s = None
    try:
        prompts = list(args.prompt)
        if args.prompts:
            prompts += [line for line in args.prompts.read_text().splitlines() if line.strip()]
        from studio.face import api

        s = api.Studio(_open(args.db), args.policy or _sample_policy())
        task = get_task(args.task)  # after the store is open: it defines its prompt sets
        if args.fresh:
            from studio.queries.prompts import draw_prompts

            prompts += (task.make_prompts(args.fresh, seed=args.seed, difficulty=args.difficulty) if task.generates
                        else draw_prompts(s.store, task.name, args.fresh, seed=args.seed, split=args.split))
    except (OSError, ValueError, StoreError, UnknownTaskError) as exc:
        if s is not None:  # an unknown task or an empty split: the store was opened, close it
            s.close()
        _err(exc)
        return BAD_INPUT
    try:
        res = s.generate(prompts, group_size=args.group_size, temperature=args.temperature, top_p=args.top_p,
                         max_new_tokens=args.max_new_tokens, seed=args.seed, top_k_stats=args.top_k_stats,
                         max_turns=args.max_turns, task=args.task, name=args.name, progress=True)
    except (TaskParseError, ConfigError, PolicyLoadError, UnknownTaskError) as exc:
        _err(exc)
        return BAD_INPUT
    finally:
        s.close()
    where = f" on {res.device}" if res.device else ""
    print(f"{res.run_id}: {res.status}, {res.rollouts} rollouts stored{where}"
          + (f" ({res.error})" if res.error else ""))
    return OK if res.status == "done" else FAILED

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:], globals().get("ENTRY_PROG", f"{PROG} {COMMAND}")))
