"""Read queries: small builders that return SQL plus bound values, and thin runners.

User values are always bound parameters, never formatted into SQL. Advantages are
computed in the query with window functions over the *unfiltered* groups, so filtering
the table never changes a rollout's advantage.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import pandas as pd

from .advantages import EQUAL_TOL, GROUP_STATS, Credit, estimator_sql, from_stats_sql, group_stats_sql
from .store import Store
from .tasks import Prompt

MAX_TABLE_ROWS = 5000


@dataclass(frozen=True)
class RolloutFilter:
    """What the rollout table shows. ``None`` means no constraint."""

    run_id: str | None = None
    prompt_contains: str | None = None
    correct: bool | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    group_id: str | None = None
    branches_of: str | None = None  # only branches of this rollout, at any depth
    train_step: int | None = None  # only rollouts sampled at this training step (mini-runs)
    limit: int = MAX_TABLE_ROWS


def versions_sql(rule_version_id: str | None, scope: str = "TRUE") -> tuple[str, list]:
    """``(rollout_id, rule_version_id)``: which rule version's rewards to show per rollout.

    ``None`` means each rollout's most recent scoring, so a newer rule that scored only new
    rollouts never blanks out older ones; a given id shows every rollout under that version.
    ``scope`` is a condition on ``rollouts ro`` limiting which rollouts are looked at.
    """
    if rule_version_id is not None:
        return f"SELECT ro.rollout_id, ?::VARCHAR AS rule_version_id FROM rollouts ro WHERE {scope}", [rule_version_id]
    return (f"""SELECT rw.rollout_id, arg_max(rw.rule_version_id, v.created_at) AS rule_version_id
               FROM rewards rw JOIN rule_versions v USING (rule_version_id)
               WHERE rw.component = 'total' AND rw.rollout_id IN (SELECT ro.rollout_id FROM rollouts ro WHERE {scope})
               GROUP BY rw.rollout_id""", [])


def scored_rollouts_sql(rule_version_id: str | None = None, scope: str = "TRUE",
                        scope_params: list | None = None, credit: Credit | None = None) -> tuple[str, list]:
    """Rollouts with total reward, accuracy and advantage (see :func:`versions_sql`).

    ``scope`` (a condition on ``rollouts ro`` with ``scope_params``) must keep or drop
    whole groups, like ``ro.group_id = ?`` or ``ro.run_id = ?``: advantages are computed
    over what it keeps (REINFORCE++ whitens over whole batches, so its scope is widened to
    the runs the scope touches and the rows cut back to the scope afterwards).

    ``credit`` picks the estimator (GRPO when None). Token-level estimators give the
    advantage of the first token here: KL in the reward, A_0 = G_0 - mean_g G_0 with
    G_0 = R - β·Σ_t (log π - log π_ref); GAE, A_0 = Σ_t (γλ)^t δ_t. Either is NULL for a
    rollout whose reference log-probs or values are not all stored.
    """
    credit = credit or Credit()
    scope_params = list(scope_params or [])
    key = credit.estimator
    inner, inner_params = scope, scope_params
    if key == "reinforce_pp":
        inner = f"ro.run_id IN (SELECT ro.run_id FROM rollouts ro WHERE {scope})"
    versions, vparams = versions_sql(rule_version_id, inner)
    params = vparams + inner_params
    ctes = [f"versions AS ({versions})"]
    scored = f"""scored AS (
            SELECT ro.rollout_id, ro.run_id, ro.group_id, ro.prompt_id, ro.sample_idx, ro.text,
                   ro.n_tokens, ro.finish_reason, ro.created_at, ro.train_step, ro.parent_rollout_id,
                   ro.fork_pos, ro.forced_token_id, ve.rule_version_id,
                   tot.value AS reward, acc.value AS accuracy{", (" + scope + ") AS _in_scope" if key == "reinforce_pp" else ""}
            FROM rollouts ro
            LEFT JOIN versions ve ON ve.rollout_id = ro.rollout_id
            LEFT JOIN rewards tot ON tot.rollout_id = ro.rollout_id
                 AND tot.rule_version_id = ve.rule_version_id AND tot.component = 'total'
            LEFT JOIN rewards acc ON acc.rollout_id = ro.rollout_id
                 AND acc.rule_version_id = ve.rule_version_id AND acc.component = 'accuracy'
            WHERE {inner})"""
    ctes.append(scored)
    if key == "reinforce_pp":
        params += scope_params + inner_params
    else:
        params += inner_params
    if key == "kl":
        ctes.append(f"""kl AS (
            SELECT t.rollout_id, sum(t.logprob - sc.logprob) AS kl_sum, count(sc.logprob) = count(*) AS complete
            FROM tokens t LEFT JOIN token_scores sc ON sc.rollout_id = t.rollout_id AND sc.pos = t.pos
                 AND sc.policy_version = ?
            WHERE t.rollout_id IN (SELECT rollout_id FROM scored) GROUP BY t.rollout_id)""")
        params.append(credit.reference or "")
        ctes.append(f"""g0 AS (
            SELECT s.*, CASE WHEN kl.complete THEN s.reward - {float(credit.beta)!r} * kl.kl_sum END AS _g0
            FROM scored s LEFT JOIN kl USING (rollout_id))""")
        final = "SELECT * EXCLUDE (_g0), _g0 - avg(_g0) OVER (PARTITION BY group_id) AS advantage FROM g0"
    elif key == "gae":
        gl = float(credit.gamma) * float(credit.lam)
        ctes.append(f"""v AS (
            SELECT rollout_id, pos, value,
                   lead(value, 1, 0.0) OVER (PARTITION BY rollout_id ORDER BY pos) AS v_next
            FROM token_scores WHERE policy_version = ? AND rollout_id IN (SELECT rollout_id FROM scored))""")
        params.append(credit.values or "")
        ctes.append(f"""a0 AS (
            SELECT rollout_id, sum(pow({gl!r}, pos) * ({float(credit.gamma)!r} * v_next - value)) AS part,
                   max(pos) AS last, count(value) AS n
            FROM v GROUP BY rollout_id)""")
        final = (f"SELECT s.*, CASE WHEN a0.n = s.n_tokens THEN a0.part + pow({gl!r}, a0.last) * s.reward END "
                 "AS advantage FROM scored s LEFT JOIN a0 USING (rollout_id)")
    elif key == "reinforce_pp":
        pre, expr = estimator_sql(key)
        ctes.append(f"pre AS (SELECT *{pre} FROM scored)")
        final = f"SELECT * EXCLUDE (_a, _in_scope) FROM (SELECT *, {expr} AS advantage FROM pre) WHERE _in_scope"
    else:  # GRPO, Dr. GRPO, RLOO (and token estimators' fallback, GRPO): one GROUP BY joined back
        ctes.append(f"gs AS (SELECT group_id, {group_stats_sql()} FROM scored GROUP BY group_id)")
        final = (f"SELECT s.*, {from_stats_sql(key if key in GROUP_STATS else 'grpo', 's.reward')} AS advantage "
                 "FROM scored s JOIN gs USING (group_id)")
    return "WITH " + ",\n".join(ctes) + "\n" + final, params


GROUP_OF = "ro.group_id = (SELECT group_id FROM rollouts WHERE rollout_id = ?)"

# rollout ids of every branch below one rollout (one bound parameter: the rollout id)
DESCENDANTS = """
    WITH RECURSIVE down(rid, depth) AS (
        SELECT rollout_id, 1 FROM rollouts WHERE parent_rollout_id = ?
        UNION ALL
        SELECT c.rollout_id, down.depth + 1 FROM down JOIN rollouts c ON c.parent_rollout_id = down.rid
        WHERE down.depth < 100)
    SELECT rid FROM down"""


def rollout_table_sql(rule_version_id: str | None, f: RolloutFilter, credit: Credit | None = None) -> tuple[str, list]:
    scope, sparams = ["TRUE"], []
    if f.run_id:  # run and group filters keep whole groups: safe to apply before the window
        scope.append("ro.run_id = ?"); sparams.append(f.run_id)
    if f.group_id:
        scope.append("ro.group_id = ?"); sparams.append(f.group_id)
    if f.train_step is not None:  # a group is sampled within one step: whole groups again
        scope.append("ro.train_step = ?"); sparams.append(int(f.train_step))
    if f.branches_of:  # a branch request is one whole group, so this keeps whole groups too
        scope.append(f"ro.rollout_id IN ({DESCENDANTS})"); sparams.append(f.branches_of)
    base, params = scored_rollouts_sql(rule_version_id, " AND ".join(scope), sparams, credit)
    where, wparams = [], []
    if f.prompt_contains:
        # contains(), not LIKE: a typed % or _ is a character, not a wildcard
        where.append("contains(lower(p.text), lower(?))"); wparams.append(f.prompt_contains.strip())
    if f.correct is True:
        where.append("s.accuracy >= 1")
    elif f.correct is False:
        where.append("coalesce(s.accuracy, 0) < 1")
    if f.reward_min is not None:
        where.append("s.reward >= ?"); wparams.append(float(f.reward_min))
    if f.reward_max is not None:
        where.append("s.reward <= ?"); wparams.append(float(f.reward_max))
    sql = f"""
        SELECT s.rollout_id, p.text AS prompt, s.text AS completion, s.reward, s.advantage,
               s.accuracy >= 1 AS correct, s.n_tokens, s.finish_reason, r.name AS run,
               s.group_id, s.sample_idx, s.created_at, s.fork_pos, s.parent_rollout_id
        FROM ({base}) s
        JOIN prompts p USING (prompt_id)
        JOIN runs r USING (run_id)
        {"WHERE " + " AND ".join(where) if where else ""}
        ORDER BY s.created_at DESC, p.text, s.group_id, s.sample_idx
        LIMIT ?
    """
    return sql, params + wparams + [int(f.limit)]


def rollout_table(store: Store, f: RolloutFilter = RolloutFilter(), rule_version_id: str | None = None,
                  credit: Credit | None = None) -> pd.DataFrame:
    return store.df(*rollout_table_sql(rule_version_id, f, credit))


def rollout(store: Store, rollout_id: str, rule_version_id: str | None = None,
            credit: Credit | None = None) -> dict | None:
    """One rollout with its prompt, reward, advantage and reward components."""
    base, params = scored_rollouts_sql(rule_version_id, GROUP_OF, [rollout_id], credit)
    rows = store.df(f"""
        SELECT s.*, p.text AS prompt, p.gold, p.task, r.name AS run, r.policy
        FROM ({base}) s JOIN prompts p USING (prompt_id) JOIN runs r USING (run_id)
        WHERE s.rollout_id = ?""", params + [rollout_id])
    if rows.empty:
        return None
    out = rows.iloc[0].to_dict()
    out["components"] = components(store, [rollout_id], rule_version_id).get(rollout_id, {})
    return out


def components(store: Store, rollout_ids: list[str], rule_version_id: str | None = None) -> dict[str, dict[str, float]]:
    """``{rollout_id: {component: value}}``, each rollout under the version :func:`versions_sql` picks."""
    if not rollout_ids:
        return {}
    versions, params = versions_sql(rule_version_id, "list_contains(?, ro.rollout_id)")
    params = params + [rollout_ids]
    df = store.df(f"""
        WITH versions AS ({versions})
        SELECT rw.rollout_id, rw.component, rw.value FROM rewards rw
        JOIN versions ve ON ve.rollout_id = rw.rollout_id AND ve.rule_version_id = rw.rule_version_id
        WHERE list_contains(?, rw.rollout_id)
        ORDER BY rw.component""", params + [rollout_ids])
    out: dict[str, dict[str, float]] = {}
    for rid, comp, val in df.itertuples(index=False):
        out.setdefault(rid, {})[comp] = val
    return out


def reward_bounds(store: Store) -> tuple[float, float]:
    """Smallest and largest total reward in the store (0, 1 when there is none)."""
    lo, hi = store.cursor().execute(
        "SELECT coalesce(min(value), 0), coalesce(max(value), 1) FROM rewards WHERE component = 'total'").fetchone()
    return float(lo), float(hi)


def rollout_count(store: Store) -> int:
    return int(store.scalar("SELECT count(*) FROM rollouts"))


TOKEN_COLUMNS = "pos, token_id, token_text, logprob, entropy, topk_ids, topk_logprobs, step_idx"


def tokens(store: Store, rollout_id: str) -> pd.DataFrame:
    """The rollout's tokens in order with their statistics (top-k alternatives as ids)."""
    return store.df(f"SELECT {TOKEN_COLUMNS} FROM tokens WHERE rollout_id = ? ORDER BY pos", [rollout_id])


