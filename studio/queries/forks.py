"""Entropy forks as read from the store: fork thresholds, rollout trees with their branch values, the landscape.

A *forking token* is one where the policy was unsure: its entropy is in the top share of the
token entropies of a scope and above a minimum, or above an absolute threshold in nats (the
rule: :class:`~studio.signals.forks.ForkRule`). :func:`threshold` computes it over a scope of the
store: the run, or one training step of the run, of the rollout's tree root (so a branch is
judged as its root is), or the rollouts the table filter keeps; :func:`landscape` shows where a
run's entropy sits, and :func:`entropy_changes` where it moved between the stored policy and
another one that re-scored the rollouts.

*Branching* (:mod:`studio.runs.branch`) continues a stored rollout from a fork: the prefix
before it is kept, the token at it is forced to a chosen alternative (or drawn again, "as
sampled"), and the rest is sampled ``n`` times per choice, then scored with the reward rule.
Branch rollouts are ordinary rollouts with ``parent_rollout_id``, ``fork_pos`` and
``forced_token_id`` (NULL when the token was drawn again); one request is one run (kind
``branch``) and one group, so GRPO advantages compare the continuations of one fork.
:func:`tree` reads a rollout's tree back and :func:`forks` its forks: the mean reward of a
branch is a Monte Carlo estimate of the value of that choice, Q(prefix, token), and a fork
whose branch values differ by at least ``PIVOTAL_SPREAD`` is *pivotal*: the choice there
decides the outcome. :func:`forks_on` places a tree's forks on one of its rollouts (every fork
whose context that rollout shares), which is how the token strip marks pivotal tokens.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from studio.queries.scoring import scored_rollouts_sql
from studio.queries.table import RolloutFilter, rollout_table_sql
from studio.signals.forks import ForkRule, Threshold
from studio.store import Store

PIVOTAL_SPREAD = 0.5  # reward units between the best and worst branch of a fork


# ---------------------------------------------------------------------------- fork threshold


# the rollout at the root of the tree of the rollout bound to its one parameter (itself when not a branch)
ROOT_SQL = """(WITH RECURSIVE up(rid, parent, depth) AS (
        SELECT rollout_id, parent_rollout_id, 0 FROM rollouts WHERE rollout_id = ?
        UNION ALL
        SELECT ro.rollout_id, ro.parent_rollout_id, up.depth + 1
        FROM up JOIN rollouts ro ON ro.rollout_id = up.parent
        WHERE up.depth < 100)
    SELECT rid FROM up ORDER BY depth DESC LIMIT 1)"""


def scope_condition(rule: ForkRule, rollout_id: str | None,
                    flt: RolloutFilter | None = None) -> tuple[str, list]:
    """A condition on ``rollouts ro`` selecting the rollouts whose tokens set the quantile: the
    filter's, or those of the run (and step) of ``rollout_id``'s tree root, so every rollout of a
    tree is judged against one population."""
    if rule.scope == "filter":
        sql, params = rollout_table_sql(None, replace(flt or RolloutFilter(), limit=10**9))
        return f"ro.rollout_id IN (SELECT rollout_id FROM ({sql}))", params
    if not rollout_id:
        return "TRUE", []
    run = f"ro.run_id = {_root_column('run_id')}"
    if rule.scope == "step":
        return f"{run} AND ro.train_step IS NOT DISTINCT FROM {_root_column('train_step')}", [rollout_id, rollout_id]
    return run, [rollout_id]


def _root_column(column: str) -> str:
    """SQL for one column of the tree root of the rollout bound to its one parameter."""
    return f"(SELECT {column} FROM rollouts WHERE rollout_id = {ROOT_SQL})"


def threshold(store: Store, rule: ForkRule = ForkRule(), rollout_id: str | None = None,  # noqa: B008  (a frozen dataclass)
              flt: RolloutFilter | None = None) -> Threshold:
    """The fork threshold of ``rule`` for the scope around ``rollout_id`` (or the filter)."""
    rule.validate()
    cond, params = scope_condition(rule, rollout_id, flt)
    return _threshold_where(store, rule, cond, params)


def _threshold_where(store: Store, rule: ForkRule, cond: str, params: list) -> Threshold:
    """:func:`threshold` over the tokens of the rollouts ``ro`` that ``cond`` keeps, in one read."""
    if rule.absolute is not None:
        thr_sql, thr_params = "SELECT ?::DOUBLE AS value, NULL::DOUBLE AS quantile", [rule.absolute]
    else:
        thr_sql = ("SELECT greatest(q, ?::DOUBLE) AS value, q AS quantile "
                   "FROM (SELECT quantile_cont(entropy, ?) AS q FROM scoped)")
        thr_params = [rule.min_entropy, 1.0 - rule.q]
    row = store.df(f"""
        WITH scoped AS (SELECT t.entropy FROM tokens t JOIN rollouts ro USING (rollout_id)
                        WHERE {cond} AND t.entropy IS NOT NULL),
             thr AS ({thr_sql})
        SELECT thr.value, thr.quantile, count(s.entropy) AS n,
               avg(CASE WHEN s.entropy >= thr.value THEN 1 ELSE 0 END) AS share
        FROM scoped s, thr GROUP BY thr.value, thr.quantile""", params + thr_params)
    if row.empty or not row["n"].iloc[0]:
        return Threshold(rule.absolute, 0, None, rule)
    value, quantile, n, share = row.iloc[0]

    def number(x):
        return None if pd.isna(x) else float(x)
    return Threshold(number(value), int(n), number(share), rule, number(quantile))


# ---------------------------------------------------------------------------- trees


def depth_of(store: Store, rollout_id: str) -> int:
    """How many forks separate a rollout from the sampled rollout at its tree's root."""
    return int(store.scalar("""
        WITH RECURSIVE up(rid, depth) AS (
            SELECT parent_rollout_id, 0 FROM rollouts WHERE rollout_id = ?
            UNION ALL
            SELECT ro.parent_rollout_id, up.depth + 1 FROM up JOIN rollouts ro ON ro.rollout_id = up.rid
            WHERE up.rid IS NOT NULL AND up.depth < 100)
        SELECT count(rid) FROM up""", [rollout_id]) or 0)


