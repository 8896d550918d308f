"""Reads the views show as they come: one rollout, its components, its tokens (of one or many
rollouts), a group with its components, the groups, the runs, the reward bounds and counts.

Each is a thin runner over the scoring SQL (:mod:`studio.queries.scoring`) or one read. The
point reads of a click (the token strip, the group view) read tokens from
``Store.tokens_between(lo, hi)``: only the shards whose id range meets the ids, so a click
opens one file however many shards there are; ids are passed as ``IN (SELECT unnest(?))``,
not ``list_contains``, so only the row groups holding them are read.
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from studio.queries.points import scored_group
from studio.queries.scoring import _components_dict, picked_sql, scored_rollouts_sql, versions_sql
from studio.signals.advantages import EQUAL_TOL, Credit
from studio.store import Store
from studio.tasks import Prompt


def rollout(store: Store, rollout_id: str, rule_version_id: str | None = None,
            credit: Credit | None = None) -> dict | None:
    """One rollout with its prompt, reward, advantage and reward components (None when it is not in
    the store): its row of :func:`scored_group`, the values :func:`scored_rollouts_sql` gives it."""
    row = scored_group(store, rollout_id, rule_version_id, credit).row(rollout_id)
    return None if row is None else dict(row)


def components(store: Store, rollout_ids: list[str], rule_version_id: str | None = None) -> dict[str, dict[str, float]]:
    """``{rollout_id: {component: value}}``, each rollout under the version :func:`versions_sql` picks."""
    if not rollout_ids:
        return {}
    # ids as a joined list (not list_contains per row): DuckDB pushes their range into the scans
    ids = "ro.rollout_id IN (SELECT unnest(?::VARCHAR[]))"
    versions, params = versions_sql(rule_version_id, ids)
    df = store.df(f"""
        WITH versions AS ({versions})
        SELECT rw.rollout_id, rw.component, rw.value FROM versions ve
        JOIN rewards rw ON ve.rollout_id = rw.rollout_id AND ve.rule_version_id = rw.rule_version_id
        ORDER BY rw.component""", params + [list(rollout_ids)])
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


# a token's turn and whether it is trained (the loss mask), NULL read as turn 0 / trained (a store from before
# schema 9, a single answer)
TOKEN_COLUMNS = ("pos, token_id, token_text, logprob, entropy, topk_ids, topk_logprobs, step_idx, "
                 "coalesce(turn_idx, 0) AS turn_idx, coalesce(trained, true) AS trained")


def tokens(store: Store, rollout_id: str) -> pd.DataFrame:
    """The rollout's tokens in order with their statistics (top-k alternatives as ids), each token's
    ``turn_idx`` and ``trained`` (False on a tool response's tokens: no statistics)."""
    # ordered here, not by ORDER BY: a rollout's tokens are written in order, so they mostly come back
    # in order, and DuckDB's sort costs a millisecond even on a hundred rows
    df = _small_df(store, f"SELECT {TOKEN_COLUMNS} FROM {store.tokens_between(rollout_id, rollout_id)} "
                   "WHERE rollout_id = ?", [rollout_id])
    if not df["pos"].is_monotonic_increasing:
        df = df.sort_values("pos", kind="stable", ignore_index=True)
    return df


def _small_df(store: Store, sql: str, params: list) -> pd.DataFrame:
    """A read as :meth:`Store.df` returns it, built from DuckDB's numpy arrays: for a point read,
    pandas' conversion inside ``.df()`` takes longer than the read (~4 ms of one rollout's ~9).
    The dtypes and NULLs are ``.df()``'s (tests/test_fast_header.py checks them): nullable integers
    as ``Int32``, NULL floats as NaN, NULL strings as NaN (all NULL: None), NULL lists as ``pd.NA``."""
    types, cols = store._read(sql, params, None, lambda cur: ([str(d[1]) for d in cur.description], cur.fetchnumpy()))
    for (name, col), kind in zip(list(cols.items()), types, strict=True):
        if not isinstance(col, np.ma.MaskedArray):
            continue
        mask = np.ma.getmaskarray(col)
        if not mask.any():
            cols[name] = col.data
        elif col.dtype.kind in "iu":
            cols[name] = pd.arrays.IntegerArray(col.data, mask)
        elif col.dtype.kind == "b":
            cols[name] = pd.arrays.BooleanArray(col.data, mask)
        elif col.dtype == object:
            cols[name] = np.where(mask, None if kind == "VARCHAR" else pd.NA, col.data)
        else:  # floats: NaN, times: NaT
            cols[name] = col.filled(np.datetime64("NaT") if col.dtype.kind in "mM" else np.nan)
    return pd.DataFrame(cols)


def tokens_of(store: Store, rollout_ids: list[str]) -> dict[str, pd.DataFrame]:
    """Tokens of several rollouts in one query: ``{rollout_id: tokens in order}``."""
    ids = [str(r) for r in rollout_ids]
    if not ids:
        return {}
    # IN (SELECT unnest(?)), not list_contains(?, rollout_id): a semi join whose ids DuckDB pushes into the
    # scan, so only the row groups holding them are read (list_contains reads every column of those row groups).
    # The range of the ids first, a filter the scan applies before it hashes: a group's ids are made together
    # and sort together, so most rows fail it at once (a group's read ~2x faster, on 5k and on 1M rollouts)
    df = _small_df(store, f"SELECT rollout_id, {TOKEN_COLUMNS} FROM {store.tokens_between(min(ids), max(ids))} "
                   "WHERE rollout_id BETWEEN ? AND ? "
                   "AND rollout_id IN (SELECT unnest(?::VARCHAR[])) ORDER BY rollout_id, pos",
                   [min(ids), max(ids), ids])
    # the rows come sorted by rollout: cut them where the id changes (a groupby took ~5x longer, on the loop's GIL)
    got = df["rollout_id"].to_numpy()
    cuts = (np.flatnonzero(got[1:] != got[:-1]) + 1).tolist()
    body = df.drop(columns="rollout_id")
    return {got[a]: body.iloc[a:b].reset_index(drop=True)
            for a, b in zip([0] + cuts, cuts + [len(got)], strict=True) if b > a}


def group(store: Store, group_id: str, rule_version_id: str | None = None,
          credit: Credit | None = None) -> pd.DataFrame:
    """All completions of one group with reward, advantage and every component as a column."""
    base, params = scored_rollouts_sql(rule_version_id, "ro.group_id = ?", [group_id], credit, components=True)
    df = store.df(f"""
        SELECT s.* EXCLUDE (_components), p.text AS prompt, p.gold, p.task, r.policy, s._components
        FROM ({base}) s JOIN prompts p USING (prompt_id) JOIN runs r USING (run_id)
        ORDER BY s.sample_idx, s.rollout_id""", params)
    comps = {rid: _components_dict(cs) for rid, cs in zip(df["rollout_id"], df.pop("_components"), strict=True)}
    comps = {rid: d for rid, d in comps.items() if d}
    names = sorted({c for d in comps.values() for c in d if c != "total"})
    for c in names:
        df[c] = [comps.get(r, {}).get(c) for r in df["rollout_id"]]
    df.attrs["components"] = names
    return df


def groups(store: Store, run_id: str | None = None, rule_version_id: str | None = None,
           group_ids: list[str] | None = None, limit: int | None = None) -> pd.DataFrame:
    """One row per group, newest first: prompt, size, mean reward, ``n_correct`` and ``accuracy``
    (rollouts whose ``correct`` is true, and their share of the checked ones: the rollouts' own
    correctness, whatever version is shown), and whether all rewards are equal. ``group_ids``: only
    these groups; ``limit``: only the newest this many (both read just those groups' rows)."""
    conds, sparams = ["TRUE"], []
    if run_id:
        conds.append("ro.run_id = ?")
        sparams.append(run_id)
    if group_ids is not None:
        conds.append("ro.group_id IN (SELECT unnest(?::VARCHAR[]))")
        sparams.append(list(group_ids))
    if limit is not None:
        conds.append(f"""ro.group_id IN (SELECT group_id FROM rollouts ro WHERE {' AND '.join(conds)}
                                          GROUP BY group_id ORDER BY max(created_at) DESC NULLS LAST LIMIT ?)""")
        sparams = sparams + sparams + [int(limit)]
    scope = " AND ".join(conds)
    picked, params = picked_sql(rule_version_id, scope, sparams)  # rewards only: no advantage is shown
    return store.df(f"""
        WITH picked AS ({picked})
        SELECT ro.group_id, any_value(p.text) AS prompt, any_value(r.name) AS run, count(*) AS size,
               avg(pk.reward) AS mean_reward, count(*) FILTER (WHERE ro.correct) AS n_correct,
               avg(CASE WHEN ro.correct THEN 1.0 WHEN NOT ro.correct THEN 0.0 END) AS accuracy,
               coalesce(max(pk.reward) - min(pk.reward) <= {EQUAL_TOL!r}, true) AS all_equal,
               max(ro.created_at) AS created_at
        FROM rollouts ro LEFT JOIN picked pk ON pk.rollout_id = ro.rollout_id
        JOIN prompts p USING (prompt_id) JOIN runs r USING (run_id)
        WHERE {scope}
        GROUP BY ro.group_id ORDER BY created_at DESC, prompt""", params + sparams)


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
