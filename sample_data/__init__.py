"""The embedded default: the tiny sample policy and pre-generated sample rollouts.

``POLICY_DIR`` is a transformers folder (``save_pretrained``) rebuilt by
``python -m sample_data.build_policy``; ``EARLY_POLICY_DIR`` is the same training run
stopped early (1,200 steps, ``python -m sample_data.build_policy --out
sample_data/policy_early --target 0.15``), the "before" of the policy comparison; ``ROLLOUTS_DIR`` holds one Parquet file per store
table, rebuilt by ``python -m sample_data.make_rollouts``.
"""
from pathlib import Path

HERE = Path(__file__).resolve().parent
POLICY_DIR = HERE / "policy"
EARLY_POLICY_DIR = HERE / "policy_early"
REWARD_MODEL_DIR = HERE / "reward_model"  # python -m sample_data.build_reward_model
PRM_DIR = HERE / "prm"  # python -m sample_data.build_prm
VALUE_MODEL_DIR = HERE / "value_model"  # python -m sample_data.build_value_model
ROLLOUTS_DIR = HERE / "rollouts"
