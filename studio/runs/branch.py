"""Branching: continue a stored rollout from a fork with a chosen token, in the worker.

*Branching* continues a stored rollout from a fork: the prefix before it is kept, the
token at it is forced to a chosen alternative (or drawn again, "as sampled"), and the rest
is sampled ``n`` times per choice in the worker, then scored with the reward rule. The
mean reward of a branch is a Monte Carlo estimate of the value of that choice,
Q(prefix, token) (:func:`studio.queries.forks.forks` reads them back).

Branch rollouts are ordinary rollouts with ``parent_rollout_id``, ``fork_pos`` and
``forced_token_id`` (NULL when the token was drawn again); one request is one run (kind
``branch``) and one group, so GRPO advantages compare the continuations of one fork.

A rollout of a task with tools (an agent trajectory) branches through the agent loop
(``backends.agent.branch_agent``): the turns before the fork are kept as they were (tool turns
included), the assistant turn the fork falls in continues, and the loop runs on: later calls
run the tools again. Only the policy's own tokens can be forked: a token of a tool response
(``tokens.trained`` false) is refused, saying so.
"""
from __future__ import annotations

import asyncio
import json
import os
import threading
from concurrent.futures import Executor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import pandas as pd

from backends import PolicyLoadError, Turn, check_policy_folder
from studio import queries, workers
from studio.configs import problems, setting
from studio.errors import StudioError
from studio.queries.forks import depth_of
from studio.queries.turns import turns_of
from studio.rewards import Rule, default_rule, rule_version_frame, score_frame
from studio.store import Store
from studio.store.records import generation_rows, prompt_rows
from studio.store.runs import set_status, start_run
from studio.tasks import get_task, seen_prompt
from studio.workers.sync import run_sync
from studio.workers.vocab import policy_label, resolve_policy

MAX_BRANCHES = 64  # completions per request (choices x n)
MAX_DEPTH = 6  # a branch of a branch of ... of a sampled rollout


class BranchError(StudioError, ValueError):
    """A branch request that cannot run as asked; the message says what to change."""


class NoPolicyError(BranchError):
    """The rollout has no policy to continue it with (an import with no model attached)."""


@dataclass
class BranchConfig:
    """Settings of one branch request (the fork panel's form is built from these fields:
    :mod:`studio.configs`)."""

    n: int = setting(4, "completions per chosen alternative", 1, 32)
    temperature: float = setting(1.0, "sampling temperature of the continuations (0: greedy)", 0.0, 5.0)
    top_p: float = setting(1.0, "nucleus sampling mass of the continuations", 0.01, 1.0)
    max_new_tokens: int | None = setting(None, "longest completion, prefix included; none: the parent run's "
                                               "setting (48 if it has none)", 1, 4096)
    seed: int | None = setting(None, "seed of the continuations; none draws one (recorded in the run's config)")
    max_turns: int | None = setting(None, "agent trajectories: most tool calls in a branch, the prefix's included; "
                                          "none: the parent run's setting (8 if it has none)", 1, 64)

    def validate(self, n_choices: int = 1) -> None:
        bad = problems(self)
        if n_choices < 1:
            bad.append("choose at least one alternative (or 'as sampled') to branch on")
        elif n_choices * self.n > MAX_BRANCHES:
            bad.append(f"{n_choices} choices × {self.n} completions = {n_choices * self.n} branches; "
                            f"at most {MAX_BRANCHES} per request")
        if bad:
            raise BranchError("; ".join(bad))


@dataclass
class BranchPlan:
    """Everything a branch request needs, read and checked before anything runs."""

    parent: dict
    fork_pos: int
    choices: list[int | None]
    prefix_ids: list[int]
    prefix_text: str
    policy_path: Path | str  # a folder, or a backend URL
    depth: int
    config: BranchConfig
    policy_input: str | dict = ""  # what the policy continues: the parent's exact prompt text, or its chat
    agent: bool = False  # the parent's task has tools: the branches continue the agent loop
    prefix_mask: list[bool] | None = None  # agent: the loss mask of the prefix (False on tool-response tokens)
    prefix_turns: list[Turn] | None = None  # agent: the parent's turns (those before the fork are kept)
    precision: str = "auto"  # the dtype the parent run sampled in: branches continue in it


@dataclass
class BranchResult:
    run_id: str | None
    status: str  # done | cancelled | failed
    rollouts: int = 0
    group_id: str | None = None
    rollout_ids: list[str] = field(default_factory=list)
    error: str | None = None
    device: str | None = None


