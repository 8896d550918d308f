"""Editable reward rules as stored versions: apply a rule's source, extend a version, diff two.

A rule is Python source defining ``reward(prompt, completion, gold, steps, **ctx)`` (and
optionally ``step_reward`` and, for agent trajectories, ``turn_reward``); see :mod:`studio.rewards.rewardlib` for the signature and the
built-in library. :func:`apply_rule` re-scores every rollout in a scope in the sandbox's
worker processes (:mod:`studio.rewards.sandbox`) and writes the version and all its rewards in one
transaction at the end: a version is stored whole or not at all, and nothing earlier is
overwritten. Its id is ``name@`` + the first 10 hex digits of the hash of the normalised
source, so the same rule applied twice is one version. A version is extended to new
rollouts with the very rule (or reward model, :mod:`studio.rewards.reward_models`) that made
it, and two versions are diffed rollout by rollout; the reward-hacking signals over versions
are :mod:`studio.rewards.diagnostics`.
"""
from __future__ import annotations

import ast
import asyncio
import hashlib
import importlib
import inspect
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from studio import queries
from studio.rewards import sandbox
from studio.rewards.sandbox import Limits, RuleSourceError, SandboxError, check_source, source_sha
from studio.signals.advantages import EQUAL_TOL, Credit
from studio.store import Store
from studio.store.records import now
from studio.tasks import get_task
from studio.workers.sync import run_sync

DEFAULT_SOURCE = '''"""The sample task's default reward: final answer, format and per-step arithmetic."""
from studio.rewardlib import answer_correct, format_ok, steps_correct, weighted


def reward(prompt, completion, gold, steps, **ctx):
    parts = {
        "accuracy": answer_correct(ctx["parsed"], gold, ctx["task"]),
        "format": format_ok(ctx["parsed"]),
        "steps": steps_correct(steps),
    }
    parts["total"] = weighted(parts, {"accuracy": 1.0, "format": 0.1, "steps": 0.25})
    return parts
'''

FREE_TEXT_SOURCE = '''"""A free-text task's default reward: the final answer verified with math-verify, and the format."""
from studio.rewardlib import format_ok, math_match, weighted


def reward(prompt, completion, gold, steps, **ctx):
    parts = {
        "accuracy": math_match(ctx["parsed"].answer, gold.get("answer")),
        "format": format_ok(ctx["parsed"]),
    }
    parts["total"] = weighted(parts, {"accuracy": 1.0, "format": 0.1})
    return parts
'''


def default_source(task: str) -> str:
    """The rule editor's starting rule for ``task``: the arithmetic rule, or the free-text one."""
    return DEFAULT_SOURCE if task == "arithmetic" else FREE_TEXT_SOURCE


DEFAULT_LIMITS = Limits()
"""The sandbox's limits when an apply names none."""


def load_source(spec: str) -> str:
    """A rule's source from a ``.py`` file path or a dotted ``package.module`` path (the
    module's whole source: it must define ``reward``)."""
    if spec.endswith(".py"):
        try:
            path = Path(spec).expanduser()
        except RuntimeError as exc:  # "~user/..." for a user that does not exist
            raise FileNotFoundError(f"rule file {spec}: {exc}") from None
        if not path.is_file():
            raise FileNotFoundError(f"rule file {spec} does not exist")
        return path.read_text()
    if not spec or not all(part.isidentifier() for part in spec.split(".")):
        raise ValueError(f"{spec[:200]!r} is not a rule: give its source (defining `def reward(prompt, completion, "
                         "gold, steps, **ctx)`), a .py file or a dotted module path like my_rules.short")
    try:
        module = importlib.import_module(spec)
    except ImportError as exc:
        raise ValueError(f"cannot import rule module {spec!r}: {exc}") from None
    if not callable(getattr(module, "reward", None)):
        raise ValueError(f"module {spec} defines no reward function")
    return inspect.getsource(module)


def version_id(name: str, source: str, sources: dict[str, str] | None = None) -> str:
    """``name@`` + 10 hex digits of the normalised source's hash (and of the other
    versions it reads, when it reads any)."""
    sha = source_sha(source)
    if sources:
        sha = hashlib.sha256(f"{sha}\n{json.dumps(sources, sort_keys=True)}".encode()).hexdigest()
    return f"{name}@{sha[:10]}"


