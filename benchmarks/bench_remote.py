"""Sampling through the HTTP backend on loopback against the in-process backend.

Run: ``python benchmarks/bench_remote.py`` (about 1-2 minutes on a busy 2-core CPU).

The same model (the sample policy), the same batch, settings and seed go once through
``backends.policy.Policy.sample`` in this process and once through
``backends.remote.RemotePolicy.sample`` to ``python -m backends.server`` on 127.0.0.1 (the
studio's extension on: exact entropies, token ids and top-5 in the response). Both sides
use the same number of torch threads, and the runs are interleaved (alternating which goes
first) so load changes on a shared machine hit both alike; medians are compared. The same
seed gives both the same tokens, which the script checks, so tokens/s compare like for like.

Two batches: the one Generate sends (4 prompts x a group of 8, 48 new tokens: the figure)
and a larger one (16 prompts x 8). Target: remote / local >= 0.8 (the API costs at most a
fifth).

Options: --reps, --prompts, --group, --new-tokens, --threads, --seed, --smoke (one repetition of
1 prompt x 2, 8 new tokens: seconds, most of them the backend's start).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: import the project's packages

from benchmarks import smoke  # noqa: E402

TARGET = 0.8


def start_server(port: int, threads: int) -> subprocess.Popen:
    env = dict(os.environ, ROLLOUT_STUDIO_THREADS=str(threads), ROLLOUT_STUDIO_DEVICE="cpu")
    env.pop("ROLLOUT_STUDIO_API_KEY", None)
    proc = subprocess.Popen([sys.executable, "-m", "backends.server", "--policy", "sample", "--port", str(port)],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the backend exited (code {proc.returncode})")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).read()
            return proc
        except OSError:
            time.sleep(0.2)
    raise SystemExit("the backend did not answer in 120 s")


def measure(local, remote, prompts: list[str], kw: dict, reps: int) -> dict:
    """Interleaved timings of both sides on one batch; the tokens they drew must agree."""
    times = {"local": [], "remote": []}
    runs = {"local": local.sample, "remote": remote.sample}
    tokens = {}
    for side in runs:  # warm-up: lazy imports, first-call setup, the server's model load
        runs[side](prompts, **kw)
    for rep in range(reps):
        for side in (("local", "remote") if rep % 2 == 0 else ("remote", "local")):
            t0 = time.perf_counter()
            gens = runs[side](prompts, **kw)
            times[side].append(time.perf_counter() - t0)
            tokens[side] = [g.token_ids.tolist() for g in gens]
    same = tokens["local"] == tokens["remote"]
    n_tok = sum(len(t) for t in tokens["local"])
    med = {side: statistics.median(t) for side, t in times.items()}
    return {"tokens": n_tok, "same_tokens": same, "median_s": med,
            "tokens_s": {side: n_tok / med[side] for side in med}}


def main(args) -> None:
    import torch

    from backends.device import cpu_threads
    from backends.policy import load_policy
    from backends.remote import RemotePolicy
    from sample_data import POLICY_DIR
    from studio.tasks import get_task
    from tests.ui.harness import free_port

    threads = args.threads or cpu_threads()
    torch.set_num_threads(threads)
    port = free_port()
    print(f"starting the backend on 127.0.0.1:{port} ({threads} torch thread(s) on each side) ...", flush=True)
    proc = start_server(port, threads)
    try:
        local = load_policy(POLICY_DIR, device="cpu")
        remote = RemotePolicy(f"http://127.0.0.1:{port}")
        task = get_task("arithmetic")
        results = {}
        for name, n_prompts in (("generate_chunk", args.prompts), ("large", 4 * args.prompts)):
            prompts = [p.text for p in task.make_prompts(n_prompts, seed=args.seed)]
            kw = dict(n=args.group, temperature=1.0, top_p=1.0, max_new_tokens=args.new_tokens, seed=args.seed,
                      top_k_stats=5)
            print(f"  {name}: {n_prompts} prompts x {args.group}, {args.new_tokens} new tokens, {args.reps} reps ...",
                  flush=True)
            results[name] = measure(local, remote, prompts, kw, args.reps)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)

    print()
    print(f"{'batch':<16} {'rows':>5} {'tokens':>7} {'local s':>9} {'remote s':>9} {'local tok/s':>12} "
          f"{'remote tok/s':>13} {'ratio':>6} {'same tokens':>12}")
    for name, r in results.items():
        rows = (args.prompts if name == "generate_chunk" else 4 * args.prompts) * args.group
        ratio = r["tokens_s"]["remote"] / r["tokens_s"]["local"]
        print(f"{name:<16} {rows:>5} {r['tokens']:>7} {r['median_s']['local']:>9.3f} {r['median_s']['remote']:>9.3f} "
              f"{r['tokens_s']['local']:>12.0f} {r['tokens_s']['remote']:>13.0f} {ratio:>6.3f} "
              f"{str(r['same_tokens']):>12}")
        if not r["same_tokens"]:
            print("  WARNING: the two sides drew different tokens for the same seed")
    fig = results["generate_chunk"]
    ratio = round(fig["tokens_s"]["remote"] / fig["tokens_s"]["local"], 3)
    print()
    print(f"target remote / local >= {TARGET}: {ratio}  {'met' if ratio >= TARGET else 'NOT met'}")
    print()
    print(json.dumps({"figure": "remote_vs_local_speed", "value": round(fig["tokens_s"]["remote"], 1),
                      "unit": "tokens/s", "baseline": "in_process_sample_tokens_s",
                      "baseline_value": round(fig["tokens_s"]["local"], 1), "ratio": ratio}))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=9, help="timed repetitions per side, median reported (default 9)")
    ap.add_argument("--prompts", type=int, default=4, help="prompts per request (default 4, as Generate sends)")
    ap.add_argument("--group", type=int, default=8, help="completions per prompt (default 8)")
    ap.add_argument("--new-tokens", type=int, default=48, help="most new tokens per completion (default 48)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads on each side (default: cores less one)")
    ap.add_argument("--seed", type=int, default=0)
    return smoke.parse_args(ap, argv, reps=1, prompts=1, group=2, new_tokens=8)


if __name__ == "__main__":
    main(parse_args())
