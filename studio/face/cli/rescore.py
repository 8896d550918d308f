"""``rollout-studio rescore``: teacher-force stored rollouts through a policy in a chosen precision
(``studio.runs.rescore``): recomputed log-probs beside the sampler's, for the training–inference mismatch."""
from __future__ import annotations

import sys

from studio.face.cli.common import FAILED, OK, PROG, _db_argument, command

COMMAND = "rescore"


@command
def main(argv: list[str] | None = None, prog: str = f"{PROG} {COMMAND}") -> int:
    """``rollout-studio rescore --policy P [--precision D] (--run RUN | --rollout ID …) [--db PATH]``;
    returns the exit code (2: bad input, another tokenizer; 1: nothing in the scope)."""
    import argparse

    from backends.device import PRECISIONS
    from studio.runs.rescore import rescore_sync
    from studio.store import Store
    from studio.workers.vocab import resolve_policy

    ap = argparse.ArgumentParser(prog=prog, description=(
        "Teacher-force stored rollouts through a policy in a chosen precision: every token's recomputed log-prob, "
        "entropy and rank go to token_scores, and a rollout's first recomputation fills tokens.train_logprob "
        "(the train side of the training-inference mismatch). Rollouts without log-probs are enriched instead."))
    ap.add_argument("--policy", required=True, help="policy folder ('sample' for the bundled one) or a backend URL")
    ap.add_argument("--precision", default="float32", choices=PRECISIONS,
                    help="dtype the policy is loaded in (default float32; a backend scores in its own)")
    scope = ap.add_mutually_exclusive_group(required=True)
    scope.add_argument("--run", help="every rollout of this run")
    scope.add_argument("--rollout", nargs="+", metavar="ID", help="these rollouts")
    ap.add_argument("--batch", type=int, default=64, help="rollouts per worker call and per transaction")
    _db_argument(ap)
    args = ap.parse_args(argv)
    store = Store.open_existing(args.db, mirror=False)
    try:
        if args.run is not None:
            ids = store.df("SELECT rollout_id FROM rollouts WHERE run_id = ? ORDER BY rollout_id",
                           [args.run])["rollout_id"].tolist()
            where = f"run {args.run}"
        else:
            known = set(store.df("SELECT rollout_id FROM rollouts WHERE list_contains(?, rollout_id)",
                                 [args.rollout])["rollout_id"])
            missing = [r for r in args.rollout if r not in known]
            if missing:
                raise ValueError(f"no rollout {', '.join(missing)} in {args.db}")
            ids, where = args.rollout, f"{len(args.rollout)} rollouts"
        if not ids:
            print(f"nothing to rescore: {where} has no rollouts", file=sys.stderr)
            return FAILED
        report = rescore_sync(store, resolve_policy(args.policy) or args.policy, ids, precision=args.precision,
                              batch=args.batch)
    finally:
        store.close()
    print(f"{report.summary()} in {report.seconds:.1f} s")
    for rid, why in report.skipped:
        print(f"  skipped {rid}: {why}")
    return OK


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
