"""Read queries: small builders that return SQL plus bound values, and thin runners.

User values are always bound parameters, never formatted into SQL. Advantages are
computed in the query with window functions over the *unfiltered* groups, so filtering
the table never changes a rollout's advantage.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import pandas as pd

from .advantages import EQUAL_TOL, grpo_sql
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
    limit: int = MAX_TABLE_ROWS


def latest_rule_version(store: Store) -> str | None:
    return store.scalar("SELECT rule_version_id FROM rule_versions ORDER BY created_at DESC, rule_version_id LIMIT 1")


def scored_rollouts_sql(rule_version_id: str) -> tuple[str, list]:
    """Every rollout with its total reward, accuracy and GRPO advantage under one rule version."""
    sql = f"""
        WITH scored AS (
            SELECT ro.rollout_id, ro.run_id, ro.group_id, ro.prompt_id, ro.sample_idx, ro.text,
                   ro.n_tokens, ro.finish_reason, ro.created_at,
                   tot.value AS reward, acc.value AS accuracy
            FROM rollouts ro
            LEFT JOIN rewards tot ON tot.rollout_id = ro.rollout_id
                 AND tot.rule_version_id = ? AND tot.component = 'total'
            LEFT JOIN rewards acc ON acc.rollout_id = ro.rollout_id
                 AND acc.rule_version_id = ? AND acc.component = 'accuracy'
        )
        SELECT *, {grpo_sql('reward', 'group_id')} AS advantage FROM scored
    """
    return sql, [rule_version_id, rule_version_id]


def rollout_table_sql(rule_version_id: str, f: RolloutFilter) -> tuple[str, list]:
    base, params = scored_rollouts_sql(rule_version_id)
    where, wparams = [], []
    if f.run_id:
        where.append("s.run_id = ?"); wparams.append(f.run_id)
    if f.group_id:
        where.append("s.group_id = ?"); wparams.append(f.group_id)
    if f.prompt_contains:
        where.append("p.text ILIKE ?"); wparams.append(f"%{f.prompt_contains.strip()}%")
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
               s.group_id, s.sample_idx, s.created_at
        FROM ({base}) s
        JOIN prompts p USING (prompt_id)
        JOIN runs r USING (run_id)
        {"WHERE " + " AND ".join(where) if where else ""}
        ORDER BY s.created_at DESC, p.text, s.group_id, s.sample_idx
        LIMIT ?
    """
    return sql, params + wparams + [int(f.limit)]


def rollout_table(store: Store, f: RolloutFilter = RolloutFilter(), rule_version_id: str | None = None) -> pd.DataFrame:
    rv = rule_version_id or latest_rule_version(store)
    if rv is None:
        return pd.DataFrame(columns=["rollout_id", "prompt", "completion", "reward", "advantage", "correct",
                                     "n_tokens", "finish_reason", "run", "group_id", "sample_idx", "created_at"])
    return store.df(*rollout_table_sql(rv, f))


def rollout(store: Store, rollout_id: str, rule_version_id: str | None = None) -> dict | None:
    """One rollout with its prompt, reward, advantage and reward components."""
    rv = rule_version_id or latest_rule_version(store)
    base, params = scored_rollouts_sql(rv)
    rows = store.df(f"""
        SELECT s.*, p.text AS prompt, p.gold, p.task, r.name AS run, r.policy
        FROM ({base}) s JOIN prompts p USING (prompt_id) JOIN runs r USING (run_id)
        WHERE s.rollout_id = ?""", params + [rollout_id])
    if rows.empty:
        return None
    out = rows.iloc[0].to_dict()
    out["components"] = components(store, [rollout_id], rv).get(rollout_id, {})
    return out


def components(store: Store, rollout_ids: list[str], rule_version_id: str) -> dict[str, dict[str, float]]:
    """``{rollout_id: {component: value}}`` under one rule version."""
    if not rollout_ids:
        return {}
    df = store.df("""
        SELECT rollout_id, component, value FROM rewards
        WHERE rule_version_id = ? AND list_contains(?, rollout_id)
        ORDER BY component""", [rule_version_id, rollout_ids])
    out: dict[str, dict[str, float]] = {}
    for rid, comp, val in df.itertuples(index=False):
        out.setdefault(rid, {})[comp] = val
    return out


def tokens(store: Store, rollout_id: str) -> pd.DataFrame:
    """The rollout's tokens in order, with top-k alternatives decoded to text."""
    return store.df("""
        SELECT pos, token_id, token_text, logprob, entropy, topk_ids, topk_logprobs, step_idx
        FROM tokens WHERE rollout_id = ? ORDER BY pos""", [rollout_id])


def group(store: Store, group_id: str, rule_version_id: str | None = None) -> pd.DataFrame:
    """All completions of one group with reward, advantage and every component as a column."""
    rv = rule_version_id or latest_rule_version(store)
    base, params = scored_rollouts_sql(rv)
    df = store.df(f"""
        SELECT s.*, p.text AS prompt, p.gold, p.task, r.policy
        FROM ({base}) s JOIN prompts p USING (prompt_id) JOIN runs r USING (run_id)
        WHERE s.group_id = ? ORDER BY s.sample_idx, s.rollout_id""", params + [group_id])
    comps = components(store, df["rollout_id"].tolist(), rv)
    names = sorted({c for d in comps.values() for c in d if c != "total"})
    for c in names:
        df[c] = [comps.get(r, {}).get(c) for r in df["rollout_id"]]
    df.attrs["components"] = names
    return df


def groups(store: Store, run_id: str | None = None, rule_version_id: str | None = None) -> pd.DataFrame:
    """One row per group: prompt, size, mean reward, and whether all rewards are equal."""
    rv = rule_version_id or latest_rule_version(store)
    base, params = scored_rollouts_sql(rv)
    where, wp = ("WHERE s.run_id = ?", [run_id]) if run_id else ("", [])
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


def prompt_of(store: Store, prompt_id: str) -> Prompt:
    row = store.cursor().execute("SELECT text, gold, meta FROM prompts WHERE prompt_id = ?", [prompt_id]).fetchone()
    if row is None:
        raise KeyError(f"no prompt {prompt_id!r}")
    return Prompt(row[0], json.loads(row[1] or "{}"), json.loads(row[2] or "{}"))


def sample_prompts(store: Store, limit: int = 200) -> list[str]:
    """Prompt texts already in the store, for the generate panel's picker."""
    return [r[0] for r in store.cursor().execute(
        "SELECT text FROM prompts ORDER BY text LIMIT ?", [limit]).fetchall()]
