"""What a mini-run samples each step, and what it measures of agent trajectories.

On a task with tools (an agent task: ``task.tools``, as ``calculator_agent`` has) every
completion is a trajectory of the agent loop (``Policy.sample_agent``, :mod:`backends.agent`):
the policy writes until a tool call closes, the environment
(:class:`studio.workers.agent_env.TaskEnv`: the task reads the call, the tool runs in the
sandbox with its limits) appends the tool's response as masked tokens, and the policy goes on,
up to ``max_turns`` calls and ``max_new_tokens`` tokens in all. On any other task, one answer
per completion (``Policy.sample``). The training process and the overlapped sampler both sample
here, so the two always draw the same kind of batch.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np

from studio.store.records import trajectory_counts


def is_agent(task) -> bool:
    """Whether the task's completions are agent trajectories (it has tools)."""
    return bool(getattr(task, "tools", None))


@contextlib.contextmanager
def environment(task) -> Iterator:
    """The agent environment of an agent task while the block runs (its tools run in a sandbox
    process, stopped at the end); None for another task (or ``task`` None)."""
    if task is None or not is_agent(task):
        yield None
        return
    from studio.workers.agent_env import TaskEnv
    from studio.workers.tools import ToolSandbox

    with ToolSandbox() as sandbox:
        yield TaskEnv(task, sandbox)


def sample_groups(policy, inputs: list[str], env, n: int, temperature: float, max_new_tokens: int, max_turns: int,
                  seed: int, top_k_stats: int = 5) -> list:
    """``n`` completions of each input text (prompt-major), with per-token statistics: agent
    trajectories when ``env`` is given (:func:`environment`; ``max_turns`` tool calls at most),
    single answers otherwise."""
    kw = dict(n=n, temperature=temperature, top_p=1.0, max_new_tokens=max_new_tokens, seed=seed,
              top_k_stats=top_k_stats)
    if env is None:
        return policy.sample(inputs, **kw)
    return policy.sample_agent(inputs, env, max_turns=max_turns, **kw)


def step_groups(policy, inputs: list[str], cfg, seed: int, env=None) -> list:
    """A training step's batch: ``cfg.group_size`` completions of each input, as ``cfg`` samples them."""
    return sample_groups(policy, inputs, env, cfg.group_size, cfg.temperature, cfg.max_new_tokens, cfg.max_turns,
                         seed)


def agent_metrics(gens: list) -> dict[str, float]:
    """Per trajectory, averaged over a step's: turns (``agent/turns``), tool calls
    (``agent/tool_calls``) and failed tool calls (``agent/tool_errors``: the call was not valid
    JSON, named no tool, or the tool raised or ran out of time or memory)."""
    counts = np.array([trajectory_counts(g.turns) for g in gens], dtype=np.float64).reshape(-1, 3)
    return {"agent/turns": float(counts[:, 0].mean()), "agent/tool_calls": float(counts[:, 1].mean()),
            "agent/tool_errors": float(counts[:, 2].mean())}
