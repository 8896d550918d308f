"""The embedded default: the tiny sample policy and pre-generated sample rollouts.

``POLICY_DIR`` is a transformers folder (``save_pretrained``) rebuilt by
``python -m sample_data.build_policy``; ``ROLLOUTS_DIR`` holds one Parquet file per store
table, rebuilt by ``python -m sample_data.make_rollouts``.
"""
from pathlib import Path

HERE = Path(__file__).resolve().parent
POLICY_DIR = HERE / "policy"
ROLLOUTS_DIR = HERE / "rollouts"
