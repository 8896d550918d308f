"""Prompt sets as read from the store: the stored tasks, their splits, and seeded draws of prompts.

A stored task's prompts are rows of ``prompts`` whose ``meta`` carries their split (and level);
:func:`draw_prompts` picks ``n`` of them in DuckDB, ordered by a hash of the prompt id and the
seed, so the same seed draws the same prompts in every process. A built-in task that makes its
prompts (arithmetic) makes them instead, its difficulty standing for the split or level.
"""
from __future__ import annotations

import json

import pandas as pd

from studio.errors import StudioError
from studio.store import Store
from studio.tasks import Prompt, UnknownTaskError, get_task, task_names

SPLIT = "json_extract_string(meta, '$.split')"
LEVEL = "json_extract_string(meta, '$.level')"


class PromptDrawError(StudioError, ValueError):
    """A draw the task cannot give: a split or level it lacks, or a count that is no count."""


def stored_tasks(store: Store) -> pd.DataFrame:
    """Every task the store defines: ``name``, ``kind``, ``source``, ``n_prompts``, ``splits``
    (split → prompt count, in the task's order), ``created_at``; by name."""
    tasks = store.df("SELECT name, kind, source, n_prompts, spec, created_at FROM tasks ORDER BY name")
    counts = store.df(f"SELECT task, {SPLIT} AS split, count(*) AS n FROM prompts "
                      f"WHERE task IN (SELECT name FROM tasks) AND {SPLIT} IS NOT NULL GROUP BY ALL")
    by_task: dict[str, dict[str, int]] = {}
    for task, split, n in counts.itertuples(index=False):
        by_task.setdefault(task, {})[split] = int(n)
    splits = []
    for name, spec in zip(tasks["name"], tasks["spec"], strict=True):
        found = by_task.get(name, {})
        order = [s for s in json.loads(spec).get("splits", []) if s in found]
        splits.append({s: found[s] for s in order + sorted(set(found) - set(order))})
    tasks["splits"] = splits
    return tasks[["name", "kind", "source", "n_prompts", "splits", "created_at"]]


def _is_stored(store: Store, task: str) -> bool:
    return bool(store.scalar("SELECT count(*) FROM tasks WHERE name = ?", [task]))


def task_choices(store: Store) -> list[str]:
    """The tasks prompts can be drawn from: the built-in tasks that make prompts, then the store's."""
    stored = list(store.df("SELECT name FROM tasks ORDER BY name")["name"])
    builtin = [n for n in task_names() if n not in stored and get_task(n).spec.get("kind") == "builtin"
               and get_task(n).generates]
    return builtin + stored


def split_counts(store: Store, task: str) -> dict[str, int]:
    """Split → number of stored prompts of ``task`` (empty for a task that makes its prompts).

    Raises:
        UnknownTaskError: neither a known task nor one the store defines (the message names them).
    """
    if not _is_stored(store, task):
        get_task(task)  # known (a built-in: no stored splits) or UnknownTaskError naming the known ones
        return {}
    row = stored_tasks(store).set_index("name").loc[task]
    return dict(row["splits"])


def draw_sql(task: str, n: int, seed: int, split: str | None = None, level: str | None = None
             ) -> tuple[str, list]:
    """SQL and parameters of a seeded draw of ``n`` stored prompts of ``task``: ordered by md5 of the
    prompt id and the seed (the same in every process and DuckDB version), then by id."""
    where, params = ["task = ?", f"{SPLIT} IS NOT NULL"], [task]
    if split is not None:
        where.append(f"{SPLIT} = ?")
        params.append(split)
    if level is not None:
        where.append(f"{LEVEL} = ?")
        params.append(str(level))
    sql = (f"SELECT text, gold, meta, messages FROM prompts WHERE {' AND '.join(where)} "
           "ORDER BY md5(prompt_id || ':' || ?), prompt_id LIMIT ?")
    return sql, params + [str(seed), n]


def draw_prompts(store: Store, task: str, n: int, seed: int = 0, split: str | None = None,
                 level: str | None = None) -> list[Prompt]:
    """``n`` prompts of ``task``, drawn deterministically from ``seed`` (fewer when the split holds
    fewer). A stored task's come from the store, of ``split`` and ``level`` when given; a built-in
    task that makes prompts (arithmetic) makes them, ``level`` or ``split`` naming its difficulty.

    Raises:
        UnknownTaskError: ``task`` is not known (the message names the known tasks).
        PromptDrawError: a split or level the task lacks (the message names those it has), or ``n`` < 1.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise PromptDrawError(f"draw at least one prompt: n must be a whole number ≥ 1, got {n!r}")
    if not _is_stored(store, task):
        the_task = get_task(task)
        if not the_task.generates:
            raise UnknownTaskError(f"task {task!r} has no prompts of its own: draw from a task the store defines "
                                   f"or one that makes prompts ({', '.join(task_choices(store))})")
        return _made(the_task, n, seed, split, level)
    counts = split_counts(store, task)
    if split is not None and split not in counts:
        raise PromptDrawError(f"task {task!r} has no split {split!r}; its splits: "
                              + ", ".join(f"{s} ({c:,} prompts)" for s, c in counts.items()))
    sql, params = draw_sql(task, n, seed, split, level)
    rows = store.df(sql, params)
    if rows.empty and level is not None:
        levels = store.df(f"SELECT DISTINCT {LEVEL} AS level FROM prompts WHERE task = ? AND {LEVEL} IS NOT NULL "
                          "ORDER BY level", [task])["level"].tolist()
        raise PromptDrawError(f"task {task!r} has no prompts of level {level!r}"
                              + (f" in split {split!r}" if split else "")
                              + (f"; its levels: {', '.join(levels)}" if levels else "; its prompts have no level"))
    return [Prompt(text=r.text, gold=json.loads(r.gold) if r.gold else {}, meta=json.loads(r.meta) if r.meta else {},
                   messages=tuple(json.loads(r.messages)) if isinstance(r.messages, str) else None)
            for r in rows.itertuples(index=False)]


def _made(task, n: int, seed: int, split: str | None, level: str | None) -> list[Prompt]:
    """Prompts a built-in task makes, its difficulty named by ``level`` or ``split`` (default medium)."""
    difficulty = level or split or "medium"
    try:
        return task.make_prompts(n, seed, difficulty)
    except ValueError as exc:
        raise PromptDrawError(f"task {task.name!r} makes its prompts; a split or level names its difficulty: {exc}"
                              ) from None
