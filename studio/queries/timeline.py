"""Timeline and run diff: one prompt across training steps, and two runs (or two steps)
compared on the prompts they share.

Every query is scoped to what it shows: a prompt's timeline reads that prompt's rollouts
and their tokens, a step's list one (prompt, run, step) slice, a diff the rollouts of its
two sides. Rewards are each rollout's total under the version
:func:`~studio.queries.scoring.versions_sql` picks (or the one asked for); user values are always
bound parameters.

The diff pairs prompts: per shared prompt, d = mean reward on side B - mean reward on side A;
:class:`RunDiff` carries the paired statistics of the d (mean Δ with a bootstrap interval,
Wilcoxon signed-rank, sign test: :mod:`studio.signals.stats`).
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from studio.queries.scoring import scored_rollouts_sql, versions_sql
from studio.signals.advantages import EQUAL_TOL, Credit
from studio.signals.stats import N_BOOT, paired_stats
from studio.store import Store

MAX_PROMPTS = 200  # rows of the prompt picker
MAX_STEP_ROLLOUTS = 200  # completions listed for one step
PROMPT_CHARS = 300  # prompt text kept per diff row (the timeline shows it whole)


@dataclass(frozen=True)
class Side:
    """One side of a diff: a run, or one training step of it (``train_step=None``: the whole run)."""

    run_id: str
    train_step: int | None = None

    def scope(self) -> tuple[str, list]:
        """A condition on ``rollouts ro`` keeping this side's rollouts (whole groups)."""
        if self.train_step is None:
            return "ro.run_id = ?", [self.run_id]
        return "ro.run_id = ? AND ro.train_step = ?", [self.run_id, int(self.train_step)]


def rewarded_sql(rule_version_id: str | None, scope: str, scope_params: list) -> tuple[str, list]:
    """Rollouts in ``scope`` with their correctness (``accuracy``: the rollout's fact) and their total reward under the version
    :func:`~studio.queries.scoring.versions_sql` picks (each rollout's newest scoring, or the one
    given), as ``scored_rollouts_sql`` reads them but without the advantage: a diff or a timeline
    averages rewards, and the advantage's pass over the groups would be wasted."""
    if rule_version_id is None:
        versions, vparams = versions_sql(None, scope)
        join, on = f"LEFT JOIN ({versions}) ve ON ve.rollout_id = ro.rollout_id", "ve.rule_version_id"
        params = [*vparams, *scope_params]  # the versions' scope, before the joins below
    else:
        join, on = "", "?::VARCHAR"
        params = [rule_version_id]  # the reward join's version
    sql = f"""
        SELECT ro.rollout_id, ro.run_id, ro.train_step, ro.prompt_id, ro.group_id, ro.n_tokens,
               tot.value AS reward, ro.correct::DOUBLE AS accuracy  -- correctness: the rollout's, not a version's
        FROM rollouts ro {join}
        LEFT JOIN rewards tot ON tot.rollout_id = ro.rollout_id AND tot.rule_version_id = {on}
             AND tot.component = 'total'
        WHERE {scope}"""
    return sql, [*params, *scope_params]


# -- pickers -------------------------------------------------------------------------------
def runs_with_steps(store: Store) -> pd.DataFrame:
    """Runs whose rollouts span 2+ training steps: ``run_id, name, kind, steps, first_step,
    last_step, rollouts`` (newest first)."""
    return store.df("""
        SELECT r.run_id, r.name, r.kind, s.steps, s.first_step, s.last_step, s.rollouts
        FROM (SELECT run_id, count(DISTINCT train_step) AS steps, min(train_step) AS first_step,
                     max(train_step) AS last_step, count(*) AS rollouts
              FROM rollouts WHERE train_step IS NOT NULL GROUP BY run_id
              HAVING count(DISTINCT train_step) >= 2) s
        JOIN runs r USING (run_id)
        ORDER BY r.created_at DESC, r.run_id""")


def run_steps(store: Store, run_id: str) -> pd.DataFrame:
    """The training steps of one run: ``train_step, rollouts, prompts``."""
    return store.df("""
        SELECT train_step, count(*) AS rollouts, count(DISTINCT prompt_id) AS prompts
        FROM rollouts WHERE run_id = ? AND train_step IS NOT NULL
        GROUP BY train_step ORDER BY train_step""", [run_id])


