"""The device check of the agent loop's CUDA path: trajectories, branching, scoring, training, HTTP.

Run on a GPU machine (``bash benchmarks/device_run.sh --agent``, which runs this file after
``bench_cuda.py``), or here with ``--smoke`` (CPU, tiny sizes: the same code paths). For each
policy in fp32 and bf16, on the device ``backends.device.pick_device`` chooses:

- the sample agent policy (``sample_data/agent_policy``) on ``calculator_agent`` prompts, the
  calculator answered in the tool sandbox (``studio.workers.tools``, a separate process);
- a random Qwen2 of Qwen2-0.5B's shapes (``bench_cuda.build_qwen``), whose "call" is the token it
  samples most often (a random model writes no tool calls): the loop's mechanics at real width.

Checks: ``sample_agent`` makes trajectories whose tool tokens are masked with no statistics and
whose policy tokens' statistics equal teacher forcing (``score_batch`` over the same ids, within
``bench_cuda.TOL``); ``branch_agent`` inside turn 2 keeps the prefix and runs the tool again;
a training step (``backends.trainer``: micro-batches with the loss masks, backward, AdamW) is
finite; ``RemotePolicy.sample_agent`` through a ``backends.server`` process on the device gives
the local loop's turns. Figures: ``cuda_agent_tokens_per_s_<dtype>_<model>`` against the
``generate``-once-per-turn loop of ``bench_agent.py`` (same prompts, batch, seed, environment).
Writes ``--out``/cuda_agent.jsonl and cuda_agent_checks.json.
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: import the project's packages

from benchmarks import smoke  # noqa: E402
from benchmarks.bench_agent import generate_loop  # noqa: E402
from benchmarks.bench_cuda import (  # noqa: E402
    DTYPES,
    TOL,
    InProcessServer,
    Report,
    _max_abs,
    _sync,
    build_qwen,
    dtype_variant,
)

AGENT_POLICY = REPO / "sample_data" / "agent_policy"
TOPK = 5


class FrequentTokenEnv:
    """The environment of a random model: its most sampled token closes a "call", which is
    answered with a fixed text (masked tokens appended, as a tool's answer)."""

    def __init__(self, call_end: str, answer: str):
        self.call_end, self.answer = call_end, answer

    def reply(self, prompt_index: int, call: str):
        from backends.types import ToolReply

        return ToolReply(self.answer, tool_name="echo", tool_args="{}")


def mask_problems(gens) -> list[str]:
    """What breaks the trajectory contract: masked tokens with statistics, turns off the mask."""
    import numpy as np

    bad = []
    for i, g in enumerate(gens):
        m = g.mask
        if np.isfinite(g.logprobs[~m]).any() or not np.isfinite(g.logprobs[m]).all():
            bad.append(f"trajectory {i}: statistics on masked tokens or missing on policy tokens")
        for t in g.turns or []:
            if t.start is not None and bool(m[t.start:t.end].all()) != (t.role == "assistant") and t.end > t.start:
                bad.append(f"trajectory {i}: turn {t.role} {t.start}..{t.end} against the mask")
    return bad


def check_sample(rep: Report, case: str, policy, prompts, env, budgets, seed: int, tol: float):
    import numpy as np

    gens = policy.sample_agent(prompts, env, n=2, max_turns=budgets[0], max_new_tokens=budgets[1], seed=seed,
                               top_k_stats=TOPK)
    n_calls = sum(sum(t.role == "tool" for t in g.turns or []) for g in gens)
    bad = mask_problems(gens)
    rep.check(f"{case}: sample_agent trajectories (masks, turns)", not bad and len(gens) == 2 * len(prompts),
              f"{len(gens)} trajectories, {n_calls} tool turns, {sum(g.n_tokens for g in gens)} tokens"
              + (f"; {bad[:3]}" if bad else ""))
    scored = policy.score([g.prompt for g in gens], [g.token_ids.tolist() for g in gens], top_k_stats=TOPK)
    pairs_lp = [(g.logprobs[g.mask], s.logprobs[g.mask]) for g, s in zip(gens, scored, strict=True)]
    pairs_h = [(g.entropies[g.mask], s.entropies[g.mask]) for g, s in zip(gens, scored, strict=True)]
    d_lp, d_h = _max_abs(pairs_lp), _max_abs(pairs_h)
    rep.check(f"{case}: policy tokens' statistics = teacher-forced score", max(d_lp, d_h) <= tol,
              f"max |dlogprob| {d_lp:.2e}, max |dentropy| {d_h:.2e} (tolerance {tol}) over "
              f"{int(sum(np.count_nonzero(g.mask) for g in gens))} policy tokens")
    return gens, n_calls


def check_branch(rep: Report, case: str, policy, gens, env, budgets, seed: int):
    """8 branches in the middle of the second assistant turn of the first trajectory that has one
    (a policy that writes calls must call the tool again after the fork; a random model need not)."""
    for g in gens:
        turns = [t for t in g.turns or [] if t.role == "assistant" and t.end - t.start >= 2]
        if len(turns) >= 2:
            break
    else:
        rep.skip(f"{case}: branch: no trajectory reached a second assistant turn")
        return
    t2 = turns[1]
    fork = (t2.start + t2.end) // 2
    kids = policy.branch_agent(g.prompt, g.token_ids[:fork].tolist(), g.mask[:fork].tolist(), g.turns, [None], env,
                               n=8, max_turns=budgets[0] + 2, max_new_tokens=max(budgets[1], fork + 96), seed=seed,
                               top_k_stats=TOPK)  # room after the fork for another call
    kept = all(k.token_ids[:fork].tolist() == g.token_ids[:fork].tolist() for k in kids)
    reran = sum(any(t.role == "tool" and t.start is not None and t.start > fork for t in k.turns or []) for k in kids)
    bad = mask_problems(kids)
    writes_calls = not isinstance(env, FrequentTokenEnv)
    rep.check(f"{case}: branch_agent inside turn 2 (prefix kept, tools run again)",
              kept and not bad and (reran >= 1 or not writes_calls),
              f"fork at token {fork} of {g.n_tokens}; {reran}/8 branches called the tool after the fork"
              + (f"; {bad[:2]}" if bad else ""))


def check_speed(rep: Report, case: str, dt: str, label: str, policy, prompts, env, budgets, reps: int, seed: int,
                device: str):
    if len(policy.tokenizer(env.call_end, add_special_tokens=False)["input_ids"]) != 1:
        rep.skip(f"{case}: speed: the generate baseline stops at a one-token call end, and this model has none")
        return
    runs = collections.defaultdict(list)
    model, tok = policy.model, policy.tokenizer

    def ours(s):
        gens = policy.sample_agent(prompts, env, n=1, max_turns=budgets[0], max_new_tokens=budgets[1], seed=s,
                                   top_k_stats=TOPK)
        return sum(g.n_tokens for g in gens)

    def theirs(s):
        return generate_loop(model, tok, prompts, env, budgets[0], budgets[1], s)

    ours(seed), theirs(seed)  # warm-up: kernels, the sandbox
    for r in range(reps):
        for name, fn in ([("studio", ours), ("generate", theirs)] if r % 2 == 0 else
                         [("generate", theirs), ("studio", ours)]):
            _sync(device)
            t0 = time.perf_counter()
            n_tok = fn(seed + r)
            _sync(device)
            runs[name].append(n_tok / (time.perf_counter() - t0))
    speed = {k: statistics.median(v) for k, v in runs.items()}
    rep.check(f"{case}: agent loop vs generate once per turn", speed["studio"] > 0,
              f"{speed['studio']:.0f} vs {speed['generate']:.0f} tokens/s ({len(prompts)} trajectories, "
              f"{budgets[0]} calls / {budgets[1]} tokens at most, {reps} reps)")
    rep.figure(f"cuda_agent_tokens_per_s_{dt}_{label}", round(speed["studio"], 1), "tokens/s",
               "transformers generate once per turn", round(speed["generate"], 1))


def check_train(rep: Report, case: str, policy, gens, device: str):
    import numpy as np
    import torch

    from backends.trainer import backward, grad_norm, micro_batches

    model, tok = policy.model, policy.tokenizer
    p_ids = [tok(g.prompt)["input_ids"] for g in gens]
    c_ids = [g.token_ids.tolist() for g in gens]
    adv = torch.linspace(-1.0, 1.0, len(gens), device=next(model.parameters()).device)
    batches = micro_batches(p_ids, c_ids, adv, [np.arange(len(gens))], "grpo", loss_masks=[g.mask for g in gens])
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-6)
    model.train()
    try:
        opt.zero_grad(set_to_none=True)
        loss, _ = backward(model, batches, pad, loss_type="grpo")
        norm = grad_norm(model)
        opt.step()
        _sync(device)
    finally:
        model.eval()
        opt.zero_grad(set_to_none=True)
    ok = np.isfinite(loss) and np.isfinite(norm) and norm > 0
    rep.check(f"{case}: training step on trajectories (loss masks, backward, AdamW)", ok,
              f"{len(gens)} trajectories, {sum(int(g.mask.sum()) for g in gens)} trained of "
              f"{sum(g.n_tokens for g in gens)} tokens; loss {loss:.4f}, grad norm {norm:.4f}")