def tokens_of(store: Store, rollout_ids: list[str]) -> dict[str, pd.DataFrame]:
    """Tokens of several rollouts in one query: ``{rollout_id: tokens in order}``."""
    df = store.df(f"SELECT rollout_id, {TOKEN_COLUMNS} FROM tokens WHERE list_contains(?, rollout_id) "
                  "ORDER BY rollout_id, pos", [rollout_ids])
    return {rid: part.drop(columns="rollout_id").reset_index(drop=True) for rid, part in df.groupby("rollout_id")}


def group(store: Store, group_id: str, rule_version_id: str | None = None, credit: Credit | None = None) -> pd.DataFrame:
    """All completions of one group with reward, advantage and every component as a column."""
    base, params = scored_rollouts_sql(rule_version_id, "ro.group_id = ?", [group_id], credit)
    df = store.df(f"""
        SELECT s.*, p.text AS prompt, p.gold, p.task, r.policy
        FROM ({base}) s JOIN prompts p USING (prompt_id) JOIN runs r USING (run_id)
        ORDER BY s.sample_idx, s.rollout_id""", params)
    comps = components(store, df["rollout_id"].tolist(), rule_version_id)
    names = sorted({c for d in comps.values() for c in d if c != "total"})
    for c in names:
        df[c] = [comps.get(r, {}).get(c) for r in df["rollout_id"]]
    df.attrs["components"] = names
    return df