def lineage(store: Store, rollout_id: str) -> tuple[str | None, int] | None:
    """``(parent rollout id, number of branches taken from it)`` of ``rollout_id`` in one read;
    None when it is not stored. ``(None, 0)``: its tree is itself alone (most rollouts), and
    :func:`tree` has nothing to add."""
    df = store.df("""SELECT parent_rollout_id AS parent,
                             (SELECT count(*) FROM rollouts c WHERE c.parent_rollout_id = ?) AS n
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
    root = store.scalar(f"SELECT {ROOT_SQL}", [rollout_id])
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
    base, params = scored_rollouts_sql(rule_version_id, "list_contains(?, ro.rollout_id)", [id_list])
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
        probs = ({int(i): float(np.exp(lp)) for i, lp in zip(pt.topk_ids, pt.topk_logprobs, strict=False)}
                 if pt is not None else {})
        branches = []
        for forced, sub in part.groupby(part["forced_token_id"].astype("Int64").fillna(-1), sort=False):
            forced = None if int(forced) < 0 else int(forced)
            label = "as sampled" if forced is None else sub["fork_token_text"].iloc[0]
            branches.append(Branch(label, forced, sub["rollout_id"].tolist(), sub["reward"].astype(float).tolist(),
                                   (sub["accuracy"].fillna(0) >= 1).tolist(),
                                   probs.get(forced) if forced is not None else None))
        branches.sort(key=lambda b: (b.token_id is not None, -(b.p or 0)))
        out.append(Fork(parent, int(pos), pt.token_text if pt is not None else "?",
                        float(pt.entropy) if pt is not None and pt.entropy is not None else None, branches))
    out.sort(key=lambda f: (-f.pivotal, -f.spread, f.pos))
    return out


def forks_on(tree_df: pd.DataFrame, fork_list: list[Fork], rollout_id: str) -> dict[int, Fork]:
    """The forks of a tree that sit on ``rollout_id``'s tokens, by position: those of the rollout
    itself and every fork whose context it shares (a fork of its root before the branch point, the
    fork it was branched from). Two rollouts share the tokens before the first fork on the path
    between them; where two forks share a position, the first of ``fork_list`` (the pivotal one)."""
    if tree_df.empty or rollout_id not in set(tree_df["rollout_id"]):
        return {}
    parent = {r: (None if pd.isna(p) else p) for r, p in zip(tree_df["rollout_id"], tree_df["parent_rollout_id"])}
    at = dict(zip(tree_df["rollout_id"], tree_df["fork_pos"]))

    def up(node: str | None) -> list[str]:  # the node, its parent, ..., the root
        path = []
        while node is not None and node not in path:
            path.append(node)
            node = parent.get(node)
        return path

    mine = up(rollout_id)
    out: dict[int, Fork] = {}
    for f in fork_list:
        theirs = up(f.parent_rollout_id)
        common = next((n for n in theirs if n in mine), None)
        if common is None:
            continue
        between = mine[:mine.index(common)] + theirs[:theirs.index(common)]
        shared = min((int(at[n]) for n in between), default=None)  # None: the same rollout
        if shared is None or f.pos <= shared:
            out.setdefault(f.pos, f)
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


def landscape(store: Store, run_id: str, rule: ForkRule = ForkRule(), bins: int = 40) -> Landscape:  # noqa: B008  (a frozen dataclass)
    """Histogram, mean entropy by position and by step, and forks per rollout split by
    correctness, for one run's rollouts (the quantile's scope is the run itself, a branch run's too)."""
    rule = replace(rule, scope="run")
    rule.validate()
    thr = _threshold_where(store, rule, "ro.run_id = ?", [run_id])
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
    base, params = scored_rollouts_sql(None, "ro.run_id = ?", [run_id])
    per = store.df(f"""
        SELECT s.rollout_id, coalesce(s.accuracy, 0) >= 1 AS correct, s.n_tokens,
               count(*) FILTER (WHERE t.entropy >= ?) AS forks
        FROM ({base}) s JOIN tokens t USING (rollout_id)
        GROUP BY s.rollout_id, s.accuracy, s.n_tokens""",
                   [thr.value if thr.value is not None else float("inf")] + params)
    mass = (float(ent[ent >= thr.value].sum() / ent.sum())
            if thr.value is not None and ent.size and ent.sum() > 0 else None)
    return Landscape(thr, edges, counts, by_pos, by_step, per, int(ent.size), mass)


# ---------------------------------------------------------------------------- two policies


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
