"""Writes the agent-trajectory fixtures of ``tests/test_import_trajectories.py``, each the way its
framework writes it (field names from the framework's code, cited in the test and in docs/import.md).

Two calculator word problems, two samples each: a call that works, a call that fails, two calls in
one turn, an answer without a call. Token ids are the sample chat policy's (``sample_data/chat_policy``,
ChatML), each message encoded on its own as the agent loops do; log-probs come from a seeded generator.
Run ``python tests/data/imports/make_fixtures.py`` to write them again (the output is the same).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import Tokenizer

HERE = Path(__file__).resolve().parent
TOK = Tokenizer.from_file(str(HERE.parents[2] / "sample_data" / "chat_policy" / "tokenizer.json"))
SYSTEM = "You solve word problems. Use the calculator for arithmetic."
PROBLEMS = [("A farm has 37 rows of 24 apple trees. How many trees are there?", "888"),
            ("A shop sells 125 boxes of 16 pens and 9 loose pens. How many pens?", "2009")]


def call(expr: str) -> dict:
    return {"name": "calculator", "arguments": {"expression": expr}}


# each sample: the assistant's turns, each (text, [calls]), and the tool's answer to each call (None: it failed)
SAMPLES = [
    [("", [call("37*24")]), ("37 rows of 24 is \\boxed{888}.", [])],
    [("", [call("37 x 24")]), ("I will guess: \\boxed{861}.", [])],
    [("Two steps.", [call("125*16"), call("2000+9")]), ("So \\boxed{2009} pens.", [])],
    [("125*16 is about 2000, plus 9: \\boxed{2009}.", [])],
]
ANSWERS = {"37*24": "888", "125*16": "2000", "2000+9": "2009"}  # the calculator; anything else fails
ERROR = "invalid expression: '37 x 24'"


def ids(text: str) -> list[int]:
    return TOK.encode(text).ids


def call_text(c: dict) -> str:
    return f"<tool_call>{json.dumps(c)}</tool_call>"


def trajectory(k: int):
    """One sample as segments: (token ids, trained, role, text, calls or tool answers) per turn."""
    problem, gold = PROBLEMS[k // 2]
    prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": problem}]
    prompt_text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in prompt) + \
        "<|im_start|>assistant\n"
    segments = []
    for text, calls in SAMPLES[k]:
        said = text + "".join(call_text(c) for c in calls) + "<|im_end|>"
        segments.append((ids(said), True, "assistant", said, calls))
        if calls:
            answers = [ANSWERS.get(c["arguments"]["expression"]) for c in calls]
            shown = "".join(f"<tool_response>{a if a is not None else 'Error: ' + ERROR}</tool_response>"
                            for a in answers)
            obs = f"\n<|im_start|>user\n{shown}<|im_end|>\n<|im_start|>assistant\n"
            segments.append((ids(obs), False, "tool", obs, answers))
    return prompt, prompt_text, gold, segments


def logprobs(rng, n: int) -> list[float]:
    return [round(float(-abs(v)), 4) for v in rng.normal(0, 0.8, n)]


def response(rng, segs) -> tuple[list[int], list[int], list[float]]:
    """A whole response's token ids, loss mask and log-probs (0.0 on tool tokens, as verl and TRL pad them)."""
    ids_, mask, lps = [], [], []
    for seg_ids, trained, *_ in segs:
        ids_ += seg_ids
        mask += [int(trained)] * len(seg_ids)
        lps += logprobs(rng, len(seg_ids)) if trained else [0.0] * len(seg_ids)
    return ids_, mask, lps


def verl_agent(rng) -> list[dict]:
    """verl's AgentLoopOutput (agent_loop.py) dumped one per line, as tool_agent_loop.py fills it."""
    out = []
    for k in range(4):
        prompt, prompt_text, gold, segs = trajectory(k)
        resp, mask, lps = response(rng, segs)
        answers = [a for *_, role, _, a in segs if role == "tool" for a in a]
        correct = float(f"\\boxed{{{gold}}}" in segs[-1][3])
        out.append({"prompt_ids": ids(prompt_text), "response_ids": resp, "response_mask": mask,
                    "response_logprobs": lps, "multi_modal_data": {}, "reward_score": correct,
                    "num_turns": 2 * sum(1 for s in segs if s[2] == "assistant"),
                    "metrics": {"generate_sequences": 0.41, "tool_calls": 0.02, "num_preempted": -1},
                    "extra_fields": {"raw_prompt": prompt, "turn_scores": [],
                                     "tool_rewards": [0.1 if a is not None else -0.1 for a in answers],
                                     "reward_extra_info": {"acc": correct}}})
    return out


def skyrl(rng) -> list[dict]:
    """SkyRL's GeneratorOutput, step-wise (skyrl_gym_generator.py), one row per line: each step's response
    is the assistant's tokens and then its observation's (loss mask 0), the step's reward on its last token."""
    rows = []
    for k in range(4):
        prompt, prompt_text, gold, segs = trajectory(k)
        context = ids(prompt_text)
        steps = [segs[i:i + 2] for i in range(0, len(segs), 2)]
        for j, step in enumerate(steps):
            resp = [t for s in step for t in s[0]]
            mask = [int(s[1]) for s in step for _ in s[0]]
            lps = [v for s in step for v in (logprobs(rng, len(s[0])) if s[1] else [0.0] * len(s[0]))]
            reward = [0.0] * len(resp)
            last = j == len(steps) - 1
            reward[len(step[0][0]) - 1] = float(f"\\boxed{{{gold}}}" in step[0][3]) if last else 0.0
            rows.append({"prompt_token_ids": context, "response_ids": resp, "rewards": reward, "loss_masks": mask,
                         "stop_reasons": "stop", "rollout_logprobs": lps,
                         "trajectory_ids": {"instance_id": f"calc-{k // 2}", "repetition_id": k % 2},
                         "is_last_step": last})
            context = context + resp
    return rows


