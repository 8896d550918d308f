"""Overlapped sampling: the next batch is sampled in a second process while this one trains.

:func:`sampler_worker` runs in that process; :class:`OverlappedSampler` is the trainer's side.
Weights pass through two shared-memory buffers (one per parity of the step that made them),
so batch ``b`` is always sampled with the weights after step ``b - 2`` whatever the timing:
one step off-policy, which the clipped ratio corrects (the sampler's log-probs are π_old), as
in PipelineRL and AReaL. The sampler's death reads as end-of-file on the pipe, never a hang.

The sampler runs in the run's ``sampler_precision`` (:func:`in_precision`; the trainer stays
float32) and names itself on every generation (:func:`engine_label`: the behaviour log-probs'
engine, ``rollouts.engine``).
"""
from __future__ import annotations

import os
import time

import numpy as np

from studio.runs.training.config import MiniRunConfig
from studio.runs.training.rollouts import environment, step_groups
from studio.tasks import get_task
from studio.workers.processes import exit_with_parent, ignore_interrupts, quiet_models


def engine_label(model) -> str:
    """What runs ``model``, as ``rollouts.engine`` names it (:func:`backends.policy.engine_name`):
    ``torch 2.13.0 cpu bfloat16``."""
    from backends.policy import engine_name

    p = next(model.parameters())
    return engine_name(p.device.type, str(p.dtype).removeprefix("torch."))


def in_precision(policy, precision: str):
    """``policy`` itself in float32, else a copy whose model runs in ``precision`` (the tokenizer shared):
    the sampler of a run with ``sampler_precision`` bfloat16. :func:`copy_weights` keeps it current."""
    import copy

    import torch

    if precision == "float32":
        return policy
    low = copy.copy(policy)
    low.model = copy.deepcopy(policy.model).to(getattr(torch, precision)).eval()
    low.precision = precision  # the engine it stamps on what it samples
    return low


def copy_weights(dst, src_state: dict) -> None:
    """Copy the weights of ``src_state`` (a state dict) into model ``dst``, cast to its precision."""
    import torch

    with torch.no_grad():
        for name, t in dst.state_dict().items():
            t.copy_(src_state[name])


def sampler_worker(folder: str, buffers: list[dict], published, cfg_dict: dict, prompts_json: list[dict],
                   order: np.ndarray, first: int, task_spec, out, stop, parent_pid: int) -> None:
    """The overlapped sampler: batch ``b`` is sampled with the weights after step ``b - 2``
    (read from ``buffers[(b - 2) % 2]`` once ``published`` reaches that step), so it runs
    while the trainer takes step ``b - 1``, and which weights sampled which batch does not
    depend on timing. Sends ``(b, generations, prompt ids, seconds, lag)`` on the pipe end
    ``out`` (a send blocks until the trainer reads: at most one batch ahead), or
    ``("error", message)``. On an agent task (``task_spec``) it samples trajectories, its tools
    running in a sandbox of its own."""
    ignore_interrupts()  # its trainer stops it
    import torch

    from backends import load_policy
    from backends.device import cpu_threads

    quiet_models()
    exit_with_parent(parent=parent_pid)
    try:
        torch.set_num_threads(max(1, cpu_threads() // 2))  # the trainer has the other half
        cfg = MiniRunConfig.from_dict(cfg_dict)
        with environment(get_task(task_spec)) as env:
            policy = in_precision(load_policy(folder), cfg.sampler_precision)
            _sample(policy, env, cfg, buffers, published, prompts_json, order, first, out, stop)
    except (BrokenPipeError, EOFError):  # the trainer is gone
        return
    except BaseException as exc:  # the trainer reports it as the run's error
        try:
            out.send(("error", f"the sampling process failed: {type(exc).__name__}: {exc}"))
        except OSError:
            pass


def _sample(policy, env, cfg: MiniRunConfig, buffers, published, prompts_json, order, first, out, stop) -> None:
    """The sampler's loop (see :func:`sampler_worker`); returns when the run's steps are sampled or ``stop`` is set."""
    tok, model = policy.tokenizer, policy.model
    engine = engine_label(model)
    texts = [p["text"] for p in prompts_json]
    for b in range(first, cfg.steps + 1):
        v = max(first - 1, b - 2)
        while published.value < v:
            if stop.is_set():
                return
            time.sleep(0.001)
        if stop.is_set():
            return
        copy_weights(model, buffers[v % 2])
        t0 = time.perf_counter()
        picked = [texts[int(i)] for i in order[(b - 1) * cfg.prompts_per_step:b * cfg.prompts_per_step]]
        gens = step_groups(policy, picked, cfg, cfg.seed * 100_003 + b, env)
        for g in gens:
            g.engine = engine
        p_ids = [tok(picked[g.prompt_index])["input_ids"] for g in gens]
        if stop.is_set():
            return
        out.send((b, gens, p_ids, time.perf_counter() - t0, b - 1 - v))  # blocks until the trainer reads


class OverlappedSampler:
    """The trainer's side of :func:`sampler_worker`: ``publish`` after each optimiser step,
    ``next_batch`` for the step's generations, ``close`` at the end."""

    def __init__(self, model, folder: str, cfg: MiniRunConfig, prompts_json: list[dict], order: np.ndarray,
                 first: int, task_spec):
        import torch.multiprocessing as tmp

        ctx = tmp.get_context("spawn")
        sd = model.state_dict()
        self.buffers = [{k: v.detach().clone().share_memory_() for k, v in sd.items()} for _ in range(2)]
        self.published = ctx.Value("i", first - 2, lock=False)
        self.inbox, out = ctx.Pipe(duplex=False)
        self.stop = ctx.Event()
        self.publish(model, first - 1)
        # not a daemon: on an agent task it starts its tools' sandbox process (a daemon may have no children);
        # it ends with the trainer all the same (close, exit_with_parent)
        self.proc = ctx.Process(target=sampler_worker, daemon=False, name="minirun-sampler", args=(
            folder, self.buffers, self.published, cfg.to_dict(), prompts_json, order, first, task_spec, out, self.stop,
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
