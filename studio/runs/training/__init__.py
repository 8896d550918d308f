"""Mini-runs, the worker side: the configuration and the training process.

- :mod:`~studio.runs.training.config`: :class:`MiniRunConfig` (the one dataclass the studio's
  form and the CLI are generated from), its checks, an agent task's own defaults, the prompt pools;
- :mod:`~studio.runs.training.loop`: :func:`train_worker`, the training process the owner
  (:mod:`studio.runs.minirun`) starts, its step loop and :func:`save_checkpoint`;
- :mod:`~studio.runs.training.reward`: :class:`RewardFn`, the run's reward in that process;
- :mod:`~studio.runs.training.rollouts`: what a step samples (agent trajectories on a task with
  tools) and the agent metrics;
- :mod:`~studio.runs.training.sampler`: the overlapped sampler (the next batch sampled in a
  second process while this one trains);
- :mod:`~studio.runs.training.evaluate`: :func:`evaluate_job`, held-out evaluation in the
  worker pool.

Nothing here opens the store: the training process sends each step to the owner, which
writes it. User reward code runs in the sandbox's pool (with its limits), the built-in rule
in process. Torch is imported inside the functions, so the server imports this package for
the config without it.
"""
from studio.runs.training.config import (
    HELDOUT_SEED,
    PROMPT_SETS,
    TRAIN_ESTIMATORS,
    TRAIN_SEED,
    MiniRunConfig,
    TrainConfigError,
    heldout_prompts,
    heldout_split,
    task_defaults,
    task_prompts,
    train_split,
    with_task_defaults,
)
from studio.runs.training.evaluate import evaluate_job
from studio.runs.training.loop import save_checkpoint, train_worker
from studio.runs.training.reward import RewardFn
from studio.runs.training.sampler import OverlappedSampler, sampler_worker

__all__ = ["HELDOUT_SEED", "PROMPT_SETS", "TRAIN_ESTIMATORS", "TRAIN_SEED", "MiniRunConfig", "OverlappedSampler",
           "RewardFn", "TrainConfigError", "evaluate_job", "heldout_prompts", "heldout_split", "sampler_worker", "save_checkpoint",
           "task_defaults", "task_prompts", "train_split", "train_worker", "with_task_defaults"]
