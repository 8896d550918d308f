"""Answers and correctness of stored rollouts their task can check, filled in where still unknown
(a store from before schema 8, a seed's files, an import that brought gold answers)."""
from __future__ import annotations

import json

import duckdb
import pandas as pd


def fill_verdicts(cur: duckdb.DuckDBPyConnection, run_id: str | None = None) -> int:
    """Set ``answer`` and ``correct`` of the rollouts not yet checked (``correct`` NULL) that their
    task can check: a prompt with a gold answer, a task this process knows or the store defines, a run that is not an
    import (an import's correctness is its own field's) unless ``run_id`` names it (an import that brought gold
    answers and no correctness field: its task verifies them). The task's :meth:`~studio.tasks.Task.verdict`
    in Python, the results joined back in one ``UPDATE … FROM`` a registered DataFrame (inside the
    caller's transaction). Returns how many rollouts were checked."""
    from studio.tasks import Prompt, get_task
    from studio.tasks.base import UnknownTaskError, from_spec

    rows = cur.execute("""
        SELECT ro.rollout_id, coalesce(p.task, r.task), p.text, p.gold::VARCHAR, ro.text
        FROM rollouts ro JOIN prompts p ON p.prompt_id = ro.prompt_id JOIN runs r ON r.run_id = ro.run_id
        WHERE ro.correct IS NULL AND coalesce(p.gold->>'answer', '') <> ''
          AND (r.run_id = ? OR (? IS NULL AND r.kind <> 'import'))""", [run_id, run_id]).fetchall()
    tasks: dict = {}
    ids, answers, verdicts = [], [], []
    for rid, task_name, prompt, gold, text in rows:
        if task_name not in tasks:
            try:
                tasks[task_name] = get_task(task_name)
            except UnknownTaskError:  # a task this store defines, not yet known to the process (a seed's)
                spec = cur.execute("SELECT spec FROM tasks WHERE name = ?", [task_name]).fetchall()
                try:
                    tasks[task_name] = from_spec(json.loads(spec[0][0])) if spec else None
                except Exception:  # noqa: BLE001 - a spec this version cannot rebuild: its rollouts stay unchecked
                    tasks[task_name] = None
        task = tasks[task_name]
        if task is None:
            continue
        try:
            answer, ok = task.verdict(Prompt(prompt, json.loads(gold)), text or "")
        except Exception:  # noqa: BLE001 - a completion its task cannot read stays unchecked
            continue
        ids.append(rid)
        answers.append(answer)
        verdicts.append(ok)
    if ids:
        frame = pd.DataFrame({"rollout_id": ids, "answer": pd.array(answers, dtype=object),
                              "correct": pd.array(verdicts, dtype="boolean")})
        cur.register("_verdicts", frame)
        try:
            cur.execute("""UPDATE rollouts SET answer = v.answer, correct = v.correct FROM _verdicts v
                           WHERE rollouts.rollout_id = v.rollout_id""")
        finally:
            cur.unregister("_verdicts")
    return len(ids)
