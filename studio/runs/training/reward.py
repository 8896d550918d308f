"""The run's reward, called in the training process: :class:`RewardFn`.

Three kinds, chosen by the owner's reward spec (``studio.runs.minirun``): the task's built-in
rule (scored in process), a user rule (stored source, scored in the sandbox's pool with its
limits: the training process never runs user code itself) and a reward model (its score is
``total``; loaded once, in this process).
"""
from __future__ import annotations

import json


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
            from studio.rewards import default_rule
            self.rule = default_rule(task)
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
            rows = [(str(i), p, c) for i, (p, c) in enumerate(zip(prompts, completions, strict=False))]
            frame = score_frame(self.rule, self.task, rows)
            out = [dict() for _ in completions]
            for rid, comp, val in frame[["rollout_id", "component", "value"]].itertuples(index=False):
                out[int(rid)][comp] = None if val is None or val != val else float(val)
            return out, [], none
        if self.spec["kind"] == "reward_model":
            scores = self.rm.score_rollouts([p.text for p in prompts], completions)
            return [{"total": float(s)} for s in scores], [], none
        from studio.rewards import sandbox
        rows = [(str(i), p.text, json.dumps(p.gold), c)
                for i, (p, c) in enumerate(zip(prompts, completions, strict=False))]
        fut = sandbox.pool(self.limits).submit(sandbox.score_chunk, self.spec["source"], self.sha, self.task.spec,
                                               rows, self.limits.call_s)
        rewards, steps, *_ = fut.result(timeout=self.limits.budget_s)
        out, errors = [dict() for _ in completions], [dict() for _ in completions]
        for rid, comp, val, err in rewards:
            out[int(rid)][comp] = val
            if err:
                errors[int(rid)][comp] = err
        return out, [(int(r), k, v) for r, k, v in steps], errors
