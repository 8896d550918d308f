"""An agent trajectory's turns as read from the store: the turns, their per-turn rewards, counts.

A rollout without ``turns`` rows (every single answer, every store from before schema 9) reads
as one assistant turn over all its tokens, so a view draws both kinds the same way.
"""
from __future__ import annotations

import pandas as pd

from studio.store import Store

TURN_COLUMNS = ["rollout_id", "turn_idx", "role", "start_pos", "end_pos", "content", "tool_name", "tool_args",
                "tool_call_id", "error"]


def turns_of(store: Store, rollout_ids: list[str] | str) -> pd.DataFrame:
    """The turns of each rollout in ``rollout_ids``, in order (``TURN_COLUMNS``).

    A rollout with no stored turns gets one assistant turn: positions 0 .. n_tokens, its text.
    """
    ids = [rollout_ids] if isinstance(rollout_ids, str) else list(rollout_ids)
    if not ids:
        return pd.DataFrame(columns=TURN_COLUMNS)
    return store.df(f"""
        SELECT {', '.join(TURN_COLUMNS)} FROM turns WHERE rollout_id IN (SELECT unnest(?::VARCHAR[]))
        UNION ALL
        SELECT r.rollout_id, 0, 'assistant', 0, coalesce(r.n_tokens, 0), r.text, NULL, NULL, NULL, NULL
        FROM rollouts r WHERE r.rollout_id IN (SELECT unnest(?::VARCHAR[]))
          AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.rollout_id = r.rollout_id)
        ORDER BY rollout_id, turn_idx""", [ids, ids])


def turn_rewards_of(store: Store, rollout_ids: list[str], sources: list[str] | None = None) -> pd.DataFrame:
    """``turn_rewards`` rows (rollout_id, turn_idx, source, value) of the rollouts, of ``sources`` or all."""
    if not rollout_ids:
        return pd.DataFrame(columns=["rollout_id", "turn_idx", "source", "value"])
    where, params = "", [list(rollout_ids)]
    if sources is not None:
        where, params = " AND source IN (SELECT unnest(?::VARCHAR[]))", params + [list(sources)]
    return store.df("SELECT rollout_id, turn_idx, source, value FROM turn_rewards "
                    f"WHERE rollout_id IN (SELECT unnest(?::VARCHAR[])){where} ORDER BY rollout_id, turn_idx, source",
                    params)


def turn_reward_sources(store: Store, rollout_ids: list[str] | None = None) -> list[str]:
    """The sources of per-turn rewards stored (for ``rollout_ids``, or anywhere), by name."""
    if rollout_ids is None:
        return store.df("SELECT DISTINCT source FROM turn_rewards ORDER BY source")["source"].tolist()
    return store.df("SELECT DISTINCT source FROM turn_rewards WHERE rollout_id IN (SELECT unnest(?::VARCHAR[])) "
                    "ORDER BY source", [list(rollout_ids)])["source"].tolist()


def tools_used(store: Store) -> list[str]:
    """The tools any stored trajectory called, by name (the table's tool filter offers them)."""
    return store.df("SELECT DISTINCT tool_name FROM turns WHERE role = 'assistant' AND tool_name IS NOT NULL "
                    "ORDER BY tool_name")["tool_name"].tolist()


def has_trajectories(store: Store, run_id: str | None = None) -> bool:
    """Whether the store (or run ``run_id``) holds an agent trajectory, a rollout with stored turns: the
    table's turns column and trajectory filters, and the per-turn credit settings, show only then."""
    if run_id is None:
        return bool(store.scalar("SELECT EXISTS (SELECT 1 FROM turns)"))
    return bool(store.scalar("""SELECT EXISTS (SELECT 1 FROM turns t JOIN rollouts r USING (rollout_id)
                                WHERE r.run_id = ?)""", [run_id]))