def prompts_across_steps(store: Store, run_id: str, limit: int = MAX_PROMPTS, search: str | None = None,
                         rule_version_id: str | None = None) -> pd.DataFrame:
    """Prompts of ``run_id`` sampled at 2+ training steps, to pick one for a timeline.

    Returns ``prompt_id, prompt, steps, first_step, last_step, rollouts, reward_first,
    reward_last`` (mean reward at the first and last step the prompt was seen): the prompts
    seen at most steps first, then the biggest change. ``search`` keeps prompts whose text
    contains it (case-insensitive, a plain substring). Rewards are read only for each
    prompt's first and last step, not for every rollout of the run.
    """
    search_sql, sparams = "", []
    if search and search.strip():
        search_sql = "AND prompt_id IN (SELECT prompt_id FROM prompts WHERE contains(lower(text), lower(?)))"
        sparams = [search.strip()]
    ends_scope = ("ro.run_id = ? AND EXISTS (SELECT 1 FROM ends e WHERE e.prompt_id = ro.prompt_id "
                  "AND e.train_step = ro.train_step)")
    base, params = rewarded_sql(rule_version_id, ends_scope, [run_id])
    sql = f"""
        WITH span AS (
            SELECT prompt_id, count(DISTINCT train_step) AS steps, min(train_step) AS first_step,
                   max(train_step) AS last_step, count(*) AS rollouts
            FROM rollouts WHERE run_id = ? AND train_step IS NOT NULL {search_sql}
            GROUP BY prompt_id HAVING count(DISTINCT train_step) >= 2),
        ends AS (SELECT prompt_id, first_step AS train_step FROM span
                 UNION ALL SELECT prompt_id, last_step FROM span),
        per_step AS (SELECT prompt_id, train_step, avg(reward) AS reward FROM ({base}) GROUP BY ALL)
        SELECT sp.prompt_id, p.text AS prompt, sp.steps, sp.first_step, sp.last_step, sp.rollouts,
               f.reward AS reward_first, l.reward AS reward_last
        FROM span sp JOIN prompts p USING (prompt_id)
        LEFT JOIN per_step f ON f.prompt_id = sp.prompt_id AND f.train_step = sp.first_step
        LEFT JOIN per_step l ON l.prompt_id = sp.prompt_id AND l.train_step = sp.last_step
        ORDER BY sp.steps DESC, abs(l.reward - f.reward) DESC NULLS LAST, p.text, sp.prompt_id
        LIMIT ?"""
    return store.df(sql, [run_id, *sparams, *params, int(limit)])


def rollout_place(store: Store, rollout_id: str) -> dict | None:
    """``{prompt_id, run_id, train_step}`` of one rollout (None when it is not stored)."""
    df = store.df("SELECT prompt_id, run_id, train_step FROM rollouts WHERE rollout_id = ?", [rollout_id])
    if df.empty:
        return None
    row = df.iloc[0]
    step = row["train_step"]
    return {"prompt_id": row["prompt_id"], "run_id": row["run_id"],
            "train_step": None if pd.isna(step) else int(step)}


def prompt_text(store: Store, prompt_id: str) -> str | None:
    """The whole text of one prompt (None when it is not stored)."""
    return store.scalar("SELECT text FROM prompts WHERE prompt_id = ?", [prompt_id])


# -- timeline ------------------------------------------------------------------------------
def token_entropy(store: Store, rollout_ids: list[str]) -> pd.DataFrame:
    """``rollout_id, entropy_sum, entropy_n`` for the given rollouts that have tokens.

    The ids are a bound list, not a subquery: DuckDB then skips every row group of
    ``tokens`` whose id range holds none of them (ids sort in the order they were made), so
    a prompt's few hundred rollouts read milliseconds of 100M tokens, not all of them.
    """
    return store.df("""SELECT rollout_id, sum(entropy) AS entropy_sum, count(entropy) AS entropy_n
                       FROM tokens WHERE list_contains(?::VARCHAR[], rollout_id) GROUP BY rollout_id""",
                    [list(rollout_ids)])


