"""Mini-runs, the worker side: the configuration and the training loop.

:class:`MiniRunConfig` is the one dataclass the studio's form and the CLI are generated
from. :func:`train_worker` runs in its own process (``multiprocessing`` spawn context;
CUDA when available, CPU otherwise): every step it samples groups with the current
policy, scores them with the reward, computes advantages with the chosen estimator
(:mod:`studio.signals.advantages`), takes μ optimiser steps on the clipped loss
(:func:`backends.trainer.policy_loss`) and puts one message per step on a queue: the
step's rollouts with their per-token statistics, rewards, the advantages actually used
and the metrics. The owner (:mod:`studio.runs.minirun`) writes each step in one transaction.
Checkpoints (weights, tokenizer, optimiser and the step) are saved every
``checkpoint_every`` steps and at the end; a run resumes from its last one.

Nothing here opens the store: user reward code runs in the sandbox's pool (with its
limits), the built-in rule in-process. Torch is imported inside the functions, so the
server can import this module for the config.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from studio.errors import StudioError
from studio.signals import advantages as adv_mod

TRAIN_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_pp")
PROMPT_SETS = ("easy", "medium", "hard", "mixed")  # or "run:<run_id>": the prompts of a stored run
HELDOUT_SEED = 10_000  # the sample policy's held-out prompts (sample_data.build_policy)
TRAIN_SEED = 20_000


class TrainConfigError(StudioError, ValueError):
    """Mini-run settings out of range; the message names each one."""


def _f(default, help: str, lo=None, hi=None, choices=None):
    return field(default=default, metadata={"help": help, "bounds": (lo, hi), "choices": choices})


@dataclass
class MiniRunConfig:
    """Everything a mini-run needs; the studio's form and ``python -m studio.minirun`` are
    generated from these fields (help, bounds and choices in their metadata)."""

    policy: str = _f("sample", "policy folder to start from ('sample': the bundled sample policy)")
    prompt_set: str = _f("medium", "training prompts: easy, medium, hard, mixed (fresh seeded draws of the task) "
                                   "or run:<run_id> (the prompts of a stored run)")
    n_prompts: int = _f(4096, "size of the training prompt pool (for the task's prompt sets); a small pool is "
                              "memorised rather than learned", 1, 100_000)
    rule_version: str = _f("", "reward: a stored rule version id ('' = the task's built-in rule; a reward "
                               "model's version rm-<folder@hash> trains on its score)")
    estimator: str = _f("grpo", "advantage estimator", choices=TRAIN_ESTIMATORS)
    group_size: int = _f(8, "completions per prompt (one group)", 2, 64)
    prompts_per_step: int = _f(8, "prompts (groups) per training step", 1, 256)
    learning_rate: float = _f(2e-4, "AdamW learning rate", 1e-7, 1e-1)
    steps: int = _f(50, "training steps", 1, 100_000)
    clip_eps: float = _f(0.2, "PPO clip ε: the ratio is clipped to [1-ε, 1+ε]", 0.0, 1.0)
    kl_beta: float = _f(0.0, "β of the KL penalty to the frozen reference (the starting weights)", 0.0, 10.0)
    entropy_q: float = _f(1.0, "train on the top q of tokens by entropy (TRL top_entropy_quantile; 1 = all)",
                          0.01, 1.0)
    temperature: float = _f(1.0, "sampling temperature", 0.1, 5.0)
    max_new_tokens: int = _f(40, "longest completion, tokens", 1, 4096)
    iterations: int = _f(1, "optimiser updates per batch (μ; > 1 makes the clip matter)", 1, 16)
    loss_type: str = _f("grpo", "how token losses average: grpo (per completion), bnpo (per token), dr_grpo",
                        choices=("grpo", "bnpo", "dr_grpo"))
    seed: int = _f(0, "seed of prompts, sampling and initialisation", 0, 2**31 - 1)
    lora: bool = _f(False, "train LoRA adapters (peft, pip install '.[lora]') instead of every weight, for "
                             "bigger models")
    lora_r: int = _f(8, "LoRA rank", 1, 256)
    checkpoint_every: int = _f(10, "save a checkpoint every k steps (and at the end)", 1, 100_000)
    overlap: bool = _f(True, "sample the next batch in a second process while this one trains (on a CPU with 2+ "
                             "cores; one step off-policy: the sampler's log-probs are π_old, so the clipped ratio "
                             "corrects the lag, as in PipelineRL and AReaL); off: strictly on-policy")

    def validate(self) -> None:
        """Raise :class:`TrainConfigError` naming every setting out of range."""
        problems = []
        for f in fields(self):
            v = getattr(self, f.name)
            lo, hi = f.metadata["bounds"]
            choices = f.metadata["choices"]
            if choices and v not in choices:
                problems.append(f"{f.name.replace('_', ' ')} must be one of {', '.join(choices)}, got {v!r}")
            if lo is not None and not lo <= v <= hi:
                problems.append(f"{f.name.replace('_', ' ')} must be {lo:g}-{hi:g}, got {v}")
        if not (self.prompt_set in PROMPT_SETS or self.prompt_set.startswith("run:")):
            problems.append(f"prompt set must be one of {', '.join(PROMPT_SETS)} or run:<run_id>, got {self.prompt_set!r}")
        if self.lora:
            import importlib.util
            if importlib.util.find_spec("peft") is None:
                problems.append("lora needs the peft package (pip install 'rollout-studio[lora]' or pip install peft), "
                                "which is not installed")
        if problems:
            raise TrainConfigError("; ".join(problems))

    @classmethod
    def from_dict(cls, d: dict) -> "MiniRunConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise TrainConfigError(f"unknown settings {unknown}; known: {', '.join(sorted(known))}")
        return cls(**d)

    def to_dict(self) -> dict:
        return asdict(self)


def task_prompts(task, prompt_set: str, n: int, seed: int) -> list:
    """The training pool of a task prompt set (seeded, disjoint from the held-out seed)."""
    if prompt_set == "mixed":
        k = max(1, n // 3)
        return (task.make_prompts(k, seed=TRAIN_SEED + seed, difficulty="easy")
                + task.make_prompts(k, seed=TRAIN_SEED + seed + 1, difficulty="medium")
                + task.make_prompts(n - 2 * k, seed=TRAIN_SEED + seed + 2, difficulty="hard"))
    return task.make_prompts(n, seed=TRAIN_SEED + seed, difficulty=prompt_set)


def heldout_prompts(task, n: int = 200) -> list:
    """Held-out prompts the sample policy never trained on (its build's evaluation set)."""
    return task.make_prompts(n, seed=HELDOUT_SEED, difficulty="medium")


# ---------------------------------------------------------------------------- rewards in the worker

class RewardFn:
    """The run's reward, callable in the worker: ``(prompts, completions) -> (rows, steps, errors)``.

    ``rows`` has a ``{component: value}`` dict per completion (``total`` included; None where
    a user rule failed on that completion), ``steps`` the ``(index, step_idx, value)`` step
    rewards, ``errors`` a ``{component: message}`` dict per completion (empty where it scored).
    Three kinds of reward: the task's built-in rule (in process), a user rule (in the
    sandbox pool, with its limits) and a reward model (``total`` = its score, loaded once in
    the worker).
    """

    def __init__(self, spec: dict, task):
        self.spec, self.task = spec, task
        if spec["kind"] == "builtin":
            from studio.rewards import DEFAULT_RULES
            self.rule = DEFAULT_RULES[task.name]
        elif spec["kind"] == "rule":
            from studio.rewards.sandbox import Limits, source_sha
            self.limits = Limits()
            self.sha = source_sha(spec["source"])
        elif spec["kind"] == "reward_model":
            from backends.reward_model import load_reward_model
            self.rm = load_reward_model(spec["path"])
        else:
            raise ValueError(f"unknown reward kind {spec['kind']!r}")

    def __call__(self, prompts: list, completions: list[str]) -> tuple[list[dict], list[tuple], list[dict]]:
        none = [dict() for _ in completions]
        if self.spec["kind"] == "builtin":
            from studio.rewards import score_frame
            frame = score_frame(self.rule, self.task, [(str(i), p, c) for i, (p, c) in enumerate(zip(prompts, completions))])
            out = [dict() for _ in completions]
            for rid, comp, val in frame[["rollout_id", "component", "value"]].itertuples(index=False):
                out[int(rid)][comp] = None if val is None or val != val else float(val)
            return out, [], none
        if self.spec["kind"] == "reward_model":
            scores = self.rm.score_rollouts([p.text for p in prompts], completions)
            return [{"total": float(s)} for s in scores], [], none
        from studio.rewards import sandbox
        rows = [(str(i), p.text, json.dumps(p.gold), c) for i, (p, c) in enumerate(zip(prompts, completions))]
        fut = sandbox.pool(self.limits).submit(sandbox.score_chunk, self.spec["source"], self.sha, self.task.name,
                                               rows, self.limits.call_s)
        rewards, steps, _ = fut.result(timeout=self.limits.budget_s)
        out, errors = [dict() for _ in completions], [dict() for _ in completions]
        for rid, comp, val, err in rewards:
            out[int(rid)][comp] = val
            if err:
                errors[int(rid)][comp] = err
        return out, [(int(r), k, v) for r, k, v in steps], errors


# ---------------------------------------------------------------------------- overlapped sampling

def _picked(prompts: list, order: np.ndarray, step: int, per_step: int) -> list:
    lo = (step - 1) * per_step
    return [prompts[int(i)] for i in order[lo:lo + per_step]]


def sampler_worker(folder: str, buffers: list[dict], published, cfg_dict: dict, prompts_json: list[dict],
                   order: np.ndarray, first: int, out, stop, parent_pid: int) -> None:
    """The overlapped sampler: batch ``b`` is sampled with the weights after step ``b - 2``
    (read from ``buffers[(b - 2) % 2]`` once ``published`` reaches that step), so it runs
    while the trainer takes step ``b - 1``, and which weights sampled which batch does not
    depend on timing. Sends ``(b, generations, prompt ids, seconds, lag)`` on the pipe end
    ``out`` (a send blocks until the trainer reads: at most one batch ahead), or
    ``("error", message)``."""
    import torch

    from backends import load_policy
    from backends.device import cpu_threads

    _exit_with_parent(parent_pid)
    try:
        torch.set_num_threads(max(1, cpu_threads() // 2))  # the trainer has the other half
        cfg = MiniRunConfig.from_dict(cfg_dict)
        policy = load_policy(folder)
        tok, model = policy.tokenizer, policy.model
        texts = [p["text"] for p in prompts_json]
        for b in range(first, cfg.steps + 1):
            v = max(first - 1, b - 2)
            while published.value < v:
                if stop.is_set():
                    return
                time.sleep(0.001)
            if stop.is_set():
                return
            with torch.no_grad():
                for name, t in model.state_dict().items():
                    t.copy_(buffers[v % 2][name])
            t0 = time.perf_counter()
            picked = [texts[int(i)] for i in order[(b - 1) * cfg.prompts_per_step:b * cfg.prompts_per_step]]
            gens = policy.sample(picked, n=cfg.group_size, temperature=cfg.temperature, top_p=1.0,
                                 max_new_tokens=cfg.max_new_tokens, seed=cfg.seed * 100_003 + b, top_k_stats=5)
            p_ids = [tok(picked[g.prompt_index])["input_ids"] for g in gens]
            if stop.is_set():
                return
            out.send((b, gens, p_ids, time.perf_counter() - t0, b - 1 - v))  # blocks until the trainer reads
    except (BrokenPipeError, EOFError):  # the trainer is gone
        return
    except BaseException as exc:  # the trainer reports it as the run's error
        try:
            out.send(("error", f"the sampling process failed: {type(exc).__name__}: {exc}"))
        except OSError:
            pass


class OverlappedSampler:
    """The trainer's side of :func:`sampler_worker`: ``publish`` after each optimiser step,
    ``next_batch`` for the step's generations, ``close`` at the end."""

    def __init__(self, model, folder: str, cfg: MiniRunConfig, prompts_json: list[dict], order: np.ndarray,
                 first: int):
        import torch.multiprocessing as tmp

        ctx = tmp.get_context("spawn")
        sd = model.state_dict()
        self.buffers = [{k: v.detach().clone().share_memory_() for k, v in sd.items()} for _ in range(2)]
        self.published = ctx.Value("i", first - 2, lock=False)
        self.inbox, out = ctx.Pipe(duplex=False)
        self.stop = ctx.Event()
        self.publish(model, first - 1)
        self.proc = ctx.Process(target=sampler_worker, daemon=True, name="minirun-sampler", args=(
            folder, self.buffers, self.published, cfg.to_dict(), prompts_json, order, first, out, self.stop,
            os.getpid()))
        self.proc.start()
        out.close()  # only the sampler holds the write end: its death reads as end-of-file, never as a hang

    def publish(self, model, step: int) -> None:
        """Make the weights after ``step`` available to the sampler."""
        import torch

        with torch.no_grad():
            for name, t in model.state_dict().items():
                self.buffers[step % 2][name].copy_(t)
        self.published.value = step

    def next_batch(self, step: int):
        while True:
            try:
                if not self.inbox.poll(1.0):
                    if not self.proc.is_alive():
                        raise RuntimeError(f"the sampling process ended (exit code {self.proc.exitcode})")
                    continue
                msg = self.inbox.recv()
            except EOFError:
                self.proc.join(timeout=5)
                raise RuntimeError(f"the sampling process ended (exit code {self.proc.exitcode}) while sending "
                                   f"the batch of step {step}") from None
            if msg[0] == "error":
                raise RuntimeError(msg[1])
            if msg[0] != step:
                raise RuntimeError(f"the sampler sent batch {msg[0]} for step {step}")
            return msg[1:]

    def close(self) -> None:
        self.stop.set()
        try:  # take a batch the sampler may be blocked sending, so it can see the stop
            while self.inbox.poll(0.2):
                self.inbox.recv()
        except (EOFError, OSError):
            pass
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=5)
        self.inbox.close()


# ---------------------------------------------------------------------------- the worker

def _exit_with_parent(parent: int) -> None:
    import threading

    def watch():
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(0)
    threading.Thread(target=watch, daemon=True).start()


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
    _exit_with_parent(parent_pid)
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
    from studio.tasks import Prompt, get_task

    cfg = MiniRunConfig.from_dict(cfg_dict)
    from backends.device import cpu_threads, pick_device
    if pick_device() == "cpu":
        torch.set_num_threads(cpu_threads())  # one core stays with the owner writing each step
    task = get_task(task_name)
    prompts = [Prompt(p["text"], p["gold"]) for p in prompts_json]
    torch.manual_seed(cfg.seed)
    policy = load_policy(resume_from or policy_path)
    model, tok = policy.model, policy.tokenizer
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
    rng = np.random.default_rng(cfg.seed)
    order = [rng.permutation(len(prompts)) for _ in range((cfg.steps * cfg.prompts_per_step) // max(1, len(prompts)) + 2)]
    order = np.concatenate(order)
    last_ckpt = start_step - 1
    step = start_step
    overlap = cfg.overlap and not cfg.lora and device == "cpu" and (os.cpu_count() or 1) >= 2
    sampler = None
    if overlap:
        torch.set_num_threads(max(1, cpu_threads() // 2))  # the threads left to models, split with the sampler
        sampler = OverlappedSampler(model, resume_from or policy_path, cfg, prompts_json, order, start_step)
    try:
        step, last_ckpt = _steps(cfg, start_step, prompts, order, policy, model, tok, ref, params, opt, reward_fn,
                                 task, pad, device, sampler, queue, stop, ckpt_dir, last_ckpt)
    finally:
        if sampler is not None:
            sampler.close()  # before the run is reported ended: nothing of it runs on after
    if step is None:  # stopped
        queue.put({"type": "done", "status": "stopped", "step": last_ckpt})
        return
    if last_ckpt != step:
        queue.put({"type": "checkpoint", "step": step, "path": save_checkpoint(model, tok, opt, ckpt_dir, step, cfg)})
    queue.put({"type": "done", "status": "done", "step": step})


def _steps(cfg, start_step, prompts, order, policy, model, tok, ref, params, opt, reward_fn, task, pad, device,
           sampler, queue, stop, ckpt_dir, last_ckpt):
    """The training loop; returns (last step, last checkpoint), or (None, …) when stopped."""
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

    step = start_step
    for step in range(start_step, cfg.steps + 1):
        t0 = time.perf_counter()
        picked = _picked(prompts, order, step, cfg.prompts_per_step)
        if sampler is None:
            gens = policy.sample([p.text for p in picked], n=cfg.group_size, temperature=cfg.temperature, top_p=1.0,
                                 max_new_tokens=cfg.max_new_tokens, seed=cfg.seed * 100_003 + step, top_k_stats=5)
            p_ids = [tok(picked[g.prompt_index].text)["input_ids"] for g in gens]
            t_sample, lag = time.perf_counter() - t0, 0
        else:  # sampled while the last step trained (sample_s: the sampler's own time, overlapped)
            gens, p_ids, t_sample, lag = sampler.next_batch(step)
        rewards, step_rewards, reward_errors = reward_fn([picked[g.prompt_index] for g in gens], [g.text for g in gens])
        total = np.array([np.nan if r.get("total") is None else r["total"] for r in rewards], dtype=np.float64)
        groups = np.array([g.prompt_index for g in gens])
        adv = _advantages(cfg.estimator, total, groups)
        thr = entropy_threshold([g.entropies for g in gens], cfg.entropy_q)
        emasks = [np.ones(g.n_tokens, np.float32) if thr is None else (g.entropies >= thr).astype(np.float32)
                  for g in gens]
        c_ids = [g.token_ids.tolist() for g in gens]
        C = max(1, max(len(c) for c in c_ids))
        em = torch.zeros(len(gens), C, device=device)
        for b, m in enumerate(emasks):
            em[b, :len(m)] = torch.from_numpy(m)
        a = torch.tensor(adv, dtype=torch.float32, device=device)
        # on a CPU, micro-batches of similar lengths (padding costs compute there); one batch on a GPU
        buckets = (length_buckets([len(p) + len(c) for p, c in zip(p_ids, c_ids)]) if device == "cpu"
                   else [np.arange(len(gens))])
        batches = micro_batches(p_ids, c_ids, a, buckets, cfg.loss_type, em if thr is not None else None)
        with torch.no_grad():
            for mb, idx in zip(batches, buckets):
                if lag:  # π_old is the policy that sampled: its recorded log-probs (the ratio corrects the lag)
                    mb.old_logps = torch.zeros(len(idx), mb.entropy_mask.shape[1] if mb.entropy_mask is not None
                                               else max(1, max(map(len, mb.completion_ids))), device=device)
                    for r, i in enumerate(idx):
                        mb.old_logps[r, :gens[i].n_tokens] = torch.from_numpy(gens[i].logprobs)
                elif cfg.iterations > 1:  # on-policy: π_old is this policy before the updates
                    mb.old_logps = completion_logps(model, mb.prompt_ids, mb.completion_ids, pad)[0]
                # else: one update on-policy, π_old is the forward pass itself, detached (as TRL)
                if ref is not None:
                    mb.ref_logps = completion_logps(ref, mb.prompt_ids, mb.completion_ids, pad)[0]
        stats_all, gnorm = [], 0.0
        for _ in range(cfg.iterations):
            opt.zero_grad(set_to_none=True)
            loss, stats = backward(model, batches, pad, eps_low=cfg.clip_eps, beta=cfg.kl_beta,
                                   loss_type=cfg.loss_type, max_completion_length=cfg.max_new_tokens)
            gnorm = grad_norm(model)
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            stats_all.append(stats | {"loss": loss})
        if sampler is not None:
            sampler.publish(model, step)
        n_tok = float(sum(len(c) for c in c_ids))
        equal = adv_mod.all_equal_groups(np.nan_to_num(total), groups)
        comps = sorted({k for r in rewards for k in r})
        metrics = {
            "reward_mean": float(np.nanmean(total)) if np.isfinite(total).any() else float("nan"),
            "reward_std": float(np.nanstd(total)) if np.isfinite(total).any() else float("nan"),
            "entropy": float(np.concatenate([g.entropies for g in gens]).mean()) if n_tok else 0.0,  # the sampler's
            "kl": stats_all[-1]["kl"], "clip_frac": float(np.mean([s["clip_frac"] for s in stats_all])),
            "loss": float(np.mean([s["loss"] for s in stats_all])), "grad_norm": gnorm,
            "completion_len": float(np.mean([g.n_tokens for g in gens])),
            "all_equal_share": len(equal) / max(1, len(set(groups.tolist()))),
            "entropy_threshold": float("nan") if thr is None else thr,
            "sample_s": t_sample, "staleness": float(lag), "step_s": time.perf_counter() - t0,
        }
        for c in comps:
            if c != "total":
                vals = np.array([np.nan if r.get(c) is None else r[c] for r in rewards], dtype=np.float64)
                metrics[f"reward/{c}"] = float(np.nanmean(vals)) if np.isfinite(vals).any() else float("nan")
                metrics[f"reward_std/{c}"] = float(np.nanstd(vals)) if np.isfinite(vals).any() else float("nan")
        if "accuracy" in comps:
            metrics["accuracy"] = metrics["reward/accuracy"]
        else:  # a reward without an accuracy component (a reward model, a user rule): the task's own check
            metrics["accuracy"] = float(np.mean([
                task.is_correct(picked[g.prompt_index], task.parse_completion(picked[g.prompt_index], g.text).answer)
                for g in gens]))
        out = StepOutput(step=step, generations=gens, prompt_index=[g.prompt_index for g in gens],
                         prompts=[p.text for p in picked], rewards=rewards, advantages=adv.tolist(),
                         token_weights=[float(x) * m for x, m in zip(adv, emasks)], metrics=metrics,
                         reward_errors=reward_errors)
        queue.put({"type": "step", "output": out, "step_rewards": step_rewards,
                   "prompts_gold": [p.gold for p in picked]})
        stopping = stop.is_set()
        if step % cfg.checkpoint_every == 0 or step == cfg.steps or stopping:
            queue.put({"type": "checkpoint", "step": step, "path": save_checkpoint(model, tok, opt, ckpt_dir, step, cfg)})
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


# ---------------------------------------------------------------------------- evaluation (worker pool)

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
    ok = np.array([task.is_correct(prompts[g.prompt_index], task.parse_completion(prompts[g.prompt_index], g.text).answer)
                   for g in gens]).reshape(len(prompts), k)
    gok = [task.is_correct(prompts[g.prompt_index], task.parse_completion(prompts[g.prompt_index], g.text).answer)
           for g in greedy]
    ents = np.concatenate([g.entropies for g in gens if g.n_tokens]) if gens else np.zeros(1)
    return {"accuracy": float(ok.mean()), f"pass@{k}": float(ok.any(axis=1).mean()), "greedy_accuracy": float(np.mean(gok)),
            "mean_length": float(np.mean([g.n_tokens for g in gens])), "entropy": float(ents.mean()),
            "prompts": len(prompts), "samples": int(ok.size)}
