"""Held-out evaluation of a policy, in the worker pool: :func:`evaluate_job`.

Accuracy (mean over k samples at temperature 1), pass@k, greedy accuracy, mean completion
length and mean token entropy; the owner submits it (``studio.runs.minirun.evaluation``) on
the held-out prompts (:func:`studio.runs.training.config.heldout_prompts`).
"""
from __future__ import annotations

import numpy as np


def evaluate_job(policy_path: str, prompts_json: list[dict], task: str | dict, k: int = 4, max_new_tokens: int = 40,
                 seed: int = 0) -> dict:
    """Runs in a worker: accuracy (mean over k samples at temperature 1), pass@k, greedy
    accuracy, mean completion length and mean token entropy on the given prompts, judged by
    the task (its name or spec) and read through the policy's chat template."""
    from backends import load_policy
    from backends.chat import render_all
    from studio.tasks import Prompt, get_task

    the_task = get_task(task)
    policy = load_policy(policy_path)
    prompts = [Prompt.from_json(p) for p in prompts_json]
    inputs = render_all(policy.tokenizer, [the_task.policy_input(p) for p in prompts])
    gens = policy.sample(inputs, n=k, temperature=1.0, max_new_tokens=max_new_tokens, seed=seed, top_k_stats=1)
    greedy = policy.sample(inputs, n=1, temperature=0.0, max_new_tokens=max_new_tokens, seed=seed, top_k_stats=1)
    ok = np.array([bool(the_task.verdict(prompts[g.prompt_index], g.text)[1]) for g in gens]).reshape(len(prompts), k)
    gok = [bool(the_task.verdict(prompts[g.prompt_index], g.text)[1]) for g in greedy]
    ents = np.concatenate([g.entropies for g in gens if g.n_tokens]) if gens else np.zeros(1)
    return {"accuracy": float(ok.mean()), f"pass@{k}": float(ok.any(axis=1).mean()),
            "greedy_accuracy": float(np.mean(gok)),
            "mean_length": float(np.mean([g.n_tokens for g in gens])), "entropy": float(ents.mean()),
            "prompts": len(prompts), "samples": int(ok.size)}
