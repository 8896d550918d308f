"""``rollout-studio minirun`` (also ``python -m studio.minirun``): a mini-run from the command line, one option per ``MiniRunConfig`` field."""
from __future__ import annotations

import sys
import time

from studio.face.cli.common import PROG
from studio.runs.minirun import MiniRunBusy, metrics, resume, start, state_of, stop, wait
from studio.runs.training import MiniRunConfig, TrainConfigError
from studio.store import Store

COMMAND = "minirun"


def main(argv: list[str] | None = None, prog: str = f"{PROG} minirun") -> int:
    """``python -m studio.minirun [--db PATH] [--name NAME] [--resume RUN_ID] [--<setting> VALUE …]``:
    a mini-run from the command line, with one option per ``MiniRunConfig`` field; prints
    each step's metrics as it is stored."""
    import argparse
    from dataclasses import fields as dc_fields

    from studio.store import default_db_path

    ap = argparse.ArgumentParser(prog=prog, description="Train the policy with a mini-run.")
    ap.add_argument("--db", default=None, help="store file (default: the studio's)")
    ap.add_argument("--name", default=None, help="run name")
    ap.add_argument("--resume", default=None, help="resume this run id from its last checkpoint")
    defaults = MiniRunConfig()
    for f in dc_fields(MiniRunConfig):
        v = getattr(defaults, f.name)
        kind = (lambda s: s.lower() in ("1", "true", "yes")) if isinstance(v, bool) else type(v)
        ap.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=v, help=f.metadata["help"])
    args = ap.parse_args(argv)
    store = Store.open(args.db or default_db_path())
    try:
        if args.resume:
            run_id = resume(store, args.resume)
        else:
            cfg = MiniRunConfig(**{f.name: getattr(args, f.name) for f in dc_fields(MiniRunConfig)})
            run_id = start(store, cfg, name=args.name)
    except (TrainConfigError, MiniRunBusy, OSError, ValueError) as exc:
        print(f"error: {exc}")
        return 2
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
