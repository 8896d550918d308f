"""Generate: sample a policy on prompts in a worker, score, and store, chunk by chunk.

The owner process (server or CLI) calls :func:`generate`; sampling runs in the worker
pool, and each finished chunk is scored and written in one transaction, so progress is
visible and a crash or cancel loses at most the chunk in flight (never half of one).
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from pathlib import Path

from backends import PolicyLoadError
from backends.device import PRECISIONS
from studio import workers
from studio.configs import problems, setting
from studio.errors import StudioError
from studio.rewards import Rule, default_rule, rule_version_frame, score_frame
from studio.store import Store
from studio.store.records import generation_rows, prompt_rows
from studio.store.runs import set_status, start_run
from studio.tasks import Prompt, Task, TaskParseError, get_task
from studio.workers.sync import run_sync
from studio.workers.vocab import check_policy, policy_label


class ConfigError(StudioError, ValueError):
    """Generate settings out of range; the message names each one."""


# field -> (lowest, highest) allowed; the Generate form takes its bounds from here
@dataclass
class GenerateConfig:
    """Sampling settings of one Generate run (the form and ``rollout-studio generate`` are
    generated from these fields: :mod:`studio.configs`)."""

    group_size: int = setting(8, "completions sampled per prompt: one GRPO group", 1, 64)
    temperature: float = setting(1.0, "sampling temperature; 0 is greedy (statistics always describe the policy "
                                      "at temperature 1)", 0.0, 5.0)
    top_p: float = setting(1.0, "nucleus sampling mass; 1.0 samples from the full distribution", 0.01, 1.0)
    max_new_tokens: int = setting(48, "longest completion, in tokens", 1, 4096)
    seed: int = setting(0, "seed of the sampler; the same seed, prompts and policy give the same rollouts")
    top_k_stats: int = setting(5, "most likely alternatives recorded per token (shown in the hover card)", 1, 20)
    max_turns: int = setting(8, "tasks with tools: tool calls a trajectory may make (a call past them ends it, "
                                "'turns'); tool responses count in max_new_tokens", 0, 64)
    precision: str = setting("auto", "dtype the policy's weights are loaded in to sample (auto: float32 on a CPU, "
                                     "the checkpoint's own on a GPU); a backend samples in its own", choices=PRECISIONS)

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming every setting outside its bounds."""
        bad = problems(self)
        if bad:
            raise ConfigError("; ".join(bad))


@dataclass
class GenerateResult:
    run_id: str
    status: str  # done | cancelled | failed
    rollouts: int = 0
    error: str | None = None
    device: str | None = None
    group_ids: list[str] = field(default_factory=list)


def parse_prompts(task: Task, texts: list[str | Prompt]) -> list[Prompt]:
    """Read typed prompts (drawn ones, :class:`Prompt`, are taken as they are); every
    unreadable line is named in one error."""
    prompts, bad = [], []
    for i, text in enumerate(t for t in texts if isinstance(t, Prompt) or t.strip()):
        if isinstance(text, Prompt):
            prompts.append(text)
            continue
        try:
            prompts.append(task.parse_prompt(text))
        except TaskParseError as exc:
            bad.append(f"prompt {i + 1}: {exc}")
    if bad:
        raise TaskParseError("; ".join(bad))
    if not prompts:
        example = "like 'Q: 23+48-7='" if task.name == "arithmetic" else "or draw them from a split of the task"
        raise TaskParseError(f"no prompts given: pick sample prompts or type one per line, {example}")
    return prompts


def ingest(store: Store, run_id: str, task: Task, prompts: list[Prompt], gens: list, rule: Rule,
           policy_version: str | None) -> tuple[int, list[str]]:
    """Score ``gens`` and write prompts, rollouts, tokens and rewards in one transaction."""
    rollouts, tokens, turns = generation_rows(run_id, task, prompts, gens, policy_version)
    items = [(rid, prompts[g.prompt_index], g.text) for rid, g in zip(rollouts["rollout_id"], gens, strict=False)]
    rewards = score_frame(rule, task, items)
    store.write({"prompts": prompt_rows(task, prompts), "rule_versions": rule_version_frame(rule),
                 "rollouts": rollouts, "tokens": tokens, "turns": turns, "rewards": rewards})
    return len(rollouts), list(dict.fromkeys(rollouts["group_id"]))