def plan_branch(store: Store, rollout_id: str, fork_pos: int, choices: list[int | None],
                config: BranchConfig = BranchConfig(),  # noqa: B008  (never mutated: a change is a replace() copy)
                policy_path: str | Path | None = None) -> BranchPlan:
    """Check a branch request against the store; raise :class:`BranchError` saying what is wrong.

    ``policy_path`` overrides the policy the rollout's run names (use it to attach a policy
    to an imported rollout). Branching needs that policy's tokenizer to read the stored
    token ids as the stored text; the worker checks that before sampling.
    """
    choices = list(dict.fromkeys(choices))  # the same alternative twice is one branch
    config.validate(len(choices))
    parent = queries.rollout(store, rollout_id)
    if parent is None:
        raise BranchError(f"rollout {rollout_id} is not in this store")
    toks = store.df(f"SELECT pos, token_id, token_text, coalesce(trained, true) AS trained "
                    f"FROM {store.tokens_between(rollout_id, rollout_id)} WHERE rollout_id = ? ORDER BY pos",
                    [rollout_id])
    if toks.empty:
        raise BranchError(f"rollout {rollout_id} has no stored tokens to branch from")
    if not 0 <= fork_pos < len(toks):
        raise BranchError(f"fork position {fork_pos} is outside the rollout's {len(toks)} tokens (0-{len(toks) - 1})")
    turns = turns_of(store, rollout_id)
    if not toks["trained"].iloc[fork_pos]:
        raise BranchError(masked_fork_message(turns, fork_pos))
    task = get_task(parent["task"])
    agent = bool(getattr(task, "tools", None))
    if not agent and (turns["role"] == "tool").any():
        raise BranchError(f"rollout {rollout_id} is an agent trajectory of task {parent['task']!r}, which has no "
                          "tools to run again: branching continues the agent loop, so it needs the task whose "
                          "tools made it")
    depth = depth_of(store, rollout_id) + 1
    if depth > MAX_DEPTH:
        raise BranchError(f"this would be a branch {depth} forks deep; branches nest at most {MAX_DEPTH} deep. "
                          "Branch an earlier rollout of this tree instead")
    label = policy_path if policy_path is not None else parent.get("policy")
    try:
        folder = resolve_policy(label) if label else None
    except PolicyLoadError as exc:  # a malformed backend URL
        raise NoPolicyError(f"rollout {rollout_id} names policy {label!r}, which cannot be used: {exc}") from None
    if folder is None:
        raise NoPolicyError(
            f"rollout {rollout_id} comes from run {parent.get('run')!r}, which has no policy attached "
            "(an import of text only). Branching re-runs the policy from the fork: attach the policy "
            "folder that made these rollouts (transformers format, same tokenizer) and branch again")
    try:
        if not isinstance(folder, str):  # a backend URL is asked when the branch starts
            check_policy_folder(folder)
    except PolicyLoadError as exc:
        raise NoPolicyError(f"rollout {rollout_id} names policy {label!r}, which cannot be loaded here: {exc}. "
                            "Attach the policy folder that made it to branch") from None
    try:  # the parent run's settings: its length limits, and the precision it sampled in
        run_cfg = json.loads(store.scalar("SELECT config FROM runs WHERE run_id = "
                                          "(SELECT run_id FROM rollouts WHERE rollout_id = ?)", [rollout_id]) or "{}")
    except (TypeError, ValueError):
        run_cfg = {}
    if config.max_new_tokens is None:
        config = replace(config, max_new_tokens=max(int(run_cfg.get("max_new_tokens") or 48), len(toks)))
    if agent and config.max_turns is None:
        config = replace(config, max_turns=int(run_cfg.get("max_turns") or 8))
    if fork_pos + 1 > config.max_new_tokens:
        raise BranchError(f"the fork is at token {fork_pos} but completions stop at {config.max_new_tokens} tokens")
    if config.seed is None:
        config = replace(config, seed=int.from_bytes(os.urandom(4), "little"))
    prefix = toks.iloc[:fork_pos]
    return BranchPlan(parent=parent, fork_pos=fork_pos, choices=choices,
                      prefix_ids=[int(i) for i in prefix["token_id"]], prefix_text="".join(prefix["token_text"]),
                      policy_path=folder if isinstance(folder, str) else Path(folder).expanduser().resolve(),
                      depth=depth, config=config, policy_input=_policy_input(store, parent), agent=agent,
                      prefix_mask=[bool(m) for m in prefix["trained"]] if agent else None,
                      prefix_turns=_turn_records(turns) if agent else None,
                      precision=str(run_cfg.get("precision") or "auto"))


