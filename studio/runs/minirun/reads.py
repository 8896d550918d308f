"""What the store holds of mini-runs, read for views and the CLI: the runs, their metrics,
a summary per run, their checkpoints.

Checkpoints are full policy folders under ``<store folder>/checkpoints/<run_id>/step-k``
(:func:`checkpoint_root`); :func:`checkpoints` lists those still on disk, so every policy
picker can offer them.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pandas as pd

from studio.store import Store

AGENT_METRICS = ("agent/turns", "agent/tool_calls", "agent/tool_errors")  # per trajectory, means over a step
CURVES = ("reward_mean", "accuracy", "entropy", "kl", "clip_frac", "completion_len", "all_equal_share",
          "grad_norm", "step_s", *AGENT_METRICS)  # the metrics the mini-run view draws as curves (those a run has)


def metrics(store: Store, run_ids: list[str]) -> pd.DataFrame:
    """Long metrics of runs: ``run_id, name (run name), train_step, metric, value`` (held-out evaluations apart)."""
    return store.df("""SELECT m.run_id, r.name AS run, m.train_step, m.name AS metric, m.value
                       FROM metrics m JOIN runs r USING (run_id)
                       WHERE list_contains(?, m.run_id) AND m.name <> 'checkpoint' AND NOT starts_with(m.name, 'heldout/')
                       ORDER BY m.run_id, m.train_step""",
                    [run_ids])


def heldout(store: Store, run_ids: list[str]) -> pd.DataFrame:
    """Each run's newest held-out evaluation (``heldout/*`` metrics, :func:`~studio.runs.minirun.evaluate_run`):
    ``run_id, train_step (the evaluated checkpoint), figure, value``."""
    return store.df("""SELECT run_id, train_step, substr(name, 9) AS figure, value FROM metrics
                       WHERE list_contains(?, run_id) AND starts_with(name, 'heldout/')
                       QUALIFY train_step = max(train_step) OVER (PARTITION BY run_id)
                       ORDER BY run_id, figure""", [run_ids])


SUMMARY = ("reward_mean", "accuracy", "entropy", "kl", "completion_len", "all_equal_share", "step_s", *AGENT_METRICS)


def summary(store: Store, run_ids: list[str], last: int = 5) -> pd.DataFrame:
    """One row per run for comparing them at a glance: ``run_id, name, status, steps, estimator,
    learning_rate, reward (rule version)``, then for each metric of :data:`SUMMARY` its mean
    over the first ``w`` steps (``<metric>_start``) and over the last ``w`` (``<metric>``),
    with ``w`` = ``last``, or half the steps of a shorter run; runs in the order given."""
    m = store.df("""WITH m AS (SELECT run_id, train_step, name, value,
                                      row_number() OVER (PARTITION BY run_id, name ORDER BY train_step DESC) AS back,
                                      row_number() OVER (PARTITION BY run_id, name ORDER BY train_step) AS fwd,
                                      least(?, greatest(1, count(*) OVER (PARTITION BY run_id, name) // 2)) AS w
                               FROM metrics WHERE list_contains(?, run_id) AND list_contains(?, name))
                    SELECT run_id, name, avg(value) FILTER (back <= w) AS last, avg(value) FILTER (fwd <= w) AS first,
                           max(train_step) AS steps
                    FROM m GROUP BY ALL""", [last, run_ids, list(SUMMARY)])
    runs = store.df("SELECT run_id, name, status, config FROM runs WHERE list_contains(?, run_id)", [run_ids])
    rows = []
    for r in runs.itertuples():
        cfg = json.loads(r.config) if isinstance(r.config, str) else {}
        mine = m[m["run_id"] == r.run_id].set_index("name")
        row = {"run_id": r.run_id, "name": r.name, "status": r.status,
               "steps": int(mine["steps"].max()) if len(mine) else 0, "total": cfg.get("steps"),
               "estimator": cfg.get("estimator"), "learning_rate": cfg.get("learning_rate"),
               "reward": cfg.get("reward_version")}
        for k in SUMMARY:
            row[k] = float(mine.at[k, "last"]) if k in mine.index else float("nan")
            row[f"{k}_start"] = float(mine.at[k, "first"]) if k in mine.index else float("nan")
        rows.append(row)
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    return out.set_index("run_id").loc[[r for r in run_ids if r in set(out["run_id"])]].reset_index()


def miniruns(store: Store) -> pd.DataFrame:
    """Every mini-run: ``run_id, name, status, error, created_at, steps (stored), total`` (newest first)."""
    df = store.df("""SELECT r.run_id, r.name, r.status, r.error, r.created_at, r.config,
                            (SELECT max(train_step) FROM metrics m
                             WHERE m.run_id = r.run_id AND m.name = 'step_s') AS steps
                     FROM runs r WHERE r.kind = 'minirun' ORDER BY r.created_at DESC""")
    df["total"] = [json.loads(c).get("steps") if isinstance(c, str) else None for c in df["config"]]
    return df.drop(columns=["config"])


def checkpoint_root(store: Store) -> Path:
    """Where a store's mini-runs keep their checkpoints: ``checkpoints`` in the store's home folder
    (``Store.home``: the file's folder, a shared store's own) or a temporary folder for an in-memory store."""
    if store.kind == "memory":
        return Path(tempfile.gettempdir()) / "studio-checkpoints"
    return store.home / "checkpoints"


def checkpoints(store: Store) -> pd.DataFrame:
    """Every stored mini-run checkpoint: ``run_id, name, step, path`` (newest first)."""
    rows = store.df("""SELECT m.run_id, r.name, m.train_step AS step FROM metrics m JOIN runs r USING (run_id)
                       WHERE m.name = 'checkpoint' ORDER BY r.created_at DESC, m.train_step DESC""")
    root = checkpoint_root(store)
    rows["path"] = [str(root / rid / f"step-{int(s):05d}")
                    for rid, s in zip(rows["run_id"], rows["step"], strict=False)]
    return rows[[Path(p).is_dir() for p in rows["path"]]].reset_index(drop=True)


def last_checkpoint(store: Store, run_id: str) -> tuple[int, str] | None:
    """``(step, path)`` of a run's newest checkpoint on disk, or None."""
    cps = checkpoints(store)
    cps = cps[cps["run_id"] == run_id]
    if cps.empty:
        return None
    best = cps.sort_values("step").iloc[-1]
    return int(best["step"]), best["path"]
