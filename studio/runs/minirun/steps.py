"""The owner's reader thread: every message of the training process, stored as it comes.

:func:`receive` runs on a thread of the owner for each live run. A finished step is written
by :func:`write_step` in one transaction: rollouts (with ``train_step`` and
``train_advantage``, the advantage the loss used, and the engine that sampled it), tokens (with
``train_weight``: advantage × entropy mask; ``logprob`` the sampler's, ``train_logprob`` the
trainer's at the weights the step started from, ``train_policy_version`` ``<run_id>@<step - 1>``), rewards under the run's rule version, and the step's metrics. A step is
stored whole or not at all, so a killed training process (even SIGKILL) leaves no partial
step: the reader marks the run ``failed`` with the reason (:func:`finish`).
"""
from __future__ import annotations

import queue as queue_mod

import numpy as np
import pandas as pd
import pyarrow as pa

from studio.runs.minirun.registry import RunState
from studio.store import Store
from studio.store.records import generation_rows
from studio.tasks import Prompt


def finish(store: Store, st: RunState, status: str, error: str | None = None) -> None:
    """Record how a run ended, on its state and its ``runs`` row."""
    st.status, st.error = status, error
    with store.transaction() as cur:
        cur.execute("UPDATE runs SET status = ?, error = ? WHERE run_id = ?", [status, error, st.run_id])


def receive(store: Store, st: RunState, q, task, prompts: list[Prompt], vid: str) -> None:
    """Receive the worker's messages and store them until it ends, however it ends."""
    proc = st.process
    ended = False
    while not ended:
        try:
            msg = q.get(timeout=0.5)
        except queue_mod.Empty:
            if not proc.is_alive():
                try:  # the last messages may still be in the pipe
                    msg = q.get(timeout=1.0)
                except queue_mod.Empty:
                    code = proc.exitcode
                    why = (f"the training process was killed by signal {-code}" if code is not None and code < 0
                           else f"the training process exited with code {code}")
                    finish(store, st, "failed", f"{why} during step {st.step + 1}; resume continues from the last "
                                                 f"checkpoint (step {max(st.checkpoints or [st.first_step - 1])})")
                    return
            else:
                continue
        try:
            ended = _handle(store, st, msg, task, vid)
        except Exception as exc:  # the store refused a write: stop the worker, say why
            st.stop_event.set()
            proc.kill()
            finish(store, st, "failed", f"storing step {st.step + 1} failed: {type(exc).__name__}: {exc}")
            return
    proc.join(timeout=30)


def _handle(store: Store, st: RunState, msg: dict, task, vid: str) -> bool:
    kind = msg["type"]
    if kind == "started":
        st.device = msg["device"]
        if st.status == "starting":
            st.status = "running"
    elif kind == "step":
        write_step(store, st.run_id, task, msg["output"], vid, msg["prompts_gold"])
        st.step = msg["output"].step
        st.step_times.append(msg["output"].metrics["step_s"])
    elif kind == "checkpoint":
        store.write({"metrics": pd.DataFrame([{"run_id": st.run_id, "train_step": msg["step"], "name": "checkpoint",
                                               "value": float(msg["step"])}])})
        st.checkpoints.append(msg["step"])
    elif kind == "done":
        finish(store, st, msg["status"])
        return True
    elif kind == "error":
        finish(store, st, "failed", msg["message"])
        return True
    return False


def write_step(store: Store, run_id: str, task, out, vid: str, golds: list[dict]) -> None:
    """One training step's rollouts, tokens, rewards and metrics: one transaction."""
    prompts = [Prompt(t, g) for t, g in zip(out.prompts, golds, strict=False)]
    lag = int(out.metrics.get("staleness", 0) or 0)  # overlapped sampling: drawn by the weights `lag` updates back
    # behaviour: the sampler's weights (`lag` updates back); train_logprob: the trainer's at the step's start
    rollouts, tokens, turns = generation_rows(run_id, task, prompts, out.generations, f"{run_id}@{out.step - 1 - lag}",
                                              train_step=out.step, train_policy_version=f"{run_id}@{out.step - 1}",
                                              train_engine=out.train_engine or None)
    rollouts["train_advantage"] = np.asarray(out.advantages, dtype=np.float64)
    weights = np.concatenate(out.token_weights) if out.token_weights else np.zeros(0)
    tokens = tokens.append_column("train_weight", pa.array(weights.astype(np.float32), pa.float32()))
    errs = out.reward_errors or [{} for _ in out.rewards]
    rw = [(rid, vid, comp, val, None if val is not None else (why.get(comp) or "the rule failed on this completion"))
          for rid, comps, why in zip(rollouts["rollout_id"], out.rewards, errs, strict=False)
          for comp, val in comps.items()]
    rewards = pd.DataFrame(rw, columns=["rollout_id", "rule_version_id", "component", "value", "error"])
    rewards["value"] = rewards["value"].astype("float64")
    metrics = pd.DataFrame([{"run_id": run_id, "train_step": out.step, "name": k, "value": float(v)}
                            for k, v in out.metrics.items()])
    with store.transaction() as cur:
        store.write({"rollouts": rollouts, "tokens": tokens, "turns": turns, "rewards": rewards, "metrics": metrics},
                    cur=cur)