def groups(store: Store, run_id: str | None = None, rule_version_id: str | None = None) -> pd.DataFrame:
    """One row per group: prompt, size, mean reward, and whether all rewards are equal."""
    base, params = scored_rollouts_sql(rule_version_id, "ro.run_id = ?" if run_id else "TRUE",
                                       [run_id] if run_id else [])
    where, wp = "", []
    return store.df(f"""
        SELECT s.group_id, any_value(p.text) AS prompt, any_value(r.name) AS run, count(*) AS size,
               avg(s.reward) AS mean_reward, avg(CASE WHEN s.accuracy >= 1 THEN 1 ELSE 0 END) AS accuracy,
               coalesce(max(s.reward) - min(s.reward) <= {EQUAL_TOL!r}, true) AS all_equal, max(s.created_at) AS created_at
        FROM ({base}) s JOIN prompts p USING (prompt_id) JOIN runs r USING (run_id) {where}
        GROUP BY s.group_id ORDER BY created_at DESC, prompt""", params + wp)


def runs(store: Store) -> pd.DataFrame:
    return store.df("""
        SELECT r.run_id, r.kind, r.name, r.policy, r.status, r.created_at, count(ro.rollout_id) AS rollouts
        FROM runs r LEFT JOIN rollouts ro USING (run_id)
        GROUP BY ALL ORDER BY r.created_at DESC""")


def prompt_of_row(row: dict) -> Prompt:
    """The :class:`Prompt` of a rollout row that carries ``prompt`` text and ``gold`` JSON."""
    gold = row.get("gold")
    return Prompt(row["prompt"], json.loads(gold) if isinstance(gold, str) else (gold or {}))


def sample_prompts(store: Store, limit: int = 200) -> list[str]:
    """Prompt texts already in the store, for the generate panel's picker."""
    return [r[0] for r in store.cursor().execute(
        "SELECT text FROM prompts ORDER BY text LIMIT ?", [limit]).fetchall()]
