"""Writes the mismatch import fixtures: small dumps with both log-probs, under the field names each framework
writes (run from this folder; the values are seeded, so the files are the same each time).

The recomputed side differs from the behaviour side by a few hundredths, as a bf16 sampler against an fp32
trainer does. Each file: 3 records of 6 response tokens.
"""
import json
import os
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

rng = random.Random(33)


def pair(n: int) -> tuple[list[float], list[float]]:
    """(behaviour, recomputed) log-probs of n tokens, both <= 0."""
    b = [round(-rng.uniform(0.001, 2.5), 6) for _ in range(n)]
    return b, [round(min(0.0, v + rng.uniform(-0.05, 0.05)), 6) for v in b]


def lines(path: str, rows: list[dict]) -> None:
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


QS = [("What is 2+3?", "5"), ("What is 4*4?", "16"), ("What is 9-7?", "2")]

def main() -> None:
    """Write every fixture into this folder."""
    os.chdir(Path(__file__).resolve().parent)
    # verl: a generation dump ({step}.jsonl: input, output, gts, score, step) with the batch's per-token
    # rollout_log_probs (the sampler's) and old_log_probs (the actor's recomputation)
    rows = []
    for q, a in QS:
        b, t = pair(6)
        rows.append({"input": q, "output": f"It is {a}.", "gts": a, "score": 1.0, "step": 3,
                     "rollout_log_probs": b, "old_log_probs": t})
    lines("verl/3.jsonl", rows)

    # verl agent loop: response_mask 0 on the tool's tokens; both log-prob lists cover every response token
    rows = []
    for q, _a in QS:
        b, t = pair(6)
        rows.append({"prompt_ids": [1, 5, 7], "response_ids": [30, 31, 32, 40, 41, 33],
                     "response_mask": [1, 1, 1, 0, 0, 1], "rollout_log_probs": [*b[:3], 0.0, 0.0, b[5]],
                     "old_log_probs": [*t[:3], 0.0, 0.0, t[5]], "reward_score": 1.0, "num_turns": 2,
                     "extra_fields": {"raw_prompt": [{"role": "user", "content": q}]}})
    lines("verl_agent/2.jsonl", rows)

    # OpenRLHF: rollout_log_probs (vLLM's) beside action_log_probs (the actor's forward pass)
    rows = []
    for q, a in QS:
        b, t = pair(6)
        rows.append({"prompt": q, "response": f"It is {a}.", "reward": 1.0, "global_step": 5,
                     "rollout_log_probs": b, "action_log_probs": t})
    lines("openrlhf.jsonl", rows)

    # OpenRLHF before rollout_log_probs: action_log_probs is the one log-prob, the behaviour side as before
    rows = [{"prompt": q, "response": f"It is {a}.", "reward": 1.0, "action_log_probs": pair(6)[0]} for q, a in QS]
    lines("openrlhf_old.jsonl", rows)

    # NeMo-RL: train_data_step{N}.jsonl as grpo.py logs it: per token of the whole padded sequence (prompt,
    # response, padding) generation_logprobs (the generation backend's; 0 off the response) and prev_logprobs
    # (the policy's forward pass, over the prompt too), token_loss_mask 1 on the response; the second sample
    # is multi-turn: an environment's 2 tokens (mask 0) between two assistant turns
    rows, width = [], 14
    for i, (q, a) in enumerate(QS):
        prompt = [1, 5, 7, 9 + i]
        mask = [0] * 4 + ([1, 1, 1, 0, 0, 1] if i == 1 else [1] * 6)
        b, t = pair(6)
        pre = [round(-rng.uniform(0.1, 4.0), 6) for _ in prompt]
        n = len(mask)
        pad = width - n
        rows.append({"content": [f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n", f"It is {a}."],
                     "rewards": 1.0, "advantages": [0.5] * width, "input_lengths": n,
                     "token_ids": prompt + [30, 31, 32, 33, 34, 35] + [0] * pad,
                     "token_loss_mask": mask + [0] * pad, "sample_loss_mask": 1.0,
                     "generation_logprobs": [0.0] * 4 + [v if k else 0.0 for v, k in zip(b, mask[4:])] + [0.0] * pad,
                     "prev_logprobs": pre + t + [0.0] * pad})
    lines("nemo_rl/train_data_step7.jsonl", rows)

    # SkyRL single-turn generator output: rollout_logprobs, the behaviour side only
    rows = []
    for i in range(len(QS)):
        rows.append({"prompt_token_ids": [1, 5, 7 + i], "response_ids": [30, 31, 32, 33, 34, 35],
                     "loss_masks": [1] * 6, "rollout_logprobs": pair(6)[0], "rewards": 1.0, "stop_reasons": "stop"})
    lines("skyrl.jsonl", rows)

    # generic: any two columns, mapped with --map logprobs=sampler_lp --map train_logprobs=trainer_lp
    b, t = zip(*(pair(6) for _ in QS), strict=True)
    pq.write_table(pa.table({"question": [q for q, _ in QS], "answer": [f"It is {a}." for _, a in QS],
                             "sampler_lp": pa.array(list(b), pa.list_(pa.float32())),
                             "trainer_lp": pa.array(list(t), pa.list_(pa.float32()))}), "generic.parquet")

    # slime: --save-debug-rollout-data as slime/ray/rollout.py saves it, torch.save of {rollout_id, samples:
    # [Sample.to_dict()]}: tokens are prompt + response, loss_mask and rollout_log_probs cover the response
    samples = []
    for i, (q, a) in enumerate(QS):
        prompt_ids = [1, 5, 7 + i]
        samples.append({"group_index": i, "index": i,
                        "prompt": f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n",
                        "tokens": prompt_ids + [30, 31, 32, 33, 34, 35], "multimodal_inputs": None,
                        "response": f"It is {a}.", "response_length": 6, "label": a, "reward": 1.0,
                        "loss_mask": [1] * 6, "weight_versions": ["4"], "rollout_log_probs": pair(6)[0],
                        "rollout_routed_experts": None, "remove_sample": False, "status": "completed",
                        "metadata": {}, "train_metadata": None})
    torch.save({"rollout_id": 4, "samples": samples}, "slime/rollout_4.pt")


if __name__ == "__main__":
    main()