def check_remote(rep: Report, case: str, folder: Path, policy, prompts, env, budgets, seed: int):
    from backends.remote import RemotePolicy

    srv = InProcessServer(folder)
    try:
        remote = RemotePolicy(srv.url)
        local = policy.sample_agent(prompts, env, n=1, max_turns=budgets[0], max_new_tokens=budgets[1], seed=seed,
                                    top_k_stats=TOPK)
        far = remote.sample_agent(prompts, env, n=1, max_turns=budgets[0], max_new_tokens=budgets[1], seed=seed,
                                  top_k_stats=TOPK)
    finally:
        srv.close()
    shape = [[t.role for t in g.turns or []] for g in far]
    bad = mask_problems(far)
    same = sum(a.token_ids.tolist() == b.token_ids.tolist() for a, b in zip(local, far, strict=True))
    rep.check(f"{case}: RemotePolicy.sample_agent through a backend on the device", not bad and len(far) == len(local),
              f"{len(far)} trajectories, turns {shape[:2]}; {same}/{len(far)} token-identical to the local loop"
              + (f"; {bad[:2]}" if bad else ""))


def run_case(rep: Report, args, label: str, folder: Path, dt: str, device: str, env, prompts) -> None:
    import torch

    from backends.policy import load_policy

    case = f"{label} {dt}"
    print(f"\n== {case} on {device}", flush=True)
    policy = load_policy(str(folder))
    want = getattr(torch, DTYPES[dt])
    if device == "cpu" and want != torch.float32:
        policy.model.to(want)
    p = next(policy.model.parameters())
    rep.check(f"{case}: load_policy", p.dtype == want and p.device.type == device.split(":")[0], f"{p.dtype} on {p.device}")
    budgets = (args.max_turns, args.max_new_tokens)
    k = max(1, min(4, len(prompts)))
    out = rep.section(f"{case}: sample_agent + score", check_sample, rep, case, policy, prompts[:k], env, budgets,
                      args.seed, TOL[dt])
    if out is not None:
        gens, _ = out
        rep.section(f"{case}: branch_agent", check_branch, rep, case, policy, gens, env, budgets, args.seed)
        rep.section(f"{case}: training step", check_train, rep, case, policy, gens, device)
    rep.section(f"{case}: speed", check_speed, rep, case, dt, label, policy, prompts, env, budgets, args.reps,
                args.seed, device)
    if dt == "fp32" or device == "cpu":
        rep.section(f"{case}: HTTP backend", check_remote, rep, case, folder, policy, prompts[:k], env, budgets,
                    args.seed)
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def random_env(folder: Path, prompts: list[str], new_tokens: int, seed: int) -> FrequentTokenEnv:
    """The random model's environment: the token it samples most often on ``prompts`` (decoding to
    itself) closes a call."""
    from backends.policy import load_policy

    policy = load_policy(str(folder))
    gens = policy.sample(prompts, n=2, max_new_tokens=new_tokens, seed=seed)
    counts = collections.Counter(i for g in gens for i in g.token_ids.tolist())
    tok = policy.tokenizer
    for tid, _ in counts.most_common():
        text = tok.decode([tid])
        if text and tok(text, add_special_tokens=False)["input_ids"] == [tid]:
            return FrequentTokenEnv(text, " [echo: 42] ")
    # a 150k vocabulary sampled at random: no drawn token encodes back to itself, so no call ever
    # closes; the loop's other mechanics (statistics, budgets, training, HTTP) still run at real width
    return FrequentTokenEnv("\x00no call\x00", " [echo: 42] ")


