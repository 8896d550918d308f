"""The training process of a mini-run: :func:`train_worker`, its step loop and checkpoints.

:func:`train_worker` runs in its own process (``multiprocessing`` spawn context, started by
:mod:`studio.runs.minirun`; CUDA when available, CPU otherwise): every step it samples groups
with the current policy (or takes the batch the overlapped sampler drew,
:mod:`studio.runs.training.sampler`), scores them with the reward
(:mod:`studio.runs.training.reward`), computes advantages with the chosen estimator
(:mod:`studio.signals.advantages`), takes μ optimiser steps on the clipped loss
(:func:`backends.trainer.policy_loss`) and puts one message per step on a queue: the step's
rollouts with their per-token statistics, rewards, the advantages actually used and the
metrics. The owner writes each step in one transaction.

Each generation carries both log-probs of its tokens: the sampler's (the behaviour log-probs, in
the run's ``sampler_precision``, with the sampler's engine) and the trainer's, kept from the
first forward pass of the step (the weights the step started from, float32); the step's
``mismatch/*`` and ``is/*`` metrics and the correction's importance weights come from them
(:mod:`studio.runs.training.correction`). Checkpoints (weights, tokenizer,
optimiser and the step; :func:`save_checkpoint`) are saved every ``checkpoint_every`` steps
and at the end; a run resumes from its last one.

Nothing here opens the store. Torch is imported inside the functions.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

from studio.runs.training.config import MiniRunConfig
from studio.runs.training.correction import correction_fn, step_metrics
from studio.runs.training.reward import RewardFn
from studio.runs.training.rollouts import agent_metrics, environment, is_agent, step_groups
from studio.runs.training.sampler import OverlappedSampler, copy_weights, engine_label, in_precision
from studio.signals import advantages as adv_mod
from studio.workers.processes import exit_with_parent


def prompt_order(n_prompts: int, cfg: MiniRunConfig) -> np.ndarray:
    """Which prompt each draw of the run takes (step k takes draws (k-1)·p .. k·p-1, p prompts per
    step): the pool a pass at a time, each pass a seeded permutation, so no prompt comes back
    before every other was drawn, and a pool smaller than steps × prompts per step brings each
    prompt back at several steps (what the Timeline tab follows)."""
    rng = np.random.default_rng(cfg.seed)
    passes = (cfg.steps * cfg.prompts_per_step) // max(1, n_prompts) + 2
    return np.concatenate([rng.permutation(n_prompts) for _ in range(passes)])


def _picked(prompts: list, order: np.ndarray, step: int, per_step: int) -> list:
    lo = (step - 1) * per_step
    return [prompts[int(i)] for i in order[lo:lo + per_step]]


def _advantages(key: str, rewards: np.ndarray, groups: np.ndarray) -> np.ndarray:
    r = np.nan_to_num(rewards, nan=0.0)  # a completion the rule failed on counts as reward 0
    if key == "reinforce_pp":
        return adv_mod.reinforce_pp(r, groups, np.zeros(len(r), dtype=int))
    return {"grpo": adv_mod.grpo, "dr_grpo": adv_mod.dr_grpo, "rloo": adv_mod.rloo}[key](r, groups)


def train_worker(cfg_dict: dict, policy_path: str, reward_spec: dict, prompts_json: list[dict], task_name: str,
                 ckpt_dir: str, start_step: int, resume_from: str | None, queue, stop, parent_pid: int) -> None:
    """The mini-run process: train ``cfg.steps`` steps from ``start_step`` and report each.

    Messages on ``queue`` (dicts with ``type``): ``started`` (device, parameters), ``step``
    (a :class:`backends.trainer.StepOutput` and its seconds), ``checkpoint`` (step, path),
    ``done`` (``stopped`` or ``finished``), ``error`` (message). ``stop`` (an Event) ends
    the run after the step in flight, with a checkpoint.
    """
    exit_with_parent(parent=parent_pid)
    try:
        _train(cfg_dict, policy_path, reward_spec, prompts_json, task_name, ckpt_dir, start_step, resume_from,
               queue, stop)
    except BaseException as exc:  # everything the owner should be told, with its type
        import traceback
        queue.put({"type": "error", "message": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc()[-2000:]})
    finally:
        from studio.rewards import sandbox
        sandbox.kill_pools()  # a user rule's pool: its idle workers would hold this process at exit


def _train(cfg_dict, policy_path, reward_spec, prompts_json, task_name, ckpt_dir, start_step, resume_from, queue, stop):
    import copy

    import torch

    from backends import load_policy
    from backends.chat import render_all
    from studio.tasks import Prompt, get_task

    cfg = MiniRunConfig.from_dict(cfg_dict)
    from backends.device import cpu_threads, pick_device
    if pick_device() == "cpu":
        torch.set_num_threads(cpu_threads())  # one core stays with the owner writing each step
    task = get_task(task_name)
    prompts = [Prompt.from_json(p) for p in prompts_json]
    torch.manual_seed(cfg.seed)
    policy = load_policy(resume_from or policy_path)
    model, tok = policy.model, policy.tokenizer
    # what the policy reads for each prompt: its chat rendered with the policy's template (backends.chat)
    inputs = dict(zip((p.text for p in prompts), render_all(tok, [task.policy_input(p) for p in prompts]), strict=True))
    device = policy.device
    ref = copy.deepcopy(load_policy(policy_path).model).eval() if cfg.kl_beta > 0 else None
    if ref is not None:
        for p in ref.parameters():
            p.requires_grad_(False)
    if cfg.lora:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=cfg.lora_r, lora_alpha=2 * cfg.lora_r, target_modules="all-linear",
                                                 lora_dropout=0.0))
        policy.model = model
    model.eval()  # no dropout: π_old and π agree exactly before the first update (TRL's disable_dropout)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=0.0)
    if resume_from and (Path(resume_from) / "optimizer.pt").is_file():
        opt.load_state_dict(torch.load(Path(resume_from) / "optimizer.pt", map_location=device))
    reward_fn = RewardFn(reward_spec, task)
    queue.put({"type": "started", "device": device, "parameters": sum(p.numel() for p in params)})
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    order = prompt_order(len(prompts), cfg)
    last_ckpt = start_step - 1
    step = start_step
    overlap = cfg.overlap and not cfg.lora and device == "cpu" and (os.cpu_count() or 1) >= 2
    sampler, sampling = None, None
    if not overlap:  # this process samples, in the sampler's precision (a copy of the model when it is not float32)
        sampling = in_precision(policy, cfg.sampler_precision)
    else:
        torch.set_num_threads(max(1, cpu_threads() // 2))  # the threads left to models, split with the sampler
        sampler = OverlappedSampler(model, resume_from or policy_path, cfg, [{"text": inputs[p.text]} for p in prompts],
                                   order, start_step, task.spec)
    try:
        with environment(task if sampler is None else None) as env:  # the agent loop's tools (the sampler has its own)
            step, last_ckpt = _steps(cfg, start_step, prompts, inputs, order, sampling, model, tok, ref, params, opt,
                                     reward_fn, task, env, pad, device, sampler, queue, stop, ckpt_dir, last_ckpt)
    finally:
        if sampler is not None:
            sampler.close()  # before the run is reported ended: nothing of it runs on after
    if step is None:  # stopped
        queue.put({"type": "done", "status": "stopped", "step": last_ckpt})
        return
    if last_ckpt != step:
        queue.put({"type": "checkpoint", "step": step, "path": save_checkpoint(model, tok, opt, ckpt_dir, step, cfg)})
    queue.put({"type": "done", "status": "done", "step": step})


def _steps(cfg, start_step, prompts, inputs, order, sampling, model, tok, ref, params, opt, reward_fn, task, env, pad,
           device, sampler, queue, stop, ckpt_dir, last_ckpt):
    """The training loop; returns (last step, last checkpoint), or (None, …) when stopped. ``inputs``: the
    text the policy reads for each prompt text; ``sampling``: the policy this process samples with (None: the
    overlapped ``sampler`` does; a lower-precision copy of ``model`` is brought up to date each step);
    ``env``: an agent task's environment when this process samples
    (:func:`~studio.runs.training.rollouts.environment`)."""
    import torch

    from backends.trainer import (
        StepOutput,
        backward,
        completion_logps,
        entropy_threshold,
        grad_norm,
        length_buckets,
        micro_batches,
    )

    correction = correction_fn(cfg)
    train_engine = f"trainer {engine_label(model)}"
    step = start_step
    for step in range(start_step, cfg.steps + 1):
        t0 = time.perf_counter()
        picked = _picked(prompts, order, step, cfg.prompts_per_step)
        if sampler is None:
            if sampling.model is not model:
                copy_weights(sampling.model, model.state_dict())
            gens = step_groups(sampling, [inputs[p.text] for p in picked], cfg, cfg.seed * 100_003 + step, env)
            engine = engine_label(sampling.model)
            for g in gens:
                g.engine = engine
            p_ids = [tok(inputs[picked[g.prompt_index].text])["input_ids"] for g in gens]
            t_sample, lag = time.perf_counter() - t0, 0
        else:  # sampled while the last step trained (sample_s: the sampler's own time, overlapped)
            gens, p_ids, t_sample, lag = sampler.next_batch(step)
        rewards, step_rewards, reward_errors = reward_fn([picked[g.prompt_index] for g in gens], [g.text for g in gens])
        total = np.array([np.nan if r.get("total") is None else r["total"] for r in rewards], dtype=np.float64)
        groups = np.array([g.prompt_index for g in gens])
        adv = _advantages(cfg.estimator, total, groups)
        thr = entropy_threshold([g.entropies for g in gens], cfg.entropy_q)
        lmasks = [g.mask for g in gens]  # an agent trajectory's tool tokens: False (never trained)
        emasks = [np.ones(g.n_tokens, np.float32) if thr is None
                  else (np.where(g.mask, g.entropies, -np.inf) >= thr).astype(np.float32) for g in gens]
        c_ids = [g.token_ids.tolist() for g in gens]
        C = max(1, max(len(c) for c in c_ids))
        em = torch.zeros(len(gens), C, device=device)
        for b, m in enumerate(emasks):
            em[b, :len(m)] = torch.from_numpy(m)
        a = torch.tensor(adv, dtype=torch.float32, device=device)
        # on a CPU, micro-batches of similar lengths (padding costs compute there); one batch on a GPU
        buckets = (length_buckets([len(p) + len(c) for p, c in zip(p_ids, c_ids, strict=False)]) if device == "cpu"
                   else [np.arange(len(gens))])
        batches = micro_batches(p_ids, c_ids, a, buckets, cfg.loss_type, em if thr is not None else None, lmasks)
        with torch.no_grad():
            for mb, idx in zip(batches, buckets, strict=False):
                mb.behaviour_logps = torch.zeros(len(idx), max(1, max(map(len, mb.completion_ids))), device=device)
                for r, i in enumerate(idx):  # the sampler's log-probs (NaN on tool tokens: never read)
                    mb.behaviour_logps[r, :gens[i].n_tokens] = torch.from_numpy(gens[i].logprobs)
                if lag and correction is None:  # π_old is the policy that sampled (the clipped ratio corrects the lag)
                    mb.old_logps = mb.behaviour_logps
                elif cfg.iterations > 1:  # π_old is this policy before the updates (decoupled: the proximal policy)
                    mb.old_logps = completion_logps(model, mb.prompt_ids, mb.completion_ids, pad)[0]
                # else: one update on-policy, π_old is the forward pass itself, detached (as TRL)
                # (a tool token's recorded log-prob is NaN: the loss never reads it, see policy_loss)
                if ref is not None:
                    mb.ref_logps = completion_logps(ref, mb.prompt_ids, mb.completion_ids, pad)[0]
        stats_all, gnorm = [], 0.0
        for _ in range(cfg.iterations):
            opt.zero_grad(set_to_none=True)
            loss, stats = backward(model, batches, pad, correction=correction, eps_low=cfg.clip_eps, beta=cfg.kl_beta,
                                   loss_type=cfg.loss_type, max_completion_length=cfg.max_new_tokens)
            gnorm = grad_norm(model)
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            stats_all.append(stats | {"loss": loss})
        if sampler is not None:
            sampler.publish(model, step)
        for mb, idx in zip(batches, buckets, strict=False):  # the trainer's log-probs at the step's start weights
            for r, i in enumerate(idx):
                gens[i].train_logprobs = mb.train_logps[r, :gens[i].n_tokens].cpu().numpy()
        own = np.concatenate([g.entropies[g.mask] for g in gens])  # the policy's tokens (tool tokens: NaN)
        equal = adv_mod.all_equal_groups(np.nan_to_num(total), groups)
        comps = sorted({k for r in rewards for k in r})
        metrics = {
            "reward_mean": float(np.nanmean(total)) if np.isfinite(total).any() else float("nan"),
            "reward_std": float(np.nanstd(total)) if np.isfinite(total).any() else float("nan"),
            "entropy": float(own.mean()) if own.size else 0.0,  # the sampler's
            "kl": stats_all[-1]["kl"], "clip_frac": float(np.mean([s["clip_frac"] for s in stats_all])),
            "loss": float(np.mean([s["loss"] for s in stats_all])), "grad_norm": gnorm,
            "completion_len": float(np.mean([g.n_tokens for g in gens])),
            "all_equal_share": len(equal) / max(1, len(set(groups.tolist()))),
            "entropy_threshold": float("nan") if thr is None else thr,
            "sample_s": t_sample, "staleness": float(lag), "step_s": time.perf_counter() - t0,
        } | step_metrics([g.train_logprobs for g in gens], [g.logprobs for g in gens], lmasks, cfg)
        for c in comps:
            if c != "total":
                vals = np.array([np.nan if r.get(c) is None else r[c] for r in rewards], dtype=np.float64)
                metrics[f"reward/{c}"] = float(np.nanmean(vals)) if np.isfinite(vals).any() else float("nan")
                metrics[f"reward_std/{c}"] = float(np.nanstd(vals)) if np.isfinite(vals).any() else float("nan")
        # correctness is the task's verdict, whatever the reward reads (a reward model, a rule without accuracy)
        metrics["accuracy"] = float(np.mean([bool(task.verdict(picked[g.prompt_index], g.text)[1]) for g in gens]))
        if is_agent(task):
            metrics |= agent_metrics(gens)
        out = StepOutput(step=step, generations=gens, prompt_index=[g.prompt_index for g in gens],
                         prompts=[p.text for p in picked], rewards=rewards, advantages=adv.tolist(),
                         token_weights=[float(x) * m * lm for x, m, lm in zip(adv, emasks, lmasks, strict=True)],
                         metrics=metrics, reward_errors=reward_errors, train_engine=train_engine)
        queue.put({"type": "step", "output": out, "step_rewards": step_rewards,
                   "prompts_gold": [p.gold for p in picked]})
        stopping = stop.is_set()
        if step % cfg.checkpoint_every == 0 or step == cfg.steps or stopping:
            queue.put({"type": "checkpoint", "step": step,
                       "path": save_checkpoint(model, tok, opt, ckpt_dir, step, cfg)})
            last_ckpt = step
        if stopping:
            return None, last_ckpt
    return step, last_ckpt


def save_checkpoint(model, tok, opt, ckpt_dir: str, step: int, cfg: MiniRunConfig) -> str:
    """``<ckpt_dir>/step-<k>``: a full policy folder (LoRA merged into a copy), the
    optimiser state and the step, written to a temporary folder and renamed, so a kill
    mid-save never leaves a half checkpoint."""
    import shutil

    import torch

    final = Path(ckpt_dir) / f"step-{step:05d}"
    tmp = Path(ckpt_dir) / f".step-{step:05d}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    to_save = model
    if cfg.lora:
        import copy
        to_save = copy.deepcopy(model).merge_and_unload()
    to_save.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    if not cfg.lora:  # LoRA runs resume from the merged weights with a fresh adapter and optimiser
        torch.save(opt.state_dict(), tmp / "optimizer.pt")
    (tmp / "trainer_state.json").write_text(json.dumps({"step": step, "config": cfg.to_dict()}, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return str(final)
