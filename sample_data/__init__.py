"""The embedded default: two sample worlds, each a policy and pre-generated sample rollouts.

The arithmetic world (the studio's first): ``POLICY_DIR`` on the arithmetic task. The realistic
world: ``CHAT_POLICY_DIR`` (a tiny Qwen2 chat model with a BPE tokenizer and a ChatML template,
answering ``<think>…</think>`` then ``\\boxed{n}``; ``python -m sample_data.build_chat_policy``)
on GSM8K-shaped word problems (``WORDPROBLEMS_DIR``: ``gsm8k/`` and ``math/`` column shapes,
``python -m sample_data.wordproblems``), stored as the prompt set ``WORDPROBLEMS_TASK``;
``CHAT_ROLLOUTS_DIR`` seeds it with its rollouts (``python -m sample_data.make_chat_rollouts``).
The agent world: ``AGENT_POLICY_DIR`` (a tiny Qwen2 that calls a calculator tool in
``<tool_call>`` blocks; ``python -m sample_data.build_agent_policy``) on the built-in task
``calculator_agent``, and its trajectories ``AGENT_ROLLOUTS_DIR``
(``python -m sample_data.make_agent_rollouts``). The mismatch world: two short mini-runs of ``POLICY_DIR``
with a bfloat16 sampler, without and with TIS, both log-probs of every token and the runs' metrics
(``MISMATCH_RUNS_DIR``, ``python -m sample_data.make_mismatch_runs``). A new store is seeded with all
four (``SEED_DIRS``).

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
CHAT_POLICY_DIR = HERE / "chat_policy"
WORDPROBLEMS_DIR = HERE / "wordproblems"
WORDPROBLEMS_TASK = "wordproblems"
CHAT_ROLLOUTS_DIR = HERE / "chat_rollouts"
AGENT_POLICY_DIR = HERE / "agent_policy"  # python -m sample_data.build_agent_policy
AGENT_ROLLOUTS_DIR = HERE / "agent_rollouts"  # python -m sample_data.make_agent_rollouts
MISMATCH_RUNS_DIR = HERE / "mismatch_runs"  # python -m sample_data.make_mismatch_runs
SEED_DIRS = (ROLLOUTS_DIR, CHAT_ROLLOUTS_DIR, AGENT_ROLLOUTS_DIR, MISMATCH_RUNS_DIR)
