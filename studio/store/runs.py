"""Run rows: a run starts ``running`` and ends with one status (the only value ever overwritten)."""
from __future__ import annotations

import json

import pandas as pd

from studio.store import Store
from studio.store.records import new_id, now


def start_run(store: Store, kind: str, name: str, policy: str, task: str, config: dict,
              parent_run_id: str | None = None) -> str:
    run_id = new_id("run_")
    store.write({"runs": pd.DataFrame([{
        "run_id": run_id, "kind": kind, "name": name, "policy": policy, "task": task,
        "config": json.dumps(config), "parent_run_id": parent_run_id, "created_at": now(), "status": "running"}])})
    return run_id


def set_status(store: Store, run_id: str, status: str) -> None:
    with store.transaction() as cur:
        cur.execute("UPDATE runs SET status = ? WHERE run_id = ?", [status, run_id])
