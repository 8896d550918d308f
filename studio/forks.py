"""Entropy forks: which tokens are forks, branching there, and what each branch is worth.

A *forking token* is one whose entropy is at or above the (1 - q) quantile of the token
entropies in a scope (a run, one training step of a run, or the rollouts the table filter
keeps), or above an absolute threshold in nats. With linear interpolation between order
statistics this is exactly TRL's ``top_entropy_quantile`` rule
(``GRPOTrainer.get_high_entropy_mask``: ``torch.quantile(entropies, 1 - q)`` over the
batch's completion tokens, keep ``entropy >= threshold``), where the batch is one
training step; DuckDB's ``quantile_cont`` and numpy's default ``quantile`` interpolate the
same way.

*Branching* continues a stored rollout from a fork: the prefix before it is kept, the
token at it is forced to a chosen alternative (or drawn again, "as sampled"), and the rest
is sampled ``n`` times per choice in the worker, then scored with the reward rule. The
mean reward of a branch is a Monte Carlo estimate of the value of that choice,
Q(prefix, token). A fork whose branch values differ by at least ``PIVOTAL_SPREAD`` is
*pivotal*: the choice there decides the outcome.

Branch rollouts are ordinary rollouts with ``parent_rollout_id``, ``fork_pos`` and
``forced_token_id`` (NULL when the token was drawn again); one request is one run (kind
``branch``) and one group, so GRPO advantages compare the continuations of one fork.
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

import numpy as np
import pandas as pd

from backends import PolicyLoadError, check_policy_folder

from . import queries, workers
from .generation import run_sync, set_status, start_run
from .records import generation_rows, prompt_rows
from .rewards import DEFAULT_RULES, Rule, rule_version_frame, score_frame
from .store import Store
from .tasks import get_task
from .vocab import check_policy, policy_label, resolve_policy

DEFAULT_Q = 0.2
SCOPES = {"run": "this rollout's run", "step": "this rollout's training step", "filter": "the table's filter"}
PIVOTAL_SPREAD = 0.5  # reward units between the best and worst branch of a fork
MAX_BRANCHES = 64  # completions per request (choices x n)
MAX_DEPTH = 6  # a branch of a branch of ... of a sampled rollout


# ---------------------------------------------------------------------------- fork rule

def quantile_threshold(entropies: np.ndarray, q: float = DEFAULT_Q) -> float:
    """The entropy at the (1 - q) quantile (linear interpolation, as ``torch.quantile``).

    >>> quantile_threshold(np.array([0.0, 1.0, 2.0, 3.0, 4.0]), q=0.25)
    3.0
    """
    if not 0.0 < q <= 1.0:
        raise ValueError(f"q must be in (0, 1], got {q}")
    return float(np.quantile(np.asarray(entropies, dtype=np.float64), 1.0 - q))


def fork_mask(entropies: np.ndarray, threshold: float) -> np.ndarray:
    """True for forking tokens: entropy at or above ``threshold`` (TRL keeps ``>=`` too).

    >>> fork_mask(np.array([0.1, 0.5, 0.9]), 0.5).tolist()
    [False, True, True]
    """
    return np.asarray(entropies) >= threshold


@dataclass(frozen=True)
class ForkRule:
    """Which tokens count as forks: the top ``q`` share by entropy in ``scope``, or every
    token at or above ``absolute`` nats when that is set."""

    q: float = DEFAULT_Q
    absolute: float | None = None
    scope: str = "run"

    def validate(self) -> None:
        if not 0.0 < self.q <= 1.0:
            raise ValueError(f"fork share q must be in (0, 1], got {self.q}")
        if self.absolute is not None and not (self.absolute >= 0 and np.isfinite(self.absolute)):
            raise ValueError(f"absolute entropy threshold must be a finite number of nats >= 0, got {self.absolute}")
        if self.scope not in SCOPES:
            raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {self.scope!r}")

    def describe(self) -> str:
        if self.absolute is not None:
            return f"entropy ≥ {self.absolute:.2f} nats"
        return f"top {self.q:.0%} by entropy in {SCOPES[self.scope]}"


@dataclass(frozen=True)
class Threshold:
    """The entropy a token needs to be a fork, over ``n_tokens`` tokens of the scope."""

    value: float | None
    n_tokens: int
    share: float | None  # fraction of the scope's tokens at or above it
    rule: ForkRule


def scope_condition(rule: ForkRule, rollout_id: str | None,
                    flt: queries.RolloutFilter | None = None) -> tuple[str, list]:
    """A condition on ``rollouts ro`` selecting the rollouts whose tokens set the quantile."""
    if rule.scope == "filter":
        sql, params = queries.rollout_table_sql(None, replace(flt or queries.RolloutFilter(), limit=10**9))
        return f"ro.rollout_id IN (SELECT rollout_id FROM ({sql}))", params
    if not rollout_id:
        return "TRUE", []
    run = "ro.run_id = (SELECT run_id FROM rollouts WHERE rollout_id = ?)"
    if rule.scope == "step":
        return (f"{run} AND ro.train_step IS NOT DISTINCT FROM "
                "(SELECT train_step FROM rollouts WHERE rollout_id = ?)"), [rollout_id, rollout_id]
    return run, [rollout_id]


def threshold(store: Store, rule: ForkRule = ForkRule(), rollout_id: str | None = None,
              flt: queries.RolloutFilter | None = None) -> Threshold:
    """The fork threshold of ``rule`` for the scope around ``rollout_id`` (or the filter)."""
    rule.validate()
    cond, params = scope_condition(rule, rollout_id, flt)
    q_or_abs = [rule.absolute] if rule.absolute is not None else [1.0 - rule.q]
    value_sql = "?::DOUBLE" if rule.absolute is not None else "quantile_cont(entropy, ?)"
    row = store.df(f"""
        WITH scoped AS (SELECT t.entropy FROM tokens t JOIN rollouts ro USING (rollout_id)
                        WHERE {cond} AND t.entropy IS NOT NULL),
             thr AS (SELECT {value_sql} AS value{"" if rule.absolute is not None else " FROM scoped"})
        SELECT thr.value, count(s.entropy) AS n, avg(CASE WHEN s.entropy >= thr.value THEN 1 ELSE 0 END) AS share
        FROM scoped s, thr GROUP BY thr.value""", params + q_or_abs)
    if row.empty or not row["n"].iloc[0]:
        return Threshold(rule.absolute, 0, None, rule)
    value, n, share = row.iloc[0]
    return Threshold(None if pd.isna(value) else float(value), int(n), None if pd.isna(share) else float(share), rule)


# ---------------------------------------------------------------------------- branching

class BranchError(ValueError):
    """A branch request that cannot run as asked; the message says what to change."""


class NoPolicyError(BranchError):
    """The rollout has no policy to continue it with (an import with no model attached)."""


BRANCH_BOUNDS: dict[str, tuple[float, float]] = {
    "n": (1, 32), "temperature": (0.0, 5.0), "top_p": (0.01, 1.0), "max_new_tokens": (1, 4096),
}


@dataclass
class BranchConfig:
    """Settings of one branch request (the fork panel's form is built from these fields)."""

    n: int = 4
    """Completions per chosen alternative."""
    temperature: float = 1.0
    """Sampling temperature of the continuations (0: greedy)."""
    top_p: float = 1.0
    """Nucleus sampling mass of the continuations."""
    max_new_tokens: int | None = None
    """Longest completion, prefix included; None: the parent run's setting (48 if it has none)."""
    seed: int | None = None
    """Seed of the continuations; None draws one (recorded in the run's config)."""

    def validate(self, n_choices: int = 1) -> None:
        problems = [f"{name.replace('_', ' ')} must be {lo}-{hi}, got {getattr(self, name)}"
                    for name, (lo, hi) in BRANCH_BOUNDS.items()
                    if getattr(self, name) is not None and not lo <= getattr(self, name) <= hi]
        if n_choices < 1:
            problems.append("choose at least one alternative (or 'as sampled') to branch on")
        elif n_choices * self.n > MAX_BRANCHES:
            problems.append(f"{n_choices} choices × {self.n} completions = {n_choices * self.n} branches; "
                            f"at most {MAX_BRANCHES} per request")
        if problems:
            raise BranchError("; ".join(problems))


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


@dataclass
class BranchResult:
    run_id: str | None
    status: str  # done | cancelled | failed
    rollouts: int = 0
    group_id: str | None = None
    rollout_ids: list[str] = field(default_factory=list)
    error: str | None = None
    device: str | None = None


def depth_of(store: Store, rollout_id: str) -> int:
    """How many forks separate a rollout from the sampled rollout at its tree's root."""
    return int(store.scalar("""
        WITH RECURSIVE up(rid, depth) AS (
            SELECT parent_rollout_id, 0 FROM rollouts WHERE rollout_id = ?
            UNION ALL
            SELECT ro.parent_rollout_id, up.depth + 1 FROM up JOIN rollouts ro ON ro.rollout_id = up.rid
            WHERE up.rid IS NOT NULL AND up.depth < 100)
        SELECT count(rid) FROM up""", [rollout_id]) or 0)


def plan_branch(store: Store, rollout_id: str, fork_pos: int, choices: list[int | None],
                config: BranchConfig = BranchConfig(), policy_path: str | Path | None = None) -> BranchPlan:
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
    toks = store.df(f"SELECT pos, token_id, token_text FROM {store.tokens_between(rollout_id, rollout_id)} "
                    "WHERE rollout_id = ? ORDER BY pos", [rollout_id])
    if toks.empty:
        raise BranchError(f"rollout {rollout_id} has no stored tokens to branch from")
    if not 0 <= fork_pos < len(toks):
        raise BranchError(f"fork position {fork_pos} is outside the rollout's {len(toks)} tokens (0-{len(toks) - 1})")
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
    if config.max_new_tokens is None:
        try:
            run_cfg = json.loads(store.scalar("SELECT config FROM runs WHERE run_id = "
                                              "(SELECT run_id FROM rollouts WHERE rollout_id = ?)", [rollout_id]) or "{}")
        except (TypeError, ValueError):
            run_cfg = {}
        config = replace(config, max_new_tokens=max(int(run_cfg.get("max_new_tokens") or 48), len(toks)))
    if fork_pos + 1 > config.max_new_tokens:
        raise BranchError(f"the fork is at token {fork_pos} but completions stop at {config.max_new_tokens} tokens")
    if config.seed is None:
        config = replace(config, seed=int.from_bytes(os.urandom(4), "little"))
    prefix = toks.iloc[:fork_pos]
    return BranchPlan(parent=parent, fork_pos=fork_pos, choices=choices,
                      prefix_ids=[int(i) for i in prefix["token_id"]], prefix_text="".join(prefix["token_text"]),
                      policy_path=folder if isinstance(folder, str) else Path(folder).expanduser().resolve(),
                      depth=depth, config=config)


def branch_frames(plan: BranchPlan, run_id: str, gens: list, rule: Rule, version: str | None) -> dict:
    """Rows of one finished branch request: one group, parent and fork recorded on each."""
    task = get_task(plan.parent["task"])
    prompt = queries.prompt_of_row(plan.parent)
    for i, g in enumerate(gens):  # one request is one group: GRPO compares the fork's continuations
        g.prompt_index, g.sample_idx = 0, i
    rollouts, tokens = generation_rows(run_id, task, [prompt], gens, version)
    rollouts["parent_rollout_id"] = plan.parent["rollout_id"]
    rollouts["fork_pos"] = plan.fork_pos
    per = plan.config.n
    rollouts["forced_token_id"] = pd.array([plan.choices[i // per] for i in range(len(gens))], dtype="Int64")
    rewards = score_frame(rule, task, [(rid, prompt, g.text) for rid, g in zip(rollouts["rollout_id"], gens)])
    return {"prompts": prompt_rows(task, [prompt]), "rule_versions": rule_version_frame(rule),
            "rollouts": rollouts, "tokens": tokens, "rewards": rewards}


async def branch(store: Store, rollout_id: str, fork_pos: int, choices: list[int | None],
                 config: BranchConfig = BranchConfig(), policy_path: str | Path | None = None,
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
    rule = rule or DEFAULT_RULES[task.name]
    executor = executor or workers.pool()
    cfg = plan.config
    run_id = start_run(store, "branch", f"branch · {rollout_id} @ {fork_pos}", policy_label(plan.policy_path),
                       task.name, {**asdict(cfg), "parent_rollout_id": rollout_id, "fork_pos": fork_pos,
                                   "choices": plan.choices, "depth": plan.depth},
                       parent_run_id=plan.parent["run_id"])
    result = BranchResult(run_id=run_id, status="running")
    kwargs = {"n": cfg.n, "temperature": cfg.temperature, "top_p": cfg.top_p,
              "max_new_tokens": cfg.max_new_tokens, "seed": cfg.seed, "top_k_stats": 5}
    try:
        fut = executor.submit(workers.branch_job, str(plan.policy_path), plan.parent["prompt"], plan.prefix_ids,
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
        result.status, result.error = "failed", "the sampling worker died (out of memory?); it will be restarted on the next request"
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


# ---------------------------------------------------------------------------- trees

def lineage(store: Store, rollout_id: str) -> tuple[str | None, int] | None:
    """``(parent rollout id, number of branches taken from it)`` of ``rollout_id`` in one read;
    None when it is not stored. ``(None, 0)``: its tree is itself alone (most rollouts), and
    :func:`tree` has nothing to add."""
    df = store.df("""SELECT parent_rollout_id AS parent, (SELECT count(*) FROM rollouts c WHERE c.parent_rollout_id = ?) AS n
                      FROM rollouts WHERE rollout_id = ?""", [rollout_id, rollout_id])
    if df.empty:
        return None
    parent = df["parent"].iloc[0]
    return (None if pd.isna(parent) else str(parent)), int(df["n"].iloc[0])


def tree(store: Store, rollout_id: str, rule_version_id: str | None = None) -> pd.DataFrame:
    """Every rollout of the tree ``rollout_id`` belongs to: root, branches, their branches.

    One row per rollout with ``depth`` (0 = root), parent, fork position, the token the
    branch took at the fork (``fork_token_id``/``fork_token_text``), whether it was forced,
    and its reward and accuracy under the shown rule version.
    """
    root = store.scalar("""
        WITH RECURSIVE up(rid, parent, depth) AS (
            SELECT rollout_id, parent_rollout_id, 0 FROM rollouts WHERE rollout_id = ?
            UNION ALL
            SELECT ro.rollout_id, ro.parent_rollout_id, up.depth + 1 FROM up JOIN rollouts ro ON ro.rollout_id = up.parent
            WHERE up.depth < 100)
        SELECT rid FROM up ORDER BY depth DESC LIMIT 1""", [rollout_id])
    if root is None:
        return pd.DataFrame()
    ids = store.df("""
        WITH RECURSIVE down(rid, depth) AS (
            SELECT ?::VARCHAR, 0
            UNION ALL
            SELECT ro.rollout_id, down.depth + 1 FROM down JOIN rollouts ro ON ro.parent_rollout_id = down.rid
            WHERE down.depth < 100)
        SELECT rid AS rollout_id, depth FROM down""", [root])
    id_list = ids["rollout_id"].tolist()
    # only each rollout's own reward and accuracy are read (no advantage, which would need whole groups)
    base, params = queries.scored_rollouts_sql(rule_version_id, "list_contains(?, ro.rollout_id)", [id_list])
    df = store.df(f"""
        SELECT s.rollout_id, s.group_id, s.text, s.n_tokens, s.reward, s.accuracy, s.created_at,
               ro.parent_rollout_id, ro.fork_pos, ro.forced_token_id,
               t.token_id AS fork_token_id, t.token_text AS fork_token_text
        FROM ({base}) s JOIN rollouts ro USING (rollout_id)
        LEFT JOIN tokens t ON t.rollout_id = s.rollout_id AND t.pos = ro.fork_pos
        WHERE list_contains(?, s.rollout_id)""", params + [id_list])
    df = df.merge(ids, on="rollout_id")
    return df.sort_values(["depth", "fork_pos", "created_at", "rollout_id"], na_position="first").reset_index(drop=True)


@dataclass
class Branch:
    """The continuations of one choice at one fork."""

    label: str  # the forced token's text, or "as sampled"
    token_id: int | None  # None: drawn again from the policy
    rollout_ids: list[str]
    rewards: list[float]
    correct: list[bool]
    p: float | None = None  # the policy's probability of the token at the fork (parent's view)

    @property
    def n(self) -> int:
        return len(self.rewards)

    @property
    def value(self) -> float:
        """Mean reward: the Monte Carlo estimate of the value of taking this choice."""
        return float(np.mean(self.rewards)) if self.rewards else float("nan")

    @property
    def stderr(self) -> float:
        return float(np.std(self.rewards, ddof=1) / np.sqrt(self.n)) if self.n > 1 else float("nan")

    @property
    def accuracy(self) -> float:
        return float(np.mean(self.correct)) if self.correct else float("nan")


@dataclass
class Fork:
    """All branches taken at one position of one rollout."""

    parent_rollout_id: str
    pos: int
    parent_token: str
    entropy: float | None
    branches: list[Branch]

    @property
    def spread(self) -> float:
        """Best minus worst branch value, over branches with at least two completions."""
        vals = [b.value for b in self.branches if b.n >= 2]
        return float(max(vals) - min(vals)) if len(vals) >= 2 else 0.0

    @property
    def pivotal(self) -> bool:
        return self.spread >= PIVOTAL_SPREAD


def forks(store: Store, tree_df: pd.DataFrame) -> list[Fork]:
    """The forks of a tree (from :func:`tree`), pivotal ones and larger spreads first."""
    kids = tree_df[tree_df["parent_rollout_id"].notna()]
    if kids.empty:
        return []
    parents = sorted(set(kids["parent_rollout_id"]))
    ptoks = store.df("""SELECT rollout_id, pos, token_id, token_text, entropy, topk_ids, topk_logprobs
                        FROM tokens WHERE list_contains(?, rollout_id)""", [parents])
    ptoks = {(r.rollout_id, int(r.pos)): r for r in ptoks.itertuples(index=False)}
    out = []
    for (parent, pos), part in kids.groupby(["parent_rollout_id", "fork_pos"], sort=False):
        pt = ptoks.get((parent, int(pos)))
        probs = {int(i): float(np.exp(lp)) for i, lp in zip(pt.topk_ids, pt.topk_logprobs)} if pt is not None else {}
        branches = []
        for forced, sub in part.groupby(part["forced_token_id"].astype("Int64").fillna(-1), sort=False):
            forced = None if int(forced) < 0 else int(forced)
            label = "as sampled" if forced is None else sub["fork_token_text"].iloc[0]
            branches.append(Branch(label, forced, sub["rollout_id"].tolist(), sub["reward"].astype(float).tolist(),
                                   (sub["accuracy"].fillna(0) >= 1).tolist(), probs.get(forced) if forced is not None else None))
        branches.sort(key=lambda b: (b.token_id is not None, -(b.p or 0)))
        out.append(Fork(parent, int(pos), pt.token_text if pt is not None else "?",
                        float(pt.entropy) if pt is not None and pt.entropy is not None else None, branches))
    out.sort(key=lambda f: (-f.pivotal, -f.spread, f.pos))
    return out


# ---------------------------------------------------------------------------- landscape

@dataclass
class Landscape:
    """The entropy landscape of a run: where its uncertainty sits."""

    threshold: Threshold
    hist_edges: np.ndarray
    hist_counts: np.ndarray
    by_pos: pd.DataFrame  # pos, mean_entropy, n
    by_step: pd.DataFrame  # step_idx, mean_entropy, n
    per_rollout: pd.DataFrame  # rollout_id, correct, forks, n_tokens
    n_tokens: int = 0
    mass_above: float | None = None  # share of all entropy carried by tokens at or above the threshold

    @property
    def share_above(self) -> float | None:
        return self.threshold.share


def landscape(store: Store, run_id: str, rule: ForkRule = ForkRule(), bins: int = 40) -> Landscape:
    """Histogram, mean entropy by position and by step, and forks per rollout split by
    correctness, for one run's rollouts (the quantile's scope is the run)."""
    rule = replace(rule, scope="run")
    any_rollout = store.scalar("SELECT rollout_id FROM rollouts WHERE run_id = ? LIMIT 1", [run_id])
    thr = threshold(store, rule, any_rollout) if any_rollout else Threshold(None, 0, None, rule)
    ent = store.df("""SELECT t.entropy FROM tokens t JOIN rollouts ro USING (rollout_id)
                      WHERE ro.run_id = ? AND t.entropy IS NOT NULL""", [run_id])["entropy"].to_numpy(np.float64)
    hi = max(float(ent.max()) if ent.size else 1.0, (thr.value or 0) * 1.05, 1e-3)
    counts, edges = np.histogram(ent, bins=bins, range=(0.0, hi))
    by_pos = store.df("""SELECT t.pos, avg(t.entropy) AS mean_entropy, count(*) AS n
                         FROM tokens t JOIN rollouts ro USING (rollout_id) WHERE ro.run_id = ?
                         GROUP BY t.pos ORDER BY t.pos""", [run_id])
    by_step = store.df("""SELECT t.step_idx, avg(t.entropy) AS mean_entropy, count(*) AS n
                          FROM tokens t JOIN rollouts ro USING (rollout_id)
                          WHERE ro.run_id = ? AND t.step_idx IS NOT NULL
                          GROUP BY t.step_idx ORDER BY t.step_idx""", [run_id])
    base, params = queries.scored_rollouts_sql(None, "ro.run_id = ?", [run_id])
    per = store.df(f"""
        SELECT s.rollout_id, coalesce(s.accuracy, 0) >= 1 AS correct, s.n_tokens,
               count(*) FILTER (WHERE t.entropy >= ?) AS forks
        FROM ({base}) s JOIN tokens t USING (rollout_id)
        GROUP BY s.rollout_id, s.accuracy, s.n_tokens""", [thr.value if thr.value is not None else float("inf")] + params)
    mass = (float(ent[ent >= thr.value].sum() / ent.sum())
            if thr.value is not None and ent.size and ent.sum() > 0 else None)
    return Landscape(thr, edges, counts, by_pos, by_step, per, int(ent.size), mass)


# ---------------------------------------------------------------------------- two policies

async def score_with(store: Store, policy_path: str | Path, rollout_ids: list[str],
                     executor: Executor | None = None, batch: int = 64) -> str:
    """Teacher-force the stored rollouts through another policy and keep its per-token
    logprob and entropy in ``token_scores`` (once per rollout and policy version).

    Returns the policy version. Rollouts already scored by that version are skipped.
    """
    folder, backend = await check_policy(policy_path)
    version = backend.version if backend is not None else workers.policy_version(str(folder))
    done = set(store.df("SELECT DISTINCT rollout_id FROM token_scores WHERE policy_version = ? "
                        "AND list_contains(?, rollout_id)", [version, rollout_ids])["rollout_id"])
    todo = [r for r in rollout_ids if r not in done]
    executor = executor or workers.pool()
    for lo in range(0, len(todo), batch):
        ids = todo[lo:lo + batch]
        rows = store.df("""SELECT ro.rollout_id, p.text AS prompt, list(t.token_id ORDER BY t.pos) AS token_ids
                           FROM rollouts ro JOIN prompts p USING (prompt_id) JOIN tokens t USING (rollout_id)
                           WHERE list_contains(?, ro.rollout_id) GROUP BY ro.rollout_id, p.text""", [ids])
        fut = executor.submit(workers.score_job, str(folder), rows["prompt"].tolist(),
                              [[int(i) for i in x] for x in rows["token_ids"]])
        gens, _, _ = await asyncio.wrap_future(fut)
        frame = pd.DataFrame({
            "rollout_id": np.repeat(rows["rollout_id"].to_numpy(), [g.n_tokens for g in gens]),
            "pos": np.concatenate([np.arange(g.n_tokens) for g in gens]) if gens else [],
            "policy_version": version,
            "logprob": np.concatenate([g.logprobs for g in gens]) if gens else [],
            "entropy": np.concatenate([g.entropies for g in gens]) if gens else [],
        })
        store.write({"token_scores": frame})
    return version


def score_with_sync(*args, **kwargs) -> str:
    """:func:`score_with` from synchronous code."""
    return run_sync(score_with, *args, **kwargs)


def entropy_changes(store: Store, policy_version: str, rollout_ids: list[str] | None = None,
                    run_id: str | None = None, limit: int = 50) -> pd.DataFrame:
    """Tokens whose entropy moved most between the stored policy (A) and ``policy_version`` (B).

    One row per token with ``entropy_a``, ``entropy_b``, ``delta`` = B - A, the token and a
    little context before it; largest ``|delta|`` first.
    """
    cond, params = ("list_contains(?, t.rollout_id)", [rollout_ids]) if rollout_ids is not None else (
        "t.rollout_id IN (SELECT rollout_id FROM rollouts WHERE run_id = ?)", [run_id])
    return store.df(f"""
        WITH j AS (
            SELECT t.rollout_id, t.pos, t.token_text, t.entropy AS entropy_a, s.entropy AS entropy_b,
                   s.entropy - t.entropy AS delta, t.logprob AS logprob_a, s.logprob AS logprob_b,
                   string_agg(t.token_text, '') OVER (PARTITION BY t.rollout_id ORDER BY t.pos
                        ROWS BETWEEN 12 PRECEDING AND 1 PRECEDING) AS context
            FROM tokens t JOIN token_scores s ON s.rollout_id = t.rollout_id AND s.pos = t.pos
            WHERE s.policy_version = ? AND {cond})
        SELECT * FROM j ORDER BY abs(delta) DESC, rollout_id, pos LIMIT ?""", [policy_version] + params + [int(limit)])


def scored_versions(store: Store) -> list[str]:
    """Policy versions that have re-scored stored rollouts (critics, which store values and
    no log-probs, are not policies)."""
    return [r[0] for r in store.cursor().execute(
        "SELECT policy_version FROM token_scores GROUP BY 1 HAVING count(logprob) > 0 ORDER BY 1").fetchall()]
