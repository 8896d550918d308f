"""GRPO, Dr. GRPO and RLOO advantages equal the ones TRL's own trainers compute.

TRL has no standalone advantage function: ``GRPOTrainer`` and ``RLOOTrainer`` compute the
advantages inline in ``_generate_and_score_completions``. So each test trains the tiny sample
policy for a few real steps with a reward function that hands out pre-drawn random rewards,
captures what TRL computed (the ``advantages`` the loss consumes, the rewards it logged, the
prompts it grouped by) and recomputes them with :mod:`studio.signals.advantages`.

TRL groups the ``num_generations`` consecutive completions of one prompt (``view(-1, G)``);
the test checks that each such block shares one prompt and passes the prompts as our group
labels. TRL works in float32, so the rewards are drawn on a grid of 1/64 (exact in float32,
as binary and graded rewards are): TRL's group mean and deviations are then exact and the
remaining float32 rounding is ~1e-7, well inside the 1e-6 tolerance.
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the policy is a local folder: never touch the Hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("trl")
pytest.importorskip("datasets")

from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer  # noqa: E402

from sample_data import POLICY_DIR  # noqa: E402
from studio.signals import advantages  # noqa: E402

G = 4  # num_generations: completions per prompt (one group)
GROUPS_PER_STEP = 6  # per-device batch = 24 completions = 6 groups
STEPS = 3  # one fresh generation batch per step: 18 random groups per estimator
TOL = 1e-6

# transformers 5 deprecation notices triggered inside TRL's trainer (gradient_checkpointing names)
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def _draw_rewards(seed: int) -> np.ndarray:
    """(STEPS, GROUPS_PER_STEP * G) rewards on a 1/64 grid; every step has an all-equal group,
    a binary group, a group with ties, and free draws, in a random order."""
    rng = np.random.default_rng(seed)
    grid = lambda n: rng.integers(-64, 65, size=n) / 64.0  # noqa: E731  # [-1, 1], exact in float32
    steps = []
    for _ in range(STEPS):
        groups = [
            np.full(G, rng.choice([0.0, 1.0, 0.5, -0.25])),  # all equal: A = 0 ("advantage collapse")
            np.array([1.0, 0.0, 0.0, 0.0])[rng.permutation(G)],  # binary correctness, with ties
            np.repeat(grid(2), [3, 1])[rng.permutation(G)],  # two values, three tied
            rng.integers(0, 2, size=G).astype(float),  # random binary (may itself be all equal)
            grid(G),
            grid(G),
        ]
        steps.append(np.concatenate([groups[i] for i in rng.permutation(len(groups))]))
    return np.stack(steps)


def _run_trl(trainer_cls, config_cls, out_dir, seed: int, **config) -> list[dict]:
    """Train ``STEPS`` steps and return, per generation batch, TRL's prompts, rewards and advantages."""
    drawn = _draw_rewards(seed)
    calls = []

    def pre_drawn_reward(prompts, completions, **kwargs):
        r = drawn[len(calls)]
        assert len(prompts) == len(r), "one reward per completion of the generation batch"
        calls.append(list(prompts))
        return r.tolist()

    prompts = [f"Q: {a}+{b}-{c}=" for a, b, c in zip(range(11, 99, 4), range(48, 4, -2), range(7, 29))]
    dataset = Dataset.from_dict({"prompt": prompts[:STEPS * GROUPS_PER_STEP]})
    args = config_cls(
        output_dir=str(out_dir), num_generations=G, per_device_train_batch_size=G * GROUPS_PER_STEP,
        gradient_accumulation_steps=1, max_completion_length=8, max_steps=STEPS, logging_steps=1,
        report_to="none", use_cpu=True, bf16=False, save_strategy="no", disable_tqdm=True, seed=seed, **config,
    )
    trainer = trainer_cls(model=str(POLICY_DIR), reward_funcs=pre_drawn_reward, args=args, train_dataset=dataset)

    batches = []
    score = trainer._generate_and_score_completions

    def capture(inputs):
        out = score(inputs)
        batches.append({
            "prompts": list(trainer._logs["prompt"]),
            "rewards": np.array(trainer._logs["rewards"]["pre_drawn_reward"], dtype=np.float64),
            "logged": np.array(trainer._logs["advantages"], dtype=np.float64),
            "advantages": out["advantages"].detach().double().numpy(),  # before _prepare_inputs shuffles
            "drawn": drawn[len(batches)],
        })
        return out

    trainer._generate_and_score_completions = capture
    trainer.train()
    assert len(batches) == STEPS, "every step generates and scores a fresh batch"
    return batches


def _groups(prompts: list[str]) -> np.ndarray:
    """Group labels from the prompts, after checking TRL's blocks of G are one prompt each."""
    blocks = [prompts[i:i + G] for i in range(0, len(prompts), G)]
    assert all(len(set(b)) == 1 for b in blocks), "TRL groups G consecutive completions of one prompt"
    assert len({b[0] for b in blocks}) == len(blocks), "distinct prompts per batch, so prompt = group"
    return np.unique(np.asarray(prompts), return_inverse=True)[1]


def _check(batches: list[dict], ours) -> None:
    for b in batches:
        groups = _groups(b["prompts"])
        assert np.array_equal(b["rewards"], b["drawn"]), "TRL scored the pre-drawn rewards exactly"
        assert np.array_equal(b["advantages"], b["logged"])
        assert any(np.ptp(b["rewards"][groups == g]) == 0 for g in np.unique(groups)), "an all-equal group"
        assert np.abs(b["advantages"]).max() > 0.1, "not a vacuous all-zero batch"
        mine = ours(b["rewards"], groups)
        assert np.abs(mine - b["advantages"]).max() < TOL
        equal = np.array([np.ptp(b["rewards"][groups == g]) == 0 for g in groups])
        assert (b["advantages"][equal] == 0).all() and (mine[equal] == 0).all()  # collapse is exact in both


def test_grpo_matches_trl_grpo_trainer(tmp_path):
    # GRPO  <->  GRPOTrainer(scale_rewards="group"), TRL's default: (r - mean_g) / (std_g + 1e-4)
    # with the Bessel-corrected group std (trl.trainer.utils.nanstd). beta = 0 (no KL term).
    batches = _run_trl(GRPOTrainer, GRPOConfig, tmp_path, seed=1, scale_rewards="group", beta=0.0)
    _check(batches, advantages.grpo)


def test_dr_grpo_matches_trl_grpo_trainer_unscaled(tmp_path):
    # Dr. GRPO  <->  GRPOTrainer(scale_rewards="none"): r - mean_g, no division by the std.
    # (Dr. GRPO's loss_type="dr_grpo" changes only the token aggregation of the loss, not advantages.)
    batches = _run_trl(GRPOTrainer, GRPOConfig, tmp_path, seed=2, scale_rewards="none", beta=0.0)
    _check(batches, advantages.dr_grpo)


def test_rloo_matches_trl_rloo_trainer(tmp_path):
    # RLOO  <->  RLOOTrainer(beta=0, normalize_advantages=False): r - (sum_g - r) / (G - 1).
    # beta > 0 would subtract a sequence KL from the reward first, and normalize_advantages=True
    # would whiten over the batch; neither is the plain leave-one-out estimator.
    batches = _run_trl(RLOOTrainer, RLOOConfig, tmp_path, seed=3, beta=0.0, normalize_advantages=False)
    _check(batches, advantages.rloo)
