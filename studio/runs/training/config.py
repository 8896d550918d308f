"""The settings of a mini-run: :class:`MiniRunConfig`, their checks, and the prompt pools
its ``prompt_set`` names.

:class:`MiniRunConfig` is the one dataclass the studio's form and the CLI are generated from
(each field's help, bounds and choices are in its metadata); :meth:`MiniRunConfig.validate`
raises :class:`TrainConfigError` naming every setting out of range. A task's prompt set is
a seeded draw (:func:`task_prompts`), disjoint by seed from the held-out prompts the
evaluation reads (:func:`heldout_prompts`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from studio.configs import problems, setting
from studio.errors import StudioError
from studio.runs.training.rollouts import is_agent

TRAIN_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_pp")
CORRECTIONS = ("none", "tis", "mis", "icepop")  # importance weights for the sampler's mismatch (training.correction)
SAMPLER_PRECISIONS = ("float32", "bfloat16")
# each correction's band as the frameworks ship it (high = the cap C): verl's rollout_is_threshold 2 (its lower
# bound 1/2 for the mask mode), IcePop's [0.5, 5]
CORRECTION_DEFAULTS = {"tis": (0.0, 2.0), "mis": (0.5, 2.0), "icepop": (0.5, 5.0)}
PROMPT_SETS = ("easy", "medium", "hard", "mixed")  # or "run:<run_id>": the prompts of a stored run
HELDOUT_SEED = 10_000  # the sample policy's held-out prompts (sample_data.build_policy)
TRAIN_SEED = 20_000
# an agent task's own defaults (task_defaults): the agent world's budgets, and a step size that raises held-out
# success within 5 minutes on a busy 2-core CPU (where a step can take 20 s: the trajectories' sampling)
AGENT_DEFAULTS: dict[str, Any] = {"max_new_tokens": 256, "max_turns": 8, "learning_rate": 5e-4}


class TrainConfigError(StudioError, ValueError):
    """Mini-run settings out of range; the message names each one."""


@dataclass
class MiniRunConfig:
    """Everything a mini-run needs; the studio's form and ``rollout-studio minirun`` are
    generated from these fields (:mod:`studio.configs`)."""

    policy: str = setting("sample", "policy folder to start from ('sample': the bundled sample policy)")
    prompt_set: str = setting("medium", "training prompts: easy, medium, hard, mixed (fresh seeded draws of the sample "
                                   "task), a split of a stored prompt set (its train split when the name is not one), "
                                   "or run:<run_id> (the prompts of a stored run)")
    n_prompts: int = setting(128, "size of the training prompt pool (for the task's prompt sets), drawn a pass at a "
                              "time: 50 steps of 8 prompts see each of 128 prompts at 3 or 4 steps, so the Timeline "
                              "tab follows them; a much smaller pool is memorised rather than learned", 1, 100_000)
    rule_version: str = setting("", "reward: a stored rule version id ('' = the task's built-in rule; a reward "
                               "model's version rm-<folder@hash> trains on its score)")
    estimator: str = setting("grpo", "advantage estimator", choices=TRAIN_ESTIMATORS)
    group_size: int = setting(8, "completions per prompt (one group)", 2, 64)
    prompts_per_step: int = setting(8, "prompts (groups) per training step", 1, 256)
    learning_rate: float = setting(2e-4, "AdamW learning rate", 1e-7, 1e-1)
    steps: int = setting(50, "training steps", 1, 100_000)
    clip_eps: float = setting(0.2, "PPO clip ε: the ratio is clipped to [1-ε, 1+ε]", 0.0, 1.0)
    kl_beta: float = setting(0.0, "β of the KL penalty to the frozen reference (the starting weights)", 0.0, 10.0)
    entropy_q: float = setting(1.0, "train on the top q of tokens by entropy (TRL top_entropy_quantile; 1 = all)",
                          0.01, 1.0)
    temperature: float = setting(1.0, "sampling temperature", 0.1, 5.0)
    max_new_tokens: int = setting(40, "longest completion, tokens (an agent trajectory's, tool responses included)",
                                  1, 4096)
    max_turns: int = setting(6, "agent tasks: tool calls a trajectory may make (a call past them ends it)", 1, 64)
    iterations: int = setting(1, "optimiser updates per batch (μ; > 1 makes the clip matter)", 1, 16)
    loss_type: str = setting("grpo", "how token losses average: grpo (per completion), bnpo (per token), dr_grpo",
                        choices=("grpo", "bnpo", "dr_grpo"))
    seed: int = setting(0, "seed of prompts, sampling and initialisation", 0, 2**31 - 1)
    lora: bool = setting(False, "train LoRA adapters (peft, pip install '.[lora]') instead of every weight, for "
                             "bigger models")
    lora_r: int = setting(8, "LoRA rank", 1, 256)
    checkpoint_every: int = setting(10, "save a checkpoint every k steps (and at the end)", 1, 100_000)
    overlap: bool = setting(True, "sample the next batch in a second process while this one trains (on a CPU with 2+ "
                             "cores; one step off-policy: the sampler's log-probs are π_old, so the clipped ratio "
                             "corrects the lag, as in PipelineRL and AReaL); off: strictly on-policy")
    sampler_precision: str = setting("float32", "precision the sampler runs in (the overlapped sampler process, or "
                                     "the in-process sampling) while the trainer stays float32: bfloat16 makes a real "
                                     "training-inference mismatch, stored per token", choices=SAMPLER_PRECISIONS)
    correction: str = setting("none", "importance correction of the mismatch (behaviour: the sampler's log-probs; "
                              "π_old: the trainer's recomputed ones): tis w = min(r, C), mis / icepop w = r inside "
                              "[low, C] else 0; none: the plain loss", choices=CORRECTIONS)
    is_cap: float = setting(0.0, "the correction's C: TIS cap, MIS / ICEPOP upper bound (0: the method's default, "
                            "TIS and MIS 2, ICEPOP 5)", 0.0, 1e6)
    is_low: float = setting(0.0, "MIS / ICEPOP lower bound (0: the method's default 0.5)", 0.0, 1.0)

    def validate(self) -> None:
        """Raise :class:`TrainConfigError` naming every setting out of range."""
        bad = problems(self)
        if not self.prompt_set.strip():
            bad.append(f"prompt set must be one of {', '.join(PROMPT_SETS)}, a split of a stored prompt set or "
                       "run:<run_id>, got ''")
        if self.lora:
            import importlib.util
            if importlib.util.find_spec("peft") is None:
                bad.append("lora needs the peft package (pip install 'rollout-studio[lora]' or pip install peft), "
                                "which is not installed")
        low, high = self.correction_band() if self.correction in CORRECTION_DEFAULTS else (0.0, 1.0)
        if low >= high:
            bad.append(f"the correction's band is empty: is_low {low:g} must be below is_cap {high:g}")
        if bad:
            raise TrainConfigError("; ".join(bad))

    def correction_band(self) -> tuple[float, float]:
        """``(low, C)`` of the correction, a method's default where ``is_low`` / ``is_cap`` are 0
        (:data:`CORRECTION_DEFAULTS`); (0, inf) for none."""
        if self.correction == "none":
            return 0.0, float("inf")
        low, high = CORRECTION_DEFAULTS[self.correction]
        return (0.0 if self.correction == "tis" else (self.is_low or low)), (self.is_cap or high)

    @classmethod
    def from_dict(cls, d: dict) -> MiniRunConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise TrainConfigError(f"unknown settings {unknown}; known: {', '.join(sorted(known))}")
        return cls(**d)

    def to_dict(self) -> dict:
        return asdict(self)


def task_defaults(task) -> dict[str, Any]:
    """The settings whose default is another on ``task``: on an agent task (one with tools), the
    sample agent policy and the settings :data:`AGENT_DEFAULTS` names (trajectories need a longer
    budget, and these make five minutes of CPU training raise held-out success,
    ``docs/miniruns.md``); none on any other task."""
    if not is_agent(task):
        return {}
    from sample_data import AGENT_POLICY_DIR

    return {"policy": str(AGENT_POLICY_DIR), **AGENT_DEFAULTS}


def with_task_defaults(cfg: MiniRunConfig, task) -> MiniRunConfig:
    """``cfg`` with every setting still at its default set to ``task``'s (:func:`task_defaults`)."""
    base = MiniRunConfig()
    return replace(cfg, **{k: v for k, v in task_defaults(task).items() if getattr(cfg, k) == getattr(base, k)})


