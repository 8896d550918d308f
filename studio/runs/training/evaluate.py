"""Held-out evaluation of a policy, in the worker pool: :func:`evaluate_job`.

Accuracy (mean over k samples at temperature 1), pass@k, greedy accuracy, mean completion
length and mean token entropy; on an agent task the samples are trajectories of the agent loop
(:mod:`studio.runs.training.rollouts`), and tool calls and failed calls per trajectory are
added. The owner submits it (``studio.runs.minirun.evaluation``) on the held-out prompts
(:func:`studio.runs.training.config.heldout_prompts`).
"""
from __future__ import annotations

import numpy as np

from studio.runs.training.rollouts import agent_metrics, environment, is_agent, sample_groups


def evaluate_job(policy_path: str, prompts_json: list[dict], task: str | dict, k: int = 4, max_new_tokens: int = 40,
                 seed: int = 0, max_turns: int = 6) -> dict:
    """Runs in a worker: accuracy (mean over k samples at temperature 1), pass@k, greedy
    accuracy, mean completion length and mean token entropy on the given prompts, judged by
    the task (its name or spec) and read through the policy's chat template. On an agent task
    (``max_turns`` tool calls at most), ``tool_calls`` and ``tool_errors`` per trajectory too."""
    from backends import load_policy
    from backends.chat import render_all
    from studio.tasks import Prompt, get_task

    the_task = get_task(task)
    policy = load_policy(policy_path)
    prompts = [Prompt.from_json(p) for p in prompts_json]
    inputs = render_all(policy.tokenizer, [the_task.policy_input(p) for p in prompts])
    with environment(the_task) as env:
        gens = sample_groups(policy, inputs, env, k, 1.0, max_new_tokens, max_turns, seed, top_k_stats=1)
        greedy = sample_groups(policy, inputs, env, 1, 0.0, max_new_tokens, max_turns, seed, top_k_stats=1)
    ok = np.array([bool(the_task.verdict(prompts[g.prompt_index], g.text)[1]) for g in gens]).reshape(len(prompts), k)
    gok = [bool(the_task.verdict(prompts[g.prompt_index], g.text)[1]) for g in greedy]
    ents = np.concatenate([g.entropies[g.mask] for g in gens]) if gens else np.zeros(1)  # the policy's own tokens
    out = {"accuracy": float(ok.mean()), f"pass@{k}": float(ok.any(axis=1).mean()),
           "greedy_accuracy": float(np.mean(gok)),
           "mean_length": float(np.mean([g.n_tokens for g in gens])), "entropy": float(ents.mean()),
           "prompts": len(prompts), "samples": int(ok.size)}
    if is_agent(the_task):
        out |= {name.removeprefix("agent/"): v for name, v in agent_metrics(gens).items()}
    return out
