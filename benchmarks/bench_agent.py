"""The agent loop: multi-turn sampling against ``generate`` once per turn, and branching inside turn 2.

Run: ``python benchmarks/bench_agent.py`` (about a minute on a 2-core CPU).

On the sample agent world (``sample_data/agent_policy`` on ``calculator_agent`` prompts through
its chat template; the calculator runs in the tool sandbox, ``studio.workers.tools``, for both
sides), in this process, one torch thread:

``agent_sampling_speed``
    ``backends.agent.sample_agent`` (one KV cache across turns: a tool's answer appended with one
    forward, finished rows leave the batch) against the loop a user writes with transformers: per
    turn, ``model.generate(..., output_logits=True, return_dict_in_generate=True)`` on every
    unfinished trajectory's whole context (prompt, turns so far), stopping at the end token or
    the call's end, the statistics (log-prob, full-vocabulary entropy, top-k) computed from each
    step's logits; then the calls answered and their tokens appended. Same prompts, batch, seed,
    budgets (``--max-turns`` calls, ``--max-new-tokens`` tokens, tool tokens included), same
    environment. Completion tokens per second (policy and tool tokens), medians of ``--reps``
    interleaved repetitions. Target >= 1.5.

``agent_branch_vs_fresh``
    8 branches inside turn 2 (``backends.agent.branch_agent`` at the second assistant turn's
    middle token, the agent loop continued, tools run again) against 8 fresh trajectories of the
    same prompt (``sample_agent``, n = 8): seconds, medians; for every trajectory of the batch
    that reached a second assistant turn (up to ``--forks`` of them). Target < 1.0.

Options: --prompts (batch), --max-new-tokens, --max-turns, --reps, --forks, --policy, --seed,
--smoke (4 prompts, 64 tokens, one repetition, one fork: seconds).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: import the project's packages

from benchmarks import smoke  # noqa: E402
from sample_data import AGENT_POLICY_DIR  # noqa: E402

TOPK = 5
BRANCHES = 8


def generate_loop(model, tok, prompts: list[str], env, max_turns: int, max_new_tokens: int, seed: int) -> int:
    """The baseline: ``generate`` once per turn on each unfinished trajectory's whole context,
    statistics from each step's logits. Returns the completion tokens made (policy and tool)."""
    import torch

    call_ids = tok(env.call_end, add_special_tokens=False)["input_ids"]
    assert len(call_ids) == 1, "the baseline stops at a one-token call end"
    stops = {tok.eos_token_id, call_ids[0]}
    ctx = [tok(p)["input_ids"] for p in prompts]
    made = [0] * len(prompts)  # completion tokens per trajectory
    calls = [0] * len(prompts)
    active = list(range(len(prompts)))
    torch.manual_seed(seed)
    while active:
        width = max(len(ctx[i]) for i in active)
        ids = torch.tensor([[tok.pad_token_id] * (width - len(ctx[i])) + ctx[i] for i in active])  # [b, L]
        attn = torch.tensor([[0] * (width - len(ctx[i])) + [1] * len(ctx[i]) for i in active])
        budget = max(max_new_tokens - made[i] for i in active)
        out = model.generate(input_ids=ids, attention_mask=attn, do_sample=True, top_k=0, top_p=1.0, temperature=1.0,
                             max_new_tokens=budget, eos_token_id=sorted(stops), pad_token_id=tok.pad_token_id,
                             output_logits=True, return_dict_in_generate=True)
        new = out.sequences[:, width:]  # [b, T]
        stats = []
        with torch.no_grad():  # the statistics, step by step from the logits
            for t, logits in enumerate(out.logits):
                logp = torch.log_softmax(logits.float(), -1)  # [b, V]
                stats.append((logp.gather(-1, new[:, t, None]), -(logp.exp() * logp).sum(-1), logp.topk(TOPK, -1)))
        still = []
        for j, i in enumerate(active):
            row = new[j].tolist()
            end = next((t + 1 for t, x in enumerate(row) if x in stops), len(row))
            row = row[:min(end, max_new_tokens - made[i])]
            ctx[i] += row
            made[i] += len(row)
            if not row or row[-1] != call_ids[0] or made[i] >= max_new_tokens or calls[i] >= max_turns:
                continue  # the end token, the token budget, or a call past the turn budget
            reply = env.reply(i, tok.decode(ctx[i][len(tok(prompts[i])["input_ids"]):], skip_special_tokens=False))
            answer = tok(reply.text, add_special_tokens=False)["input_ids"][:max_new_tokens - made[i]]
            ctx[i] += answer
            made[i] += len(answer)
            calls[i] += 1
            if made[i] < max_new_tokens:
                still.append(i)
        active = still
    return sum(made)


def ours(model, tok, prompts, env, max_turns, max_new_tokens, seed) -> int:
    from backends.agent import sample_agent

    gens = sample_agent(model, tok, prompts, env, n=1, max_turns=max_turns, max_new_tokens=max_new_tokens, seed=seed,
                        top_k_stats=TOPK)
    return sum(g.n_tokens for g in gens)


def timed(fn, *args) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t0, out