def masked_fork_message(turns: pd.DataFrame, fork_pos: int) -> str:
    """Why a fork at ``fork_pos``, a token the policy did not write, is refused (``turns``: the
    rollout's turns as :func:`studio.queries.turns.turns_of` reads them)."""
    at = turns[(turns["start_pos"] <= fork_pos) & (turns["end_pos"] > fork_pos)]
    if at.empty:
        where = "is not trained (masked)"
    else:
        role, idx = at["role"].iloc[0], int(at["turn_idx"].iloc[0])
        where = f"is in a tool response (turn {idx})" if role == "tool" else f"is in a {role} turn (turn {idx})"
    return (f"token {fork_pos} {where}: the policy did not write it; branch at a token of an assistant turn")


def masked_fork(store: Store, rollout_id: str, fork_pos: int) -> str | None:
    """Why ``rollout_id`` cannot be branched at ``fork_pos`` because the policy did not write that
    token (a tool response's: masked), or None when it did (the fork panel says so on a click)."""
    trained = store.scalar(f"SELECT coalesce(trained, true) FROM {store.tokens_between(rollout_id, rollout_id)} "
                           "WHERE rollout_id = ? AND pos = ?", [rollout_id, fork_pos])
    if trained is None or trained:
        return None
    return masked_fork_message(turns_of(store, rollout_id), fork_pos)


def _turn_records(turns: pd.DataFrame) -> list[Turn]:
    """The stored turns as the agent loop takes them."""
    def val(v):
        return None if pd.isna(v) else v

    return [Turn(r.role, None if pd.isna(r.start_pos) else int(r.start_pos),
                 None if pd.isna(r.end_pos) else int(r.end_pos), r.content or "", val(r.tool_name), val(r.tool_args),
                 val(r.tool_call_id), val(r.error)) for r in turns.itertuples(index=False)]


def _policy_input(store: Store, parent: dict) -> str | dict:
    """The parent's prompt as its policy read it: the stored exact text when a template made it
    (or an import brought it templated), else the task's chat for the attached policy's template."""
    seen, messages = store.cursor().execute(
        "SELECT ro.prompt_text, p.messages FROM rollouts ro JOIN prompts p USING (prompt_id) WHERE rollout_id = ?",
        [parent["rollout_id"]]).fetchall()[0]
    if seen or messages:
        return seen_prompt(seen, parent["prompt"], messages)
    return get_task(parent["task"]).policy_input(queries.prompt_of_row(parent))