def trl(rng) -> pa.Table:
    """What a GRPOTrainer rollout_func returns (prompt_ids, completion_ids, logprobs, env_mask), a row per
    completion, beside the columns of TRL's completions table (step, prompt, reward functions, advantage)."""
    rows = []
    for k in range(4):
        prompt, prompt_text, gold, segs = trajectory(k)
        comp, mask, lps = response(rng, segs)
        correct = float(f"\\boxed{{{gold}}}" in segs[-1][3])
        rows.append({"step": 3, "prompt": prompt_text, "prompt_ids": ids(prompt_text), "completion_ids": comp,
                     "logprobs": lps, "env_mask": mask, "accuracy_reward": correct, "advantage": correct - 0.5})
    return pa.Table.from_pylist(rows)


def messages(k: int, with_ids: bool = True) -> list[dict]:
    """One sample as OpenAI chat messages: tool_calls with JSON-text arguments, tool messages by call id."""
    prompt, _, _, segs = trajectory(k)
    out = list(prompt)
    n = 0
    for _, _, role, text, extra in segs:
        if role == "assistant":
            content = text.split("<tool_call>")[0].removesuffix("<|im_end|>")
            msg = {"role": "assistant", "content": content}
            if extra:
                msg["tool_calls"] = [{"id": f"call_{k}{n + i}", "type": "function",
                                      "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
                                     for i, c in enumerate(extra)]
            out.append(msg)
        else:
            for a in extra:
                out.append({"role": "tool", "tool_call_id": f"call_{k}{n}",  # a failed call as TRL's tool loop says it
                            "content": a if a is not None else str({"error": ERROR})})
                n += 1
    return out


def openai_chat() -> list[dict]:
    """Chat messages as OpenAI's API and fine-tuning files write them, with a reward beside them."""
    return [{"messages": messages(k), "reward": float(f"\\boxed{{{trajectory(k)[2]}}}" in messages(k)[-1]["content"])}
            for k in range(4)]


def openai_responses() -> list[dict]:
    """Responses API items: the request's input and the response's output items."""
    out = []
    for k in range(4):
        msgs = messages(k)
        items = []
        for m in msgs[2:]:
            if m["role"] == "assistant":
                if m["content"]:
                    items.append({"type": "message", "role": "assistant", "status": "completed",
                                  "content": [{"type": "output_text", "text": m["content"], "annotations": []}]})
                for c in m.get("tool_calls", []):
                    items.append({"type": "function_call", "call_id": c["id"], "name": c["function"]["name"],
                                  "arguments": c["function"]["arguments"], "status": "completed"})
            else:
                items.append({"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"]})
        out.append({"instructions": SYSTEM, "input": [{"role": "user", "content": msgs[1]["content"]}],
                    "output": items, "reward": float("\\boxed{" + trajectory(k)[2] + "}" in msgs[-1]["content"])})
    return out


def rllm(rng) -> list[dict]:
    """rLLM Episode.to_dict() (rllm/types.py) per line: a trajectory whose steps are cumulative chats."""
    out = []
    for k in range(4):
        prompt, prompt_text, gold, segs = trajectory(k)
        msgs = messages(k)
        context, steps, seen = ids(prompt_text), [], len(prompt)
        for i in range(0, len(segs), 2):
            said = segs[i]
            upto = next(j for j in range(seen, len(msgs)) if msgs[j]["role"] == "assistant") + 1
            last = i + 2 >= len(segs)
            steps.append({"prompt_ids": context, "response_ids": said[0], "logprobs": logprobs(rng, len(said[0])),
                          "chat_completions": msgs[:upto], "observation": None, "thought": "",
                          "action": None, "model_response": msgs[upto - 1]["content"], "model_output": None,
                          "info": {}, "reward": float(f"\\boxed{{{gold}}}" in said[3]) if last else 0.0,
                          "done": last, "mc_return": 0.0, "advantage": None})
            context = context + said[0] + (segs[i + 1][0] if i + 1 < len(segs) else [])
            seen = upto
        correct = f"\\boxed{{{gold}}}" in segs[-1][3]
        out.append({"id": f"calc-{k // 2}:{k % 2}", "task": {"question": PROBLEMS[k // 2][0], "ground_truth": gold},
                    "termination_reason": "env_done", "is_correct": correct, "session_id": None,
                    "trajectories": [{"uid": f"traj-{k}", "name": "solver", "task": None, "steps": steps,
                                      "reward": float(correct), "info": {}}],
                    "metrics": {"solver_acc": float(correct)}, "info": {}})
    return out


def jsonl(name: str, records: list[dict]) -> None:
    (HERE / name).write_text("".join(json.dumps(r) + "\n" for r in records))


if __name__ == "__main__":
    jsonl("verl_agent_loop.jsonl", verl_agent(np.random.default_rng(0)))
    jsonl("skyrl_generator_output.jsonl", skyrl(np.random.default_rng(1)))
    pq.write_table(trl(np.random.default_rng(2)), HERE / "trl_rollout_func.parquet")
    jsonl("rllm_episodes.jsonl", rllm(np.random.default_rng(3)))
    jsonl("openai_chat.jsonl", openai_chat())
    jsonl("openai_responses.jsonl", openai_responses())
