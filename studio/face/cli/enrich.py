"""``rollout-studio enrich`` (also ``python -m studio.enrich``): fill in imported rollouts' token statistics with a policy."""
from __future__ import annotations

import sys

from studio.face.cli.common import PROG, _db_argument, command
from studio.runs.enrich import enrich_sync
from studio.store import Store

COMMAND = "enrich"


@command
def main(argv: list[str] | None = None, prog: str = f"{PROG} enrich") -> int:
    """``python -m studio.enrich --policy FOLDER [--run RUN_ID] [--db PATH]``; returns the exit code."""
    import argparse
    import sys

    from backends.types import PolicyLoadError

    ap = argparse.ArgumentParser(prog=prog,
                                 description="Fill in token ids, log-probs, entropy and top-k of stored rollouts "
                                             "that lack them (imports), by teacher-forcing a policy.")
    ap.add_argument("--policy", required=True, help="policy folder ('sample' for the bundled one) or a backend URL "
                                                    "(key in $ROLLOUT_STUDIO_API_KEY)")
    ap.add_argument("--run", default=None, help="only this run's rollouts (default: every rollout)")
    ap.add_argument("--batch", type=int, default=64, help="rollouts per worker call and per transaction")
    _db_argument(ap)
    args = ap.parse_args(argv)
    from studio.workers.vocab import resolve_policy

    store = Store.open_existing(args.db, mirror=False)
    try:
        def progress(done: int, total: int) -> None:
            print(f"  {done:,}/{total:,} rollouts", flush=True)

        report = enrich_sync(store, resolve_policy(args.policy) or args.policy, run_id=args.run, batch=args.batch,
                             progress=progress)
    except PolicyLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        store.close()
    print(f"enriched {report.n_rollouts:,} rollouts ({report.n_tokens:,} tokens) with {report.policy_version} "
          f"in {report.seconds:.1f} s; {len(report.skipped)} skipped")
    for rid, why in report.skipped:
        print(f"  skipped {rid}: {why}")
    return 0

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:], globals().get("ENTRY_PROG", f"{PROG} {COMMAND}")))