def main(args) -> int:
    import torch
    import transformers
    from transformers.utils import logging as hf_logging

    from backends.chat import render
    from backends.device import pick_device
    from backends.policy import load_policy
    from studio.tasks import get_task
    from studio.workers.agent_env import TaskEnv
    from studio.workers.tools import ToolSandbox

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    rep = Report(args.budget_s)
    device = pick_device()
    if device == "cpu":
        torch.set_num_threads(1)
    gpu = torch.cuda.get_device_name(0) if device.startswith("cuda") else "none"
    print(f"device {device} (GPU {gpu}); torch {torch.__version__}, transformers {transformers.__version__}", flush=True)
    task = get_task("calculator_agent")
    tok = load_policy(str(AGENT_POLICY), device="cpu").tokenizer
    agent_prompts = [render(tok, task.policy_input(p)) for p in task.make_prompts(args.batch, seed=args.seed)]
    dts = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    with tempfile.TemporaryDirectory(prefix="bench-cuda-agent-") as tmp, ToolSandbox() as sandbox:
        tmp = Path(tmp)
        for dt in dts:
            folder = dtype_variant(AGENT_POLICY, DTYPES[dt], tmp / f"agent-{dt}")
            try:
                run_case(rep, args, "agent_policy", folder, dt, device, TaskEnv(task, sandbox), agent_prompts)
            except Exception as exc:
                rep.check(f"agent_policy {dt}: case ran", False, f"{type(exc).__name__}: {exc}")
                traceback.print_exc()
        if "qwen" in args.models and rep.left() > 60:
            src = tmp / "qwen2-random"
            build_qwen(src, args.qwen_size, device, args.seed)
            words = ["Count the apples:", "A long story begins", "Numbers:", "Once"] * max(1, args.batch // 4)
            env = random_env(src, words[:4], args.max_new_tokens, args.seed)
            print(f"  random Qwen2: a call ends at {env.call_end!r}", flush=True)
            for dt in dts:
                if rep.left() < 45:
                    rep.skip(f"qwen2 {dt}: {rep.left():.0f} s of the budget left")
                    continue
                folder = dtype_variant(src, DTYPES[dt], tmp / f"qwen-{dt}")
                try:
                    run_case(rep, args, "qwen2_0p5b", folder, dt, device, env, words[:args.batch])
                except Exception as exc:
                    rep.check(f"qwen2 {dt}: case ran", False, f"{type(exc).__name__}: {exc}")
                    traceback.print_exc()
    return rep.finish(args.out, "cuda_agent", {"device": device, "gpu": gpu, "smoke": bool(args.smoke)},
                      smoke.NOTE if args.smoke else None)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="fp32,bf16", help="comma-separated, of fp32, bf16")
    ap.add_argument("--models", default="agent,qwen", help="agent (the sample agent policy) and/or qwen")
    ap.add_argument("--batch", type=int, default=32, help="trajectories in the timed batch (default 32)")
    ap.add_argument("--max-new-tokens", type=int, default=160, help="tokens per trajectory, tool tokens included")
    ap.add_argument("--max-turns", type=int, default=6, help="tool calls per trajectory")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--qwen-size", default="0.5b", help="shapes of the random Qwen2 (bench_cuda.QWEN_SIZES)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget-s", type=float, default=240.0, help="stop starting work after this many seconds")
    ap.add_argument("--out", type=Path, default=None, help="also write DIR/cuda_agent.jsonl and DIR/cuda_agent_checks.json")
    return smoke.parse_args(ap, argv, batch=4, max_new_tokens=48, max_turns=3, reps=1, qwen_size="tiny")


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main(parse_args()))