def prompt_timeline(store: Store, prompt_id: str, run_id: str | None = None,
                    rule_version_id: str | None = None) -> pd.DataFrame:
    """One prompt across training steps: a row per (run, train step).

    Columns: ``run_id, run, train_step, n, reward_mean, reward_min, reward_max, accuracy``
    (share of completions whose ``accuracy`` component is ≥ 1, over the scored ones),
    ``entropy`` (mean token entropy over all tokens of the step's completions, as the
    mini-runs' ``entropy`` metric; NULL when none has tokens), ``with_tokens`` (completions
    that have tokens), ``length`` (mean ``n_tokens``), ``all_equal`` (every reward of the step
    equal: no learning signal from this prompt; NULL when unscored).
    """
    scope, sparams = "ro.prompt_id = ? AND ro.train_step IS NOT NULL", [prompt_id]
    if run_id is not None:
        scope += " AND ro.run_id = ?"
        sparams.append(run_id)
    base, params = rewarded_sql(rule_version_id, scope, sparams)
    ro = store.df(f"SELECT b.*, r.name AS run FROM ({base}) b JOIN runs r USING (run_id)", params)
    ent = token_entropy(store, ro["rollout_id"].tolist())
    ro = ro.merge(ent, on="rollout_id", how="left")
    ro["correct"] = (ro["accuracy"] >= 1).astype(float).where(ro["accuracy"].notna())
    g = ro.groupby(["run_id", "train_step"], sort=True)
    out = g.agg(run=("run", "first"), n=("rollout_id", "size"), reward_mean=("reward", "mean"),
                reward_min=("reward", "min"), reward_max=("reward", "max"), accuracy=("correct", "mean"),
                entropy_sum=("entropy_sum", "sum"), entropy_n=("entropy_n", "sum"),
                with_tokens=("entropy_n", "count"), length=("n_tokens", "mean")).reset_index()
    out["entropy"] = (out["entropy_sum"] / out["entropy_n"]).where(out["entropy_n"] > 0)
    spread = out["reward_max"] - out["reward_min"]
    out["all_equal"] = (spread <= EQUAL_TOL).astype(object).where(spread.notna(), None)
    cols = ["run_id", "run", "train_step", "n", "reward_mean", "reward_min", "reward_max", "accuracy",
            "entropy", "with_tokens", "length", "all_equal"]
    return out[cols].astype({"train_step": int, "n": int, "with_tokens": int})


def timeline_rollouts(store: Store, prompt_id: str, run_id: str, train_step: int,
                      rule_version_id: str | None = None, credit: Credit | None = None,
                      limit: int = MAX_STEP_ROLLOUTS) -> pd.DataFrame:
    """The completions of ``prompt_id`` in ``run_id`` at ``train_step``, with reward,
    advantage (the sidebar's estimator), accuracy and mean token entropy (NULL without tokens).

    A group is sampled for one prompt within one step, so the scope keeps whole groups and the
    advantages are the ones the table shows.
    """
    scope = "ro.prompt_id = ? AND ro.run_id = ? AND ro.train_step = ?"
    base, params = scored_rollouts_sql(rule_version_id, scope, [prompt_id, run_id, int(train_step)], credit)
    df = store.df(f"""SELECT rollout_id, group_id, sample_idx, text, n_tokens, finish_reason, reward, advantage,
                             accuracy FROM ({base}) ORDER BY group_id, sample_idx, rollout_id LIMIT ?""",
                  params + [int(limit)])
    ent = token_entropy(store, df["rollout_id"].tolist())
    df = df.merge(ent, on="rollout_id", how="left")
    df["entropy"] = (df["entropy_sum"] / df["entropy_n"]).where(df["entropy_n"] > 0)
    return df.drop(columns=["entropy_sum", "entropy_n"])


