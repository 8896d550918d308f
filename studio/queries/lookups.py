"""Small named reads the views need: ids, pickers' options and one-row facts.

Each is one parameterised query; views call these instead of writing SQL.
"""
from __future__ import annotations

import pandas as pd

from studio.store import Store


def group_of(store: Store, rollout_id: str) -> str | None:
    """The group of a rollout, or None when the store has no such rollout."""
    return store.scalar("SELECT group_id FROM rollouts WHERE rollout_id = ?", [rollout_id])


def rollouts_of_group(store: Store, group_id: str) -> list[str]:
    """The rollout ids of one group."""
    return store.df("SELECT rollout_id FROM rollouts WHERE group_id = ?", [group_id])["rollout_id"].tolist()


def rollouts_of_run(store: Store, run_id: str) -> list[str]:
    """The rollout ids of one run."""
    return store.df("SELECT rollout_id FROM rollouts WHERE run_id = ?", [run_id])["rollout_id"].tolist()


def rollouts_of_same_run(store: Store, rollout_id: str) -> list[str]:
    """The rollout ids of the run that ``rollout_id`` belongs to."""
    return store.df("SELECT rollout_id FROM rollouts WHERE run_id = (SELECT run_id FROM rollouts "
                    "WHERE rollout_id = ?)", [rollout_id])["rollout_id"].tolist()


def first_rollout_at_step(store: Store, run_id: str, step: int) -> str | None:
    """The first rollout (by group, then sample) a run sampled at training step ``step``."""
    return store.scalar("SELECT rollout_id FROM rollouts WHERE run_id = ? AND train_step = ? "
                        "ORDER BY group_id, sample_idx LIMIT 1", [run_id, int(step)])


def critic_versions(store: Store) -> list[str]:
    """Versions in ``token_scores`` that carry critic values (``value``)."""
    return store.df("SELECT DISTINCT policy_version FROM token_scores WHERE value IS NOT NULL "
                    "ORDER BY 1")["policy_version"].tolist()


def rule_version_ids(store: Store) -> list[str]:
    """Every rule version id, newest first."""
    return store.df("SELECT rule_version_id FROM rule_versions "
                    "ORDER BY created_at DESC, rule_version_id")["rule_version_id"].tolist()


def rule_versions_by_kind(store: Store) -> list[tuple[str, bool]]:
    """``(version id, is a reward model's)`` for every rule version, newest first."""
    vs = store.df("""SELECT rule_version_id AS v, coalesce(starts_with(source, '# reward model'), false) AS rm
                     FROM rule_versions ORDER BY created_at DESC, rule_version_id""")
    return [(v, bool(rm)) for v, rm in zip(vs["v"], vs["rm"], strict=True)]


def source_runs(store: Store) -> pd.DataFrame:
    """``run_id``, ``name`` of every run but mini-runs (prompt sources for a mini-run), oldest first."""
    return store.df("SELECT run_id, name FROM runs WHERE kind <> 'minirun' ORDER BY created_at")


def run_state(store: Store, run_id: str) -> dict | None:
    """``status``, ``error`` and ``config`` (JSON text) of one run, or None."""
    df = store.df("SELECT status, error, config FROM runs WHERE run_id = ?", [run_id])
    return df.iloc[0].to_dict() if len(df) else None


def steps_done(store: Store, run_id: str) -> int:
    """The last training step a mini-run finished (its ``step_s`` metric), 0 before the first."""
    return int(store.scalar("SELECT coalesce(max(train_step), 0) FROM metrics WHERE run_id = ? "
                            "AND name = 'step_s'", [run_id]))


def token_at(store: Store, rollout_id: str, pos: int) -> pd.DataFrame:
    """One stored token with its statistics (zero rows when there is none at ``pos``)."""
    return store.df("SELECT pos, token_id, token_text, logprob, entropy, topk_ids, topk_logprobs "
                    f"FROM {store.tokens_between(rollout_id, rollout_id)} "
                    "WHERE rollout_id = ? AND pos = ?", [rollout_id, pos])