def task_prompts(task, prompt_set: str, n: int, seed: int) -> list:
    """The training pool of a task prompt set (seeded, disjoint from the held-out seed)."""
    if prompt_set not in PROMPT_SETS:
        raise TrainConfigError(f"prompt set must be one of {', '.join(PROMPT_SETS)} or run:<run_id> for task "
                               f"{task.name!r}, got {prompt_set!r}")
    if prompt_set == "mixed":
        k = max(1, n // 3)
        return (task.make_prompts(k, seed=TRAIN_SEED + seed, difficulty="easy")
                + task.make_prompts(k, seed=TRAIN_SEED + seed + 1, difficulty="medium")
                + task.make_prompts(n - 2 * k, seed=TRAIN_SEED + seed + 2, difficulty="hard"))
    return task.make_prompts(n, seed=TRAIN_SEED + seed, difficulty=prompt_set)


def train_split(task, prompt_set: str) -> str:
    """The split a stored prompt set trains on: ``prompt_set`` when the task has that split,
    else its ``train`` split (else its first)."""
    if prompt_set in task.splits:
        return prompt_set
    if not task.splits:
        raise TrainConfigError(f"task {task.name!r} has no stored prompts to train on")
    return "train" if "train" in task.splits else task.splits[0]


def heldout_split(task) -> str:
    """The split a stored prompt set is evaluated on: ``test`` (else ``validation``, else its last)."""
    for name in ("test", "validation", "val", "heldout"):
        if name in task.splits:
            return name
    if not task.splits:
        raise TrainConfigError(f"task {task.name!r} has no stored prompts to evaluate on")
    return task.splits[-1]


def heldout_prompts(task, n: int = 200) -> list:
    """Held-out prompts the sample policy never trained on (its build's evaluation set)."""
    return task.make_prompts(n, seed=HELDOUT_SEED, difficulty="medium")