async def generate(store: Store, policy_path: str | Path, prompt_texts: list[str | Prompt],
                   config: GenerateConfig = GenerateConfig(), task: str = "arithmetic",  # noqa: B008  (never mutated)
                   rule: Rule | None = None, executor: Executor | None = None,
                   on_progress: Callable[[int, int, str], None] | None = None,
                   cancel: threading.Event | None = None, chunk_prompts: int = 4,
                   name: str | None = None) -> GenerateResult:
    """Sample ``config.group_size`` completions for each prompt and store them.

    On a task with tools (``calculator_agent``) each completion is an agent trajectory
    (``backends.agent``): the worker runs the loop, the tools in its sandbox
    (``studio.workers.tools``), and the trajectories' turns and loss masks are stored with them.

    ``policy_path`` is a folder or a backend URL (``backends.remote``). Bad input
    (unparsable prompt, missing policy folder, a backend that does not answer, invalid
    settings) raises before anything is written. ``on_progress(done, total, message)`` is
    called after every chunk. A prompt is typed text (read by ``task``) or a :class:`Prompt`
    drawn from the store (``studio.queries.prompts.draw_prompts``); a chat prompt is rendered
    with the policy's chat template in the worker. A backend without the studio's extension gives entropies
    estimated from top-k logprobs: the run's config (``backend.entropy``), its default name
    and every rollout's policy version say so.
    """
    config.validate()
    the_task = get_task(task)
    prompts = parse_prompts(the_task, prompt_texts)
    policy_path, backend = await check_policy(policy_path)
    rule = rule or default_rule(the_task)
    executor = executor or workers.pool()
    run_config = asdict(config) | ({"backend": backend.describe()} if backend is not None else {})
    estimated = " · entropy estimated" if backend is not None and not backend.extension else ""
    run_id = start_run(store, "generate", name or f"generate · {len(prompts)} prompts × {config.group_size}{estimated}",
                       policy_label(policy_path), the_task.name, run_config)
    result = GenerateResult(run_id=run_id, status="running")
    chunks = [prompts[i:i + chunk_prompts] for i in range(0, len(prompts), chunk_prompts)]
    total = len(prompts) * config.group_size
    agent = bool(getattr(the_task, "tools", None))  # a task with tools: agent trajectories
    kwargs = {k: v for k, v in asdict(config).items() if k not in ("group_size", "max_turns")}
    kwargs["n"] = config.group_size
    if agent:
        kwargs["max_turns"] = config.max_turns
    try:
        for i, chunk in enumerate(chunks):
            if cancel is not None and cancel.is_set():
                result.status = "cancelled"
                break
            kw = dict(kwargs, seed=config.seed + 7919 * i)  # distinct, reproducible stream per chunk
            inputs = [the_task.policy_input(p) for p in chunk]
            fut = (executor.submit(workers.agent_job, str(policy_path), the_task.spec, inputs, kw) if agent
                   else executor.submit(workers.sample_job, str(policy_path), inputs, kw))
            gens, version, result.device = await asyncio.wrap_future(fut)
            # scored and stored on a thread: the event loop (a served page's clicks) is not held by the write
            n, gids = await asyncio.to_thread(ingest, store, run_id, the_task, chunk, gens, rule, version)
            result.rollouts += n
            result.group_ids += gids
            if on_progress:
                on_progress(result.rollouts, total, f"{result.rollouts}/{total} rollouts stored")
        else:
            result.status = "done"
    except BrokenProcessPool:
        workers.reset_pool(executor)
        result.status, result.error = ("failed", "the sampling worker died (out of memory?); it will be restarted "
                                                 "on the next run")
    except PolicyLoadError as exc:
        result.status, result.error = "failed", str(exc)
    except Exception as exc:
        result.status, result.error = "failed", f"{type(exc).__name__}: {exc}"
    finally:
        if result.status == "running":  # cancelled from outside (task cancellation, shutdown)
            result.status = "cancelled"
        set_status(store, run_id, result.status)
    return result


def generate_sync(*args, **kwargs) -> GenerateResult:
    """:func:`generate` from synchronous code (see :func:`run_sync`)."""
    return run_sync(generate, *args, **kwargs)