def prefix_chars(store: Store, keys: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """Characters of each ``(rollout, pos)``'s tokens before ``pos`` (a fork's shared prefix)."""
    df = store.df("SELECT rollout_id, pos, token_text FROM tokens WHERE list_contains(?, rollout_id)",
                  [sorted({k[0] for k in keys})])
    out = {}
    for rid, pos in keys:
        part = df[(df["rollout_id"] == rid) & (df["pos"] < pos)]
        out[(rid, pos)] = int(part["token_text"].str.len().sum())
    return out


def rollout_facts(store: Store, rollout_id: str) -> dict | None:
    """What the conversation view of one rollout shows beyond its scored row: ``task``, ``prompt``
    (the prompt's text), ``messages`` (its chat, JSON text or None), ``prompt_text`` (the templated
    text the policy saw, or None), ``gold`` (JSON text), ``answer`` and ``correct`` (facts of the
    rollout, None where unknown), ``n_tokens``; None when the store has no such rollout."""
    df = store.df("SELECT p.task, p.text AS prompt, p.messages::VARCHAR AS messages, ro.prompt_text, "
                  "p.gold::VARCHAR AS gold, ro.answer, ro.correct, ro.n_tokens FROM rollouts ro "
                  "JOIN prompts p USING (prompt_id) WHERE ro.rollout_id = ?", [rollout_id])
    if df.empty:
        return None
    row = df.astype(object).iloc[0].to_dict()
    return {k: (None if v is None or v is pd.NA or (isinstance(v, float) and v != v) else v) for k, v in row.items()}


def scope_task(store: Store, run_id: str | None = None) -> str | None:
    """The task of a scope: the task of run ``run_id``'s prompts when given, else the task most of
    the store's rollouts are of (None for a store without rollouts)."""
    where, params = ("WHERE ro.run_id = ?", [run_id]) if run_id else ("", [])
    return store.scalar(f"SELECT p.task FROM rollouts ro JOIN prompts p USING (prompt_id) {where} "
                        "GROUP BY p.task ORDER BY count(*) DESC, p.task LIMIT 1", params)


def task_prompt_texts(store: Store, task: str, limit: int = 200) -> list[str]:
    """Prompt texts of ``task`` already in the store (the Generate panel's picker), by text."""
    return store.df("SELECT text FROM prompts WHERE task = ? ORDER BY text LIMIT ?", [task, limit])["text"].tolist()


def informative_rollout(store: Store) -> str | None:
    """A rollout worth opening first: the first row, in the table's order (newest first), of a
    group whose completions are both right and wrong (so its advantages differ) and that has
    per-token statistics to draw; the first drawn row when no group is mixed; None on an empty
    store."""
    return store.scalar("""
        WITH mixed AS (SELECT group_id FROM rollouts GROUP BY group_id
                       HAVING bool_or(correct) AND NOT bool_and(correct))
        SELECT ro.rollout_id FROM rollouts ro JOIN prompts p USING (prompt_id)
        WHERE EXISTS (SELECT 1 FROM tokens t WHERE t.rollout_id = ro.rollout_id)
        ORDER BY ro.group_id NOT IN (SELECT group_id FROM mixed),
                 ro.created_at DESC, p.text, ro.group_id, ro.sample_idx, ro.rollout_id
        LIMIT 1""")


def train_steps(store: Store, run_id: str | None = None) -> list[int]:
    """The training steps the rollouts of ``run_id`` (of every run: None) were sampled at, ascending:
    what the table's step filter offers (empty: rollouts sampled outside training)."""
    cond, params = ("run_id = ?", [run_id]) if run_id else ("TRUE", [])
    steps = store.df(f"SELECT DISTINCT train_step FROM rollouts WHERE {cond} AND train_step IS NOT NULL ORDER BY 1",
                     params)["train_step"]
    return [int(s) for s in steps]