def branch_frames(plan: BranchPlan, run_id: str, gens: list, rule: Rule, version: str | None) -> dict:
    """Rows of one finished branch request: one group, parent and fork recorded on each."""
    task = get_task(plan.parent["task"])
    prompt = queries.prompt_of_row(plan.parent)
    for i, g in enumerate(gens):  # one request is one group: GRPO compares the fork's continuations
        g.prompt_index, g.sample_idx = 0, i
    rollouts, tokens, turns = generation_rows(run_id, task, [prompt], gens, version)
    rollouts["parent_rollout_id"] = plan.parent["rollout_id"]
    rollouts["fork_pos"] = plan.fork_pos
    per = plan.config.n
    rollouts["forced_token_id"] = pd.array([plan.choices[i // per] for i in range(len(gens))], dtype="Int64")
    items = [(rid, prompt, g.text) for rid, g in zip(rollouts["rollout_id"], gens, strict=False)]
    rewards = score_frame(rule, task, items)
    return {"prompts": prompt_rows(task, [prompt]), "rule_versions": rule_version_frame(rule),
            "rollouts": rollouts, "tokens": tokens, "turns": turns, "rewards": rewards}


async def branch(store: Store, rollout_id: str, fork_pos: int, choices: list[int | None],
                 config: BranchConfig = BranchConfig(),  # noqa: B008  (never mutated)
                 policy_path: str | Path | None = None,
                 rule: Rule | None = None, executor: Executor | None = None,
                 cancel: threading.Event | None = None) -> BranchResult:
    """Branch ``rollout_id`` at ``fork_pos`` on every choice and store the scored tree nodes.

    Bad requests raise :class:`BranchError` before anything is written. The continuations
    are written in one transaction when the worker returns, so a cancelled or failed request
    leaves no rows (only its run, marked cancelled or failed).
    """
    plan = plan_branch(store, rollout_id, fork_pos, choices, config, policy_path)
    if isinstance(plan.policy_path, str):
        await _check_backend(plan, attached=policy_path is not None)
    task = get_task(plan.parent["task"])
    rule = rule or default_rule(task)
    executor = executor or workers.pool()
    cfg = plan.config
    run_id = start_run(store, "branch", f"branch · {rollout_id} @ {fork_pos}", policy_label(plan.policy_path),
                       task.name, {**asdict(cfg), "parent_rollout_id": rollout_id, "fork_pos": fork_pos,
                                   "choices": plan.choices, "depth": plan.depth, "precision": plan.precision},
                       parent_run_id=plan.parent["run_id"])
    result = BranchResult(run_id=run_id, status="running")
    kwargs = {"n": cfg.n, "temperature": cfg.temperature, "top_p": cfg.top_p,
              "max_new_tokens": cfg.max_new_tokens, "seed": cfg.seed, "top_k_stats": 5, "precision": plan.precision}
    try:
        if plan.agent:  # the agent loop continues from the fork: its tools run in the worker's sandbox
            fut = executor.submit(workers.agent_branch_job, str(plan.policy_path), task.spec, plan.policy_input,
                                  plan.prefix_ids, plan.prefix_text, plan.prefix_mask, plan.prefix_turns,
                                  plan.choices, {**kwargs, "max_turns": cfg.max_turns})
        else:
            fut = executor.submit(workers.branch_job, str(plan.policy_path), plan.policy_input, plan.prefix_ids,
                                  plan.prefix_text, plan.choices, kwargs)
        gens, version, result.device = await _await(fut, cancel)
        if gens is None:
            result.status = "cancelled"
        else:
            def store_branches() -> dict:  # scored and stored on a thread, as Generate stores: not on the event loop
                frames = branch_frames(plan, run_id, gens, rule, version)
                store.write(frames)
                return frames
            frames = await asyncio.to_thread(store_branches)
            result.rollouts = len(frames["rollouts"])
            result.rollout_ids = frames["rollouts"]["rollout_id"].tolist()
            result.group_id = frames["rollouts"]["group_id"].iloc[0]
            result.status = "done"
    except BrokenProcessPool:
        workers.reset_pool(executor)
        result.status, result.error = ("failed", "the sampling worker died (out of memory?); it will be restarted "
                                                 "on the next request")
    except (PolicyLoadError, workers.TokenizerMismatch) as exc:
        result.status, result.error = "failed", str(exc)
    except Exception as exc:
        result.status, result.error = "failed", f"{type(exc).__name__}: {exc}"
    finally:
        if result.status == "running":
            result.status = "cancelled"
        set_status(store, run_id, result.status)
    return result


async def _check_backend(plan: BranchPlan, attached: bool) -> None:
    """A backend URL must answer and offer the extension's forced-prefix continuation;
    otherwise raise before anything is written (:class:`NoPolicyError` when the URL came
    from the rollout's run, so another policy can be attached instead)."""
    from backends.remote import RemoteError, remote_info

    url = plan.policy_path
    try:
        info = await asyncio.to_thread(remote_info, url)
    except RemoteError as exc:
        raise BranchError(str(exc)) from None
    if not info.extension:
        msg = (f"the backend at {url} is a plain OpenAI-compatible server: branching needs the rollout-studio "
               "extension (forced-prefix continuation, 'studio.prefix'). Serve the policy with `rollout-studio "
               "backend --policy PATH`")
        raise (BranchError(msg) if attached else NoPolicyError(msg + ", or attach a policy folder and branch"))


async def _await(fut, cancel: threading.Event | None, poll_s: float = 0.05):
    """The future's result, or ``(None, None, None)`` once ``cancel`` is set (the result is dropped)."""
    wrapped = asyncio.wrap_future(fut)
    while True:
        if cancel is not None and cancel.is_set():
            fut.cancel()
            return None, None, None
        done, _ = await asyncio.wait({wrapped}, timeout=poll_s)
        if done:
            return wrapped.result()


def branch_sync(*args, **kwargs) -> BranchResult:
    """:func:`branch` from synchronous code (scripts, notebooks with a running loop)."""
    return run_sync(branch, *args, **kwargs)
