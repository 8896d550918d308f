"""Held-out evaluation of a policy, in the worker pool: :func:`evaluate_job`.

Accuracy (mean over k samples at temperature 1), pass@k, greedy accuracy, mean completion
length and mean token entropy; the owner submits it (``studio.runs.minirun.evaluation``) on
the held-out prompts (:func:`studio.runs.training.config.heldout_prompts`).
"""
from __future__ import annotations

import numpy as np


def evaluate_job(policy_path: str, prompts_json: list[dict], task_name: str, k: int = 4, max_new_tokens: int = 40,
                 seed: int = 0) -> dict:
    """Runs in a worker: accuracy (mean over k samples at temperature 1), pass@k, greedy
    accuracy, mean completion length and mean token entropy on the given prompts."""
    from backends import load_policy
    from studio.tasks import Prompt, get_task

    task = get_task(task_name)
    policy = load_policy(policy_path)
    prompts = [Prompt(p["text"], p["gold"]) for p in prompts_json]
    gens = policy.sample([p.text for p in prompts], n=k, temperature=1.0, max_new_tokens=max_new_tokens, seed=seed,
                         top_k_stats=1)
    greedy = policy.sample([p.text for p in prompts], n=1, temperature=0.0, max_new_tokens=max_new_tokens, seed=seed,
                           top_k_stats=1)
    ok = np.array([task.is_correct(prompts[g.prompt_index],
                                   task.parse_completion(prompts[g.prompt_index], g.text).answer)
                   for g in gens]).reshape(len(prompts), k)
    gok = [task.is_correct(prompts[g.prompt_index], task.parse_completion(prompts[g.prompt_index], g.text).answer)
           for g in greedy]
    ents = np.concatenate([g.entropies for g in gens if g.n_tokens]) if gens else np.zeros(1)
    return {"accuracy": float(ok.mean()), f"pass@{k}": float(ok.any(axis=1).mean()),
            "greedy_accuracy": float(np.mean(gok)),
            "mean_length": float(np.mean([g.n_tokens for g in gens])), "entropy": float(ents.mean()),
            "prompts": len(prompts), "samples": int(ok.size)}