@dataclass
class ApplyResult:
    rule_version_id: str
    status: str  # done | cancelled | failed | unchanged
    scored: int = 0
    failed: int = 0
    errors: list[tuple[str, str]] = field(default_factory=list)  # the first few (rollout_id, message)
    seconds: float = 0.0
    message: str | None = None


def _scope_rows(store: Store, vid: str, flt: queries.RolloutFilter | None) -> pd.DataFrame:
    """Rollouts of the scope not yet scored by version ``vid``."""
    if flt is None:
        cond, params = "TRUE", []
    else:
        sql, params = queries.rollout_table_sql(None, replace(flt, limit=10**9))
        cond = f"ro.rollout_id IN (SELECT rollout_id FROM ({sql}))"
    return store.df(f"""
        SELECT ro.rollout_id, p.text AS prompt, p.gold, p.task, ro.text AS completion
        FROM rollouts ro JOIN prompts p USING (prompt_id)
        WHERE {cond} AND ro.rollout_id NOT IN
              (SELECT rollout_id FROM rewards WHERE rule_version_id = ? AND component = 'total')
        ORDER BY ro.rollout_id""", params + [vid])


async def apply_rule(store: Store, source: str, name: str, note: str = "",
                     scope: queries.RolloutFilter | None = None, limits: Limits = DEFAULT_LIMITS,
                     on_progress: Callable[[int, int], None] | None = None,
                     cancel: threading.Event | None = None, chunk: int = 500,
                     sources: dict[str, str] | None = None) -> ApplyResult:
    """Score every rollout in ``scope`` (all when None) with ``source`` and store the version.

    ``sources`` maps a name to another version id (a reward model's, or a rule's): the
    rule reads that version's reward of the rollout as ``ctx[name]`` (None where it has
    none). They are part of the version: the same source over other inputs is another one.

    A ``step_reward`` writes ``step_rewards`` and a ``turn_reward`` writes ``turn_rewards`` (one
    row per assistant turn of each trajectory in scope), both under the version's id.

    Raises :class:`RuleSourceError` for source that cannot run (nothing is written).
    Per-rollout failures are stored as a NULL ``total`` with the message and counted in the
    result. A spent budget, a killed worker or a cancel stores nothing.
    """
    problems = source_problems(source)
    if problems:
        raise RuleSourceError(problems)
    name = (name or "rule").strip().replace("@", "_")
    sources = dict(sorted((sources or {}).items()))
    bad = [k for k in sources if not k.isidentifier()]
    if bad:
        raise RuleSourceError([sandbox.SourceProblem(1, 0, f"context names must be identifiers, got {bad}")])
    vid = version_id(name, source, sources)
    t0 = time.perf_counter()
    rows = _scope_rows(store, vid, scope)
    if rows.empty:
        return ApplyResult(vid, "unchanged", message="every rollout in scope is already scored by this version")
    sha = source_sha(source)
    for key, other in sources.items():  # each rollout's reward under the other source, for ctx[key]
        vals = store.df("SELECT rollout_id, value FROM rewards WHERE rule_version_id = ? AND component = 'total'",
                        [other])
        rows[key] = rows["rollout_id"].map(dict(zip(vals["rollout_id"], vals["value"], strict=True)))
    cols = ["rollout_id", "prompt", "gold", "completion", *sources]
    ex = sandbox.pool(limits)
    loop = asyncio.get_running_loop()
    futures = []
    result = ApplyResult(vid, "running")
    rewards, steps, turn_rows = [], [], []
    trajectories = _turns_of(store, rows["rollout_id"].tolist())
    done = 0
    try:
        # submitting is inside the try: a worker the first chunk kills breaks the pool before the
        # last chunk is submitted, and a broken pool must be dropped, not kept for the next apply
        for task_name, part in rows.groupby("task", sort=False):
            task_spec = get_task(task_name).spec  # a task the store defines is rebuilt in the worker from it
            recs = [(*r[:4], {k: (None if v != v else v) for k, v in zip(sources, r[4:], strict=True)})
                    for r in part[cols].itertuples(index=False, name=None)]
            for lo in range(0, len(recs), chunk):
                part_turns = {r[0]: trajectories[r[0]] for r in recs[lo:lo + chunk] if r[0] in trajectories}
                futures.append((len(recs[lo:lo + chunk]), ex.submit(sandbox.score_chunk, source, sha, task_spec,
                                                                     recs[lo:lo + chunk], limits.call_s,
                                                                     part_turns)))
        for n, fut in futures:
            waited = asyncio.wrap_future(fut, loop=loop)  # wrapped once: a wrapper left behind logs its error
            waited.add_done_callback(_retrieved)
            while True:
                remaining = limits.budget_s - (time.perf_counter() - t0)
                if remaining <= 0:
                    raise SandboxError(f"the rule used up its {limits.budget_s:g} s budget after {done} of "
                                       f"{len(rows)} rollouts; nothing was stored")
                if cancel is not None and cancel.is_set():
                    raise asyncio.CancelledError
                finished, _ = await asyncio.wait({waited}, timeout=min(0.1, remaining))
                if finished:
                    break
            out, st, errs, tr = fut.result()
            out = [(rid, comp, value, _clip(err)) for rid, comp, value, err in out]
            errs = [(rid, _clip(msg)) for rid, msg in errs]
            rewards.extend(out)
            steps.extend(st)
            turn_rows.extend(tr)
            result.failed += len(errs)
            if len(result.errors) < 5:
                result.errors.extend(errs[:5 - len(result.errors)])
            done += n
            if on_progress:
                on_progress(done, len(rows))
    except asyncio.CancelledError:
        sandbox.kill_pool(limits)
        result.status, result.message = "cancelled", "cancelled: nothing was stored"
        return result
    except SandboxError as exc:
        sandbox.kill_pool(limits)
        result.status, result.message = "failed", str(exc)
        return result
    except BrokenProcessPool:
        sandbox.kill_pool(limits)
        result.status, result.message = "failed", ("a rule worker died (killed by the system, or the rule "
                                                   "crashed the interpreter); nothing was stored")
        return result
    stored = source + (f"{SOURCES_MARK}{sources}" if sources else "")
    _write_version(store, vid, name, stored, note, rewards, steps, turn_rows)
    result.status, result.scored = "done", len(rows)
    result.seconds = time.perf_counter() - t0
    return result


