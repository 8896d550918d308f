"""``rollout-studio score`` (also ``python -m studio.rules``): re-score stored rollouts as a new rule version."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from studio.face.cli.common import BAD_INPUT, FAILED, OK, PROG, _db_argument, _err, _open, _sample_policy, command

COMMAND = "score"


@command
def main(argv: list[str], prog: str = f"{PROG} score") -> int:
    """``rollout-studio score`` (also ``python -m studio.rules``)."""
    ap = argparse.ArgumentParser(prog=prog, description="Re-score stored rollouts and store the result as a "
                                 "new rule version: a reward rule runs in the sandbox, a reward model in the worker.")
    _db_argument(ap)
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--rule", help="a .py file or dotted module defining reward(prompt, completion, gold, steps, **ctx)")
    what.add_argument("--reward-model", type=Path, help="a sequence-classification reward-model folder")
    ap.add_argument("--name", default=None, help="the rule's name (default: the file or module name)")
    ap.add_argument("--note", default="", help="why this version (stored with it)")
    ap.add_argument("--run", default=None, help="only rollouts of this run id")
    args = ap.parse_args(argv)

    from backends import PolicyLoadError
    from studio.rewards.rules import RuleSourceError
    from studio.store import StoreError

    try:
        from studio.face import api

        s = api.Studio(_open(args.db), _sample_policy())
    except StoreError as exc:
        _err(exc)
        return BAD_INPUT
    try:
        res = s.score(args.rule, reward_model=args.reward_model, name=args.name, note=args.note, run=args.run)
    except (OSError, ValueError, RuleSourceError, PolicyLoadError) as exc:
        _err(exc)
        return BAD_INPUT
    finally:
        s.close()
    print(f"{res.rule_version_id}: {res.status}, {res.scored} scored, {res.failed} failed"
          + (f" ({res.message})" if res.message else ""))
    for rid, msg in res.errors:
        print(f"  {rid}: {msg}")
    return OK if res.status in ("done", "unchanged") and not res.failed else FAILED

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:], globals().get("ENTRY_PROG", f"{PROG} {COMMAND}")))
