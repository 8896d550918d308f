"""``rollout-studio minirun`` (also ``python -m studio.minirun``): a mini-run from the command line,
one option per ``MiniRunConfig`` field (:mod:`studio.configs`)."""
from __future__ import annotations

import argparse
import sys
import time

from studio.configs import add_arguments, from_arguments
from studio.face.cli.common import PROG, _db_argument, _open, command
from studio.runs.minirun import metrics, resume, start, state_of, stop, wait
from studio.runs.training import MiniRunConfig

COMMAND = "minirun"


@command
def main(argv: list[str] | None = None, prog: str = f"{PROG} minirun") -> int:
    """``python -m studio.minirun [--db PATH] [--name NAME] [--resume RUN_ID] [--<setting> VALUE …]``:
    a mini-run from the command line, with one option per ``MiniRunConfig`` field; prints
    each step's metrics as it is stored."""
    ap = argparse.ArgumentParser(prog=prog, description="Train the policy with a mini-run.")
    _db_argument(ap)
    ap.add_argument("--name", default=None, help="run name")
    ap.add_argument("--resume", default=None, help="resume this run id from its last checkpoint")
    ap.add_argument("--task", default="arithmetic", help="the task to train on: arithmetic, or a prompt set the store "
                    "holds (rollout-studio task list; its --prompt-set is a split, by default its train split)")
    add_arguments(ap, MiniRunConfig)
    args = ap.parse_args(argv)
    store = _open(args.db)
    try:
        if args.resume:
            run_id = resume(store, args.resume)
        else:
            cfg = from_arguments(MiniRunConfig, args)
            run_id = start(store, cfg, name=args.name, task=args.task)
    except BaseException:
        store.close()
        raise
    st, shown = state_of(run_id), 0
    try:
        shown = st.first_step - 1
        while st.live or shown < st.step:
            if st.step > shown:  # every step stored since the last look, in order
                m = metrics(store, [run_id])
                for k in range(shown + 1, st.step + 1):
                    last = m[m["train_step"] == k].set_index("metric")["value"]
                    print(f"step {k}/{st.total_steps}: reward {last.get('reward_mean', float('nan')):.3f} · accuracy "
                          f"{last.get('accuracy', float('nan')):.3f} · entropy {last.get('entropy', float('nan')):.3f} · "
                          f"{last.get('step_s', float('nan')):.2f} s", flush=True)
                shown = st.step
            time.sleep(0.2)
    except KeyboardInterrupt:
        stop(run_id)
        wait(run_id, 120)
    print(f"{run_id}: {st.status}" + (f" ({st.error})" if st.error else ""))
    st.process.join(30)
    time.sleep(0.5)  # the reader thread's last write is committed before the status is set; let it return
    store.close()
    return 0 if st.status in ("done", "stopped") else 1

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:], globals().get("ENTRY_PROG", f"{PROG} {COMMAND}")))