MAX_ERROR_CHARS = 2000
"""Longest per-rollout error message stored (a rule can raise with a message of any size)."""


def _clip(msg: str | None) -> str | None:
    if msg is None or len(msg) <= MAX_ERROR_CHARS:
        return msg
    return f"{msg[:MAX_ERROR_CHARS]}… ({len(msg) - MAX_ERROR_CHARS:,} more characters)"


def _retrieved(fut: asyncio.Future) -> None:
    """Mark a wrapped worker future's outcome as seen (a killed pool fails the futures left;
    asyncio would log each as 'Future exception was never retrieved')."""
    if not fut.cancelled():
        fut.exception()


def source_problems(source: str) -> list[sandbox.SourceProblem]:
    """What *Check* and :func:`apply_rule` find wrong with a rule's source without running it:
    :func:`check_source`'s problems, and what only compiling finds (``return`` outside a
    function, a duplicate argument, an unknown ``__future__`` feature...): compiling runs
    nothing. A rule nested too deeply for the parser is a problem too, not a MemoryError."""
    try:
        problems = check_source(source)
        if not problems:
            compile(source, sandbox.RULE_FILENAME, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return [sandbox.SourceProblem(exc.lineno or 1, max(0, (exc.offset or 1) - 1), exc.msg)]
    except (MemoryError, RecursionError, ValueError):
        return [sandbox.SourceProblem(1, 0, "the source is nested too deeply (or is too large) to parse")]
    return problems


def _turns_of(store: Store, rollout_ids: list[str]) -> dict[str, list[tuple]]:
    """The stored turns of the rollouts that are agent trajectories, as :func:`sandbox.rule_turns` reads
    them: ``{rollout_id: [(turn_idx, role, content, tool_name, tool_args, error), ...]}``."""
    if not store.scalar("SELECT EXISTS (SELECT 1 FROM turns)"):  # a store of single answers: nothing to send
        return {}
    rows = store.df("""SELECT rollout_id, turn_idx, role, content, tool_name, tool_args, error FROM turns
                       WHERE rollout_id IN (SELECT unnest(?::VARCHAR[])) ORDER BY rollout_id, turn_idx""",
                    [rollout_ids])
    out: dict[str, list[tuple]] = {}
    for rid, *turn in rows.astype(object).where(rows.notna(), None).itertuples(index=False, name=None):
        out.setdefault(rid, []).append(tuple(turn))
    return out


def _write_version(store: Store, vid: str, name: str, source: str, note: str, rewards: list, steps: list,
                   turns: list = ()) -> None:
    """The version row, its rewards, step rewards and turn rewards: one transaction."""
    rw = pd.DataFrame(rewards, columns=["rollout_id", "component", "value", "error"])
    rw.insert(1, "rule_version_id", vid)
    rw["value"] = rw["value"].astype("float64")
    version = pd.DataFrame([{"rule_version_id": vid, "name": name, "source": source, "sha256": source_sha(source),
                             "created_at": now(), "note": note}])
    sr = pd.DataFrame(steps, columns=["rollout_id", "step_idx", "value"])
    with store.transaction() as cur:
        store.write({"rule_versions": version, "rewards": rw}, cur=cur)
        if len(sr):
            cur.register("new_steps", sr)
            cur.execute("""
                INSERT INTO step_rewards
                SELECT s.rollout_id, s.step_idx, min(t.pos), max(t.pos), ?, s.value
                FROM new_steps s LEFT JOIN tokens t ON t.rollout_id = s.rollout_id AND t.step_idx = s.step_idx
                GROUP BY s.rollout_id, s.step_idx, s.value""", [vid])
            cur.unregister("new_steps")
        if turns:
            tr = pd.DataFrame(turns, columns=["rollout_id", "turn_idx", "value"])
            tr.insert(2, "source", vid)
            store.write({"turn_rewards": tr}, cur=cur)


def apply_rule_sync(*args, **kwargs) -> ApplyResult:
    """:func:`apply_rule` from synchronous code (scripts, notebooks with a running loop)."""
    return run_sync(apply_rule, *args, **kwargs)


# ---------------------------------------------------------------------------- versions and diffs

def versions(store: Store) -> pd.DataFrame:
    """Every stored rule version, newest first, with how many rollouts it scored."""
    return store.df("""
        SELECT v.rule_version_id, v.name, v.note, v.created_at,
               count(r.rollout_id) AS rollouts, count(r.rollout_id) FILTER (WHERE r.value IS NULL) AS failed
        FROM rule_versions v LEFT JOIN rewards r ON r.rule_version_id = v.rule_version_id AND r.component = 'total'
        GROUP BY ALL ORDER BY v.created_at DESC, v.rule_version_id""")


def source_of(store: Store, vid: str) -> str | None:
    return store.scalar("SELECT source FROM rule_versions WHERE rule_version_id = ?", [vid])


SOURCES_MARK = "\n# sources "


def active_version(store: Store, picked: str = "", task: str | None = None) -> str | None:
    """The version new rollouts should also be scored with: the one ``picked`` in a view,
    else the most recently applied rule or reward-model version (None when only built-in
    rules have scored anything: Generate and Branch score with those already); with ``task``,
    the most recent that scored rollouts of that task (a rule written for word problems does not
    score arithmetic). Imported scores are what a training run logged and cannot score new
    rollouts: they are never the active version unless picked."""
    if picked:
        return picked
    of_task = "" if task is None else """AND EXISTS (
            SELECT 1 FROM rewards rw JOIN rollouts ro USING (rollout_id) JOIN prompts p USING (prompt_id)
            WHERE rw.rule_version_id = v.rule_version_id AND rw.component = 'total' AND p.task = ?)"""
    return store.scalar(f"""
        SELECT rule_version_id FROM rule_versions v
        WHERE source NOT LIKE '# rule %' AND source NOT LIKE '# import %' {of_task}
        ORDER BY created_at DESC, rule_version_id LIMIT 1""", [] if task is None else [task])


async def score_new_run(store: Store, run_id: str, picked: str = "") -> str:
    """After Generate or Branch stored run ``run_id``: score it with the :func:`active_version`
    too, so the views that show that version show the new rollouts. Returns a line for the
    user ('' when there was nothing to do); never raises for a rule's failures."""
    vid = active_version(store, picked, store.scalar("SELECT task FROM runs WHERE run_id = ?", [run_id]))
    if not vid:
        return ""
    try:
        res = await extend_version(store, vid, queries.RolloutFilter(run_id=run_id))
    except (RuleSourceError, FileNotFoundError, OSError, ValueError) as exc:
        return f"not scored with {vid}: {exc}"
    if res.status == "done":
        return f"also scored with {vid}" + (f" ({res.failed} failed)" if res.failed else "")
    return "" if res.status == "unchanged" else f"not scored with {vid}: {res.message}"


async def extend_version(store: Store, vid: str, scope: queries.RolloutFilter, limits: Limits = DEFAULT_LIMITS,
                         cancel: threading.Event | None = None) -> ApplyResult:
    """Score the rollouts of ``scope`` that version ``vid`` has not scored yet, with the
    very rule (or reward model) that made it, so new rollouts join the version a view shows.

    A built-in rule's version is rebuilt from :data:`studio.rewards.builtin.DEFAULT_RULES` when it is
    the current one (older built-in versions cannot be re-run: status ``failed``, says so).
    """
    row = store.df("SELECT name, source FROM rule_versions WHERE rule_version_id = ?", [vid])
    if row.empty:
        return ApplyResult(vid, "failed", message=f"no rule version {vid!r} in this store")
    name, source = row["name"][0], row["source"][0]
    if source.startswith("# reward model "):
        folder = source.splitlines()[0].removeprefix("# reward model ").strip()
        from studio.rewards.reward_models import score_with_reward_model

        res = await score_with_reward_model(store, folder, scope=scope)
    elif source.startswith("# import "):
        return ApplyResult(vid, "unchanged", message=f"{vid} holds the scores a training run logged; new rollouts "
                                                     "are scored by the rules and reward models of the store")
    elif source.startswith("# rule "):
        from studio.rewards.builtin import DEFAULT_RULES

        if not any(r.version_id == vid for r in DEFAULT_RULES.values()):
            return ApplyResult(vid, "failed",
                               message=f"{vid} is an older built-in rule; apply it as a rule to extend it")
        return ApplyResult(vid, "unchanged", message="built-in rules score every new rollout already")
    else:
        sources = {}
        head, _, tail = source.rpartition(SOURCES_MARK)
        if head:
            try:
                sources, source = ast.literal_eval(tail.strip()), head
            except (ValueError, SyntaxError):  # the rule's own comment, not the stored mark
                sources = {}
        res = await apply_rule(store, source, name, scope=scope, limits=limits, cancel=cancel, sources=sources)
    if res.rule_version_id != vid:  # the folder's weights changed since: say so rather than mix versions
        res.status, res.message = "failed", (f"{vid} cannot be extended: the reward model's weights changed, so "
                                             f"the new scores are version {res.rule_version_id}")
    return res


@dataclass
class Diff:
    """Two rule versions over the same rollouts (the views over it: :mod:`studio.rewards.diff_views`)."""

    a: str
    b: str
    rows: pd.DataFrame  # rollout_id, prompt, completion, group_id, reward_a/b, advantage_a/b, delta, changed, sign_flip
    groups: pd.DataFrame  # group_id, prompt, all_equal_a, all_equal_b
    components: pd.DataFrame  # rollout_id, component, value_a, value_b (NaN: that version has no such component)
    estimator: str = "grpo"  # whose advantages ``sign_flip`` compares

    @property
    def changed(self) -> pd.DataFrame:
        return self.rows[self.rows["changed"]]

    @property
    def sign_flips(self) -> pd.DataFrame:
        return self.rows[self.rows["sign_flip"]]

    @property
    def became_all_equal(self) -> pd.DataFrame:
        return self.groups[~self.groups["all_equal_a"] & self.groups["all_equal_b"]]

    @property
    def stopped_all_equal(self) -> pd.DataFrame:
        return self.groups[self.groups["all_equal_a"] & ~self.groups["all_equal_b"]]


def diff(store: Store, a: str, b: str, scope: queries.RolloutFilter | None = None, tol: float = 1e-9,
         credit: Credit | None = None) -> Diff:
    """Rollouts scored by both versions: rewards, advantages (``credit``'s estimator, GRPO when
    None), which changed, which flipped the sign of their advantage, groups that became (or
    stopped being) all-equal, and every component's value under each version."""
    cond, params = "TRUE", []
    if scope is not None and scope.run_id:
        cond, params = "ro.run_id = ?", [scope.run_id]
    sa, pa = queries.scored_rollouts_sql(a, cond, params, credit=credit)
    sb, pb = queries.scored_rollouts_sql(b, cond, params, credit=credit)
    df = store.df(f"""
        SELECT x.rollout_id, p.text AS prompt, x.text AS completion, x.group_id, x.n_tokens,
               x.reward AS reward_a, y.reward AS reward_b, x.advantage AS advantage_a, y.advantage AS advantage_b
        FROM ({sa}) x JOIN ({sb}) y USING (rollout_id) JOIN prompts p ON p.prompt_id = x.prompt_id
        WHERE x.reward IS NOT NULL AND y.reward IS NOT NULL
        ORDER BY abs(y.reward - x.reward) DESC, x.rollout_id""", pa + pb)
    df["delta"] = df["reward_b"] - df["reward_a"]
    df["changed"] = df["delta"].abs() > tol
    df["sign_flip"] = _sign(df["advantage_a"], tol) != _sign(df["advantage_b"], tol)
    g = df.groupby("group_id").agg(prompt=("prompt", "first"), a_lo=("reward_a", "min"), a_hi=("reward_a", "max"),
                                   b_lo=("reward_b", "min"), b_hi=("reward_b", "max")).reset_index()
    g["all_equal_a"] = (g["a_hi"] - g["a_lo"]) <= EQUAL_TOL
    g["all_equal_b"] = (g["b_hi"] - g["b_lo"]) <= EQUAL_TOL
    comps = store.df("""
        SELECT rollout_id, component, max(value) FILTER (WHERE rule_version_id = ?) AS value_a,
               max(value) FILTER (WHERE rule_version_id = ?) AS value_b
        FROM rewards WHERE rule_version_id IN (?, ?) AND component <> 'total'
        GROUP BY rollout_id, component ORDER BY component, rollout_id""", [a, b, a, b])
    comps = comps[comps["rollout_id"].isin(df["rollout_id"])].reset_index(drop=True)
    return Diff(a, b, df, g[["group_id", "prompt", "all_equal_a", "all_equal_b"]], comps,
                (credit or Credit()).estimator)


def _sign(advantage: pd.Series, tol: float) -> np.ndarray:
    """-1, 0 or 1 per advantage; a missing one (a token estimator without its inputs) and one
    within ``tol`` of zero count as 0."""
    x = advantage.astype("float64").fillna(0.0).to_numpy()
    return np.where(np.abs(x) <= tol, 0.0, np.sign(x))


def overlap(store: Store, a: str, b: str) -> int:
    """How many rollouts versions ``a`` and ``b`` both scored (a ``total`` that is not NULL)."""
    return int(store.scalar("""
        SELECT count(*) FROM rewards x JOIN rewards y USING (rollout_id)
        WHERE x.rule_version_id = ? AND x.component = 'total' AND x.value IS NOT NULL
          AND y.rule_version_id = ? AND y.component = 'total' AND y.value IS NOT NULL""", [a, b]))


def default_pair(store: Store, newest: int = 12) -> tuple[str | None, str | None]:
    """The two versions a comparison opens on, ``(a, b)``: the most recent two distinct versions
    that scored rollouts in common, the newer as ``b`` (among the ``newest`` versions). With no
    such pair: ``(None, b)``, ``b`` the newest version (None in a store with none)."""
    ids = versions(store)["rule_version_id"].tolist()[:newest]
    for i, b in enumerate(ids):
        for a in ids[i + 1:]:
            if overlap(store, a, b):
                return a, b
    return None, (ids[0] if ids else None)