def main(args) -> None:
    import torch
    from transformers.utils import logging as hf_logging

    from backends import load_policy
    from backends.agent import branch_agent, sample_agent
    from backends.chat import render
    from studio.tasks import get_task
    from studio.workers.agent_env import TaskEnv
    from studio.workers.tools import ToolSandbox

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)
    if not (args.policy / "config.json").is_file():
        raise SystemExit(f"no agent policy at {args.policy}: build it with `python -m sample_data.build_agent_policy`")
    policy = load_policy(args.policy, device="cpu")
    model, tok = policy.model, policy.tokenizer
    task = get_task("calculator_agent")
    prompts = [render(tok, task.policy_input(p)) for p in task.make_prompts(args.prompts, seed=args.seed)]
    with ToolSandbox() as sandbox:
        env = TaskEnv(task, sandbox)
        budgets = (args.max_turns, args.max_new_tokens)
        ours(model, tok, prompts[:2], env, *budgets, args.seed)  # warm-up: the sandbox's process, lazy imports
        generate_loop(model, tok, prompts[:2], env, *budgets, args.seed)
        print(f"agent_sampling_speed: {len(prompts)} prompts, {args.max_turns} calls / {args.max_new_tokens} tokens "
              f"at most, {args.reps} reps", flush=True)
        runs = {"ours": [], "generate": []}
        for rep in range(args.reps):
            order = [("ours", ours), ("generate", generate_loop)]
            for name, fn in order[rep % 2:] + order[:rep % 2]:
                s, n_tok = timed(fn, model, tok, prompts, env, *budgets, args.seed + rep)
                runs[name].append(n_tok / s)
                print(f"  {name:<9} {n_tok:>6} tokens {s:7.2f} s {n_tok / s:8.0f} tokens/s", flush=True)
        speed = {k: statistics.median(v) for k, v in runs.items()}

        gens = sample_agent(model, tok, prompts, env, max_turns=args.max_turns, max_new_tokens=args.max_new_tokens,
                            seed=args.seed)
        forks = []
        for g in gens:
            second = [t for t in g.turns if t.role == "assistant"][1:2]
            if second and second[0].end - second[0].start >= 2:
                forks.append((g, (second[0].start + second[0].end) // 2))
        forks = forks[:args.forks]
        if not forks:
            raise SystemExit("no trajectory reached a second assistant turn: raise --max-new-tokens or --prompts")
        print(f"agent_branch_vs_fresh: {len(forks)} trajectories forked inside turn 2, {BRANCHES} branches each",
              flush=True)
        times = {"branch": [], "fresh": []}
        for rep in range(args.reps):
            for g, fork in forks:
                kw = dict(n=BRANCHES, max_turns=args.max_turns, max_new_tokens=args.max_new_tokens, seed=rep,
                          top_k_stats=TOPK)
                s_b, _ = timed(lambda: branch_agent(model, tok, g.prompt, g.token_ids[:fork].tolist(),  # noqa: B023
                                                    g.mask[:fork].tolist(), g.turns, [None], env, **kw))  # noqa: B023
                s_f, _ = timed(lambda: sample_agent(model, tok, [g.prompt], env, **kw))  # noqa: B023
                times["branch"].append(s_b)
                times["fresh"].append(s_f)
                print(f"  fork at {fork:>3}/{g.n_tokens:<3} branches {s_b:6.3f} s  fresh {s_f:6.3f} s", flush=True)
        secs = {k: statistics.median(v) for k, v in times.items()}

    print()
    r_speed = round(speed["ours"] / speed["generate"], 3)
    r_branch = round(secs["branch"] / secs["fresh"], 3)
    print(f"target agent_sampling_speed >= 1.5: {r_speed}  {'met' if r_speed >= 1.5 else 'NOT met'}")
    print(f"target agent_branch_vs_fresh < 1.0: {r_branch}  {'met' if r_branch < 1.0 else 'NOT met'}")
    if args.smoke:
        print(f"  ({smoke.NOTE})")
    print(json.dumps({"figure": "agent_sampling_speed", "value": round(speed["ours"], 1), "unit": "tokens/s",
                      "baseline": "hf_generate_per_turn_tokens_s", "baseline_value": round(speed["generate"], 1),
                      "ratio": r_speed}))
    print(json.dumps({"figure": "agent_branch_vs_fresh", "value": round(secs["branch"], 4), "unit": "s",
                      "baseline": "fresh_trajectories_s", "baseline_value": round(secs["fresh"], 4),
                      "ratio": r_branch}))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=32, help="trajectories sampled together (one per prompt)")
    ap.add_argument("--max-new-tokens", type=int, default=256, help="token budget of a trajectory, tool tokens included")
    ap.add_argument("--max-turns", type=int, default=8, help="tool calls a trajectory may make")
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions of each side (medians compared)")
    ap.add_argument("--forks", type=int, default=4, help="trajectories forked inside turn 2")
    ap.add_argument("--policy", type=Path, default=AGENT_POLICY_DIR, help="the agent policy (sample_data/agent_policy)")
    ap.add_argument("--seed", type=int, default=0)
    return smoke.parse_args(ap, argv, prompts=4, max_new_tokens=64, reps=1, forks=1)


if __name__ == "__main__":
    main(parse_args())