# -- run diff ------------------------------------------------------------------------------
@dataclass
class RunDiff:
    """Two sides compared on the prompts both have (the statistics: :mod:`studio.signals.stats`).

    ``per_prompt``: one row per shared prompt with ``prompt_id, prompt`` (first
    ``PROMPT_CHARS`` characters), ``reward_a, reward_b, delta`` (B - A), ``accuracy_a,
    accuracy_b, n_a, n_b, length_a, length_b``. The statistics are over the shared prompts
    whose rewards are known on both sides (``n``); accuracies are means over those prompts of
    each prompt's share of correct completions.
    """

    a: Side
    b: Side
    rule_version_id: str | None
    per_prompt: pd.DataFrame
    only_a: int
    only_b: int
    n: int = 0
    mean_a: float = float("nan")
    mean_b: float = float("nan")
    mean_delta: float = float("nan")
    ci_lo: float = float("nan")
    ci_hi: float = float("nan")
    ci_method: str = "none"
    wins: int = 0
    ties: int = 0
    losses: int = 0
    p_wilcoxon: float = float("nan")
    p_sign: float = float("nan")
    accuracy_a: float = float("nan")
    accuracy_b: float = float("nan")

    @property
    def shared(self) -> int:
        return len(self.per_prompt)

    def movers(self, k: int = 10) -> pd.DataFrame:
        """The ``k`` prompts whose mean reward rose most (``direction`` up, biggest first), then
        the ``k`` that fell most (down, biggest fall first); unchanged prompts are neither."""
        df = self.per_prompt.dropna(subset=["delta"])
        up = df[df["delta"] > EQUAL_TOL].sort_values(["delta", "prompt_id"], ascending=[False, True]).head(k)
        down = df[df["delta"] < -EQUAL_TOL].sort_values(["delta", "prompt_id"], ascending=[True, True]).head(k)
        return pd.concat([up.assign(direction="up"), down.assign(direction="down")], ignore_index=True)


def _side_sql(side: Side, rule_version_id: str | None) -> tuple[str, list]:
    scope, sparams = side.scope()
    base, params = rewarded_sql(rule_version_id, scope, sparams)
    return (f"""SELECT prompt_id, avg(reward) AS reward, avg((accuracy >= 1)::DOUBLE) AS accuracy,
                      count(*) AS n, avg(n_tokens) AS length
               FROM ({base}) GROUP BY prompt_id""", params)


def run_diff_sql(a: Side, b: Side, rule_version_id: str | None = None) -> tuple[str, list]:
    """Per shared prompt: both sides' means; every row also carries the one-sided counts (a
    single row of NULLs and the counts when no prompt is shared)."""
    sa, pa_ = _side_sql(a, rule_version_id)
    sb, pb = _side_sql(b, rule_version_id)
    sql = f"""
        WITH sa AS MATERIALIZED ({sa}), sb AS MATERIALIZED ({sb}),
        counts AS (SELECT count(*) FILTER (WHERE sb.prompt_id IS NULL) AS only_a,
                          count(*) FILTER (WHERE sa.prompt_id IS NULL) AS only_b
                   FROM sa FULL JOIN sb ON sa.prompt_id = sb.prompt_id),
        shared AS (SELECT sa.prompt_id, left(p.text, {PROMPT_CHARS}) AS prompt,
                          sa.reward AS reward_a, sb.reward AS reward_b, sb.reward - sa.reward AS delta,
                          sa.accuracy AS accuracy_a, sb.accuracy AS accuracy_b, sa.n AS n_a, sb.n AS n_b,
                          sa.length AS length_a, sb.length AS length_b
                   FROM sa JOIN sb ON sa.prompt_id = sb.prompt_id JOIN prompts p ON p.prompt_id = sa.prompt_id)
        SELECT shared.*, counts.only_a, counts.only_b
        FROM counts LEFT JOIN shared ON TRUE
        ORDER BY shared.prompt_id"""
    return sql, pa_ + pb


def run_diff(store: Store, a: Side, b: Side, rule_version_id: str | None = None,
             n_boot: int = N_BOOT, seed: int = 0) -> RunDiff:
    """Compare side ``a`` with side ``b`` on the prompts both sampled (see :class:`RunDiff`)."""
    df = store.df(*run_diff_sql(a, b, rule_version_id))
    only_a = int(df["only_a"].iloc[0]) if len(df) else 0
    only_b = int(df["only_b"].iloc[0]) if len(df) else 0
    per = df[df["prompt_id"].notna()].drop(columns=["only_a", "only_b"]).reset_index(drop=True)
    diff = RunDiff(a=a, b=b, rule_version_id=rule_version_id, per_prompt=per, only_a=only_a, only_b=only_b)
    known = per.dropna(subset=["reward_a", "reward_b"])
    if len(known):
        st = paired_stats(known["reward_a"].to_numpy(float), known["reward_b"].to_numpy(float), n_boot, seed)
        for k, v in st.items():
            setattr(diff, k, v)
        diff.accuracy_a = float(known["accuracy_a"].mean())
        diff.accuracy_b = float(known["accuracy_b"].mean())
    return diff
