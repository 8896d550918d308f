"""Mini-runs on the sample agent world: what 5 minutes of CPU training do to held-out success.

Run: ``python benchmarks/bench_agent_minirun.py`` (about 5 minutes of training plus two
evaluations on a 2-core CPU; ``--train-minutes 1`` for a quick look).

``agent_minirun_success_points`` (baseline ``agent_success_before_points``)
    The sample agent policy (``sample_data/agent_policy``) on ``calculator_agent``: success
    (the final ``\\boxed{}`` answer right, the task's verdict) on ``--heldout`` held-out
    prompts (``studio.runs.training.heldout_prompts``: a seeded draw disjoint by seed from the
    training pool), before and after a mini-run with the agent task's default settings
    (``MiniRunConfig()`` on ``calculator_agent``, which takes ``studio.runs.training.task_defaults``:
    the sample agent policy, its budgets and step size) trained for ``--train-minutes`` of wall
    time counted from ``minirun.start``: the run is started with more steps than it can take,
    ``minirun.stop`` is called when the time is up, the worker finishes the step in flight and
    saves a checkpoint, and that checkpoint is the "after" policy. Both are evaluated with
    ``studio.runs.training.evaluate_job`` in this process (the same ``--eval-seed``): k =
    ``--eval-k`` trajectories per prompt at temperature 1 through the agent loop (tools in the
    sandbox) and one greedy. The figure is the mean sampled success after, in points;
    ``baseline_value`` the same before; ``ratio`` after / before (above 1: training helped).

``agent_minirun_tool_errors`` (baseline ``agent_tool_errors_before``)
    Failed tool calls per trajectory (not valid JSON, the tool refused the expression) after,
    before as the baseline; ratio after / before.

For people: greedy success, pass@k, tool calls and turns per trajectory before and after, and
the run's per-step curve (reward, success, turns, tool calls, failed calls, seconds).
``--smoke``: two steps instead of a timed run, 4 held-out prompts, k = 1.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: import the project's packages

for _k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HUB_DISABLE_PROGRESS_BARS"):
    os.environ.setdefault(_k, "1")
os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")  # transformers 5 deprecation notices, in workers too

# light imports only: the mini-run's worker is started with the spawn method, which imports this module again
from benchmarks import smoke  # noqa: E402

TASK = "calculator_agent"
CURVE = ("reward_mean", "accuracy", "agent/turns", "agent/tool_calls", "agent/tool_errors", "step_s")


def evaluate(policy: str, heldout: list[dict], k: int, seed: int) -> tuple[dict, float]:
    """``evaluate_job`` in this process with the agent task's budgets; (result, seconds)."""
    from studio.runs.training import MiniRunConfig, evaluate_job, with_task_defaults
    from studio.tasks import get_task

    task = get_task(TASK)
    cfg = with_task_defaults(MiniRunConfig(), task)
    t = time.perf_counter()
    out = evaluate_job(policy, heldout, task.spec, k, cfg.max_new_tokens, seed, cfg.max_turns)
    return out, time.perf_counter() - t


def train(store, policy: str, minutes: float, steps: int | None) -> dict:
    """A default agent mini-run from ``policy``, stopped after ``minutes`` (or ``steps`` steps); its last
    checkpoint and curve."""
    from studio.runs import minirun
    from studio.runs.training import MiniRunConfig

    cfg = MiniRunConfig(policy=policy, steps=steps or 100_000)
    t0 = time.perf_counter()
    run_id = minirun.start(store, cfg, name="agent 5-minute run", task=TASK)
    st = minirun.state_of(run_id)
    while st.live and (steps or time.perf_counter() - t0 < minutes * 60):
        time.sleep(0.5)
    train_s = time.perf_counter() - t0
    minirun.stop(run_id)
    minirun.wait(run_id, 600)
    if st.status not in ("done", "stopped"):
        raise SystemExit(f"the mini-run ended {st.status}: {st.error}")
    step, path = minirun.last_checkpoint(store, run_id)
    m = minirun.metrics(store, [run_id])
    pivot = m.pivot_table(index="train_step", columns="metric", values="value")
    return {"checkpoint": (step, path), "train_s": train_s, "pivot": pivot,
            "config": json.loads(store.scalar("SELECT config FROM runs WHERE run_id = ?", [run_id]))}


def figure(name: str, value: float, unit: str, baseline: str, base: float) -> None:
    print(json.dumps({"figure": name, "value": round(value, 4), "unit": unit, "baseline": baseline,
                      "baseline_value": round(base, 4), "ratio": round(value / base, 4) if base else None}),
          flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train-minutes", type=float, default=5.0, help="wall-clock minutes of the mini-run")
    ap.add_argument("--steps", type=int, default=None, help="train this many steps instead of a timed run")
    ap.add_argument("--heldout", type=int, default=200, help="held-out prompts")
    ap.add_argument("--eval-k", type=int, default=4, help="trajectories per held-out prompt at temperature 1")
    ap.add_argument("--eval-seed", type=int, default=1, help="sampling seed of both evaluations")
    ap.add_argument("--policy", default=None, help="the policy to start from (default: the sample agent policy)")
    args = smoke.parse_args(ap, steps=2, heldout=4, eval_k=1)

    from sample_data import AGENT_POLICY_DIR
    from studio.runs.training import heldout_prompts
    from studio.store import Store
    from studio.tasks import get_task

    policy = str(args.policy or AGENT_POLICY_DIR)
    heldout = [p.to_json() for p in heldout_prompts(get_task(TASK), args.heldout)]
    print(f"evaluating {policy} on {len(heldout)} held-out prompts (k = {args.eval_k} at temperature 1 "
          f"+ greedy, seed {args.eval_seed}) ...", flush=True)
    before, s_before = evaluate(policy, heldout, args.eval_k, args.eval_seed)
    print(f"  before: {json.dumps({k: round(v, 3) for k, v in before.items()})} ({s_before:.0f} s)", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-agent-minirun-") as tmp:
        store = Store.open(Path(tmp) / "s.duckdb")
        try:
            what = f"{args.steps} steps" if args.steps else f"{args.train_minutes:g} min"
            print(f"training a default agent mini-run for {what} ...", flush=True)
            run = train(store, policy, args.train_minutes, args.steps)
            step, ckpt = run["checkpoint"]
            print(f"  settings: {json.dumps(run['config'])}", flush=True)
            print(f"  {step} steps in {run['train_s']:.0f} s; per step:", flush=True)
            print(run["pivot"][[c for c in CURVE if c in run["pivot"]]].round(3).to_string(), flush=True)
            after, s_after = evaluate(ckpt, heldout, args.eval_k, args.eval_seed)
        finally:
            store.close()
    print(f"  after: {json.dumps({k: round(v, 3) for k, v in after.items()})} ({s_after:.0f} s)", flush=True)
    k = args.eval_k
    print(f"\nheld-out, {len(heldout)} prompts, before and after {run['train_s'] / 60:.1f} min ({step} steps):")
    for label, key in ((f"success, temperature 1, k = {k} (the figure)", "accuracy"), ("greedy success", "greedy_accuracy"),
                       (f"pass@{k}", f"pass@{k}"), ("turns per trajectory", "turns"),
                       ("tool calls per trajectory", "tool_calls"), ("failed tool calls per trajectory", "tool_errors"),
                       ("trajectory length, tokens", "mean_length")):
        print(f"  {label:<48} {before[key]:>8.3f} {after[key]:>8.3f} {after[key] - before[key]:>+8.3f}")
    figure("agent_minirun_success_points", 100 * after["accuracy"], "points", "agent_success_before_points",
           100 * before["accuracy"])
    figure("agent_minirun_tool_errors", after["tool_errors"], "failed calls per trajectory", "agent_tool_errors_before",
           before["tool_errors"])


if __name__ == "__main__":
    main()
