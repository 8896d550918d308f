"""Mini-runs, the owner side: start, watch, stop, resume, evaluate; write every step.

The owner process (the server, or the CLI ``python -m studio.minirun``) holds the store.
:func:`start` checks the settings, records the run (``runs.kind = 'minirun'``, its config
as JSON) and starts :func:`studio.runs.training.train_worker` in its own process. A reader
thread receives each finished step and writes it in one transaction: rollouts (with
``train_step`` and ``train_advantage``, the advantage the loss used), tokens (with
``train_weight``: advantage × entropy mask), rewards under the run's rule version, and the
step's metrics. A step is stored whole or not at all, so a killed worker (even SIGKILL)
leaves no partial step: the reader marks the run ``failed`` with the reason, and
:func:`resume` restarts it from its last checkpoint (dropping any stored steps after it).

Checkpoints are full policy folders under ``<store folder>/checkpoints/<run_id>/step-k``;
:func:`checkpoints` lists them so every policy picker can offer them.
"""
from __future__ import annotations

import functools
import json
import multiprocessing
import os
import queue as queue_mod
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from studio.errors import NOT_DONE, StudioError
from studio.runs.training import MiniRunConfig, TrainConfigError, heldout_prompts, task_prompts
from studio.store import Store, schema
from studio.store.records import generation_rows, new_id, now, prompt_rows
from studio.tasks import Prompt, get_task
from studio.workers.vocab import policy_label, resolve_policy

CURVES = ("reward_mean", "accuracy", "entropy", "kl", "clip_frac", "completion_len", "all_equal_share",
          "grad_norm", "step_s")


class MiniRunBusy(StudioError, RuntimeError):
    """Another mini-run holds the machine (or the policy)."""

    exit_code = NOT_DONE


@dataclass
class RunState:
    """What the owner knows about a live (or just ended) mini-run; views poll it."""

    run_id: str
    name: str
    policy: str
    total_steps: int
    first_step: int = 1
    step: int = 0  # last stored step
    status: str = "starting"  # starting | running | stopping | done | stopped | failed
    error: str | None = None
    device: str | None = None
    started: float = field(default_factory=time.time)
    step_times: list[float] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)
    process: object = None
    stop_event: object = None

    @property
    def live(self) -> bool:
        return self.status in ("starting", "running", "stopping")

    def eta_s(self) -> float | None:
        """Seconds left, from the median of the last 10 steps."""
        if not self.step_times:
            return None
        return float(np.median(self.step_times[-10:])) * max(0, self.total_steps - self.step)


_lock = threading.Lock()
_runs: dict[str, RunState] = {}


def live_runs() -> list[RunState]:
    with _lock:
        return [r for r in _runs.values() if r.live]


def state_of(run_id: str) -> RunState | None:
    with _lock:
        return _runs.get(run_id)


@functools.lru_cache(maxsize=1)
def capacity() -> int:
    """Concurrent mini-runs this machine takes: one on a CPU, two with a GPU of 40 GB+.
    Asks ``nvidia-smi`` (the server does not import torch)."""
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi") or os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return 1
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout.split()
        return 2 if out and float(out[0]) >= 40 * 1024 else 1  # MiB
    except (OSError, ValueError, subprocess.SubprocessError):
        return 1


def checkpoint_root(store: Store) -> Path:
    if store.path in (None, ":memory:"):
        return Path(tempfile.gettempdir()) / "studio-checkpoints"
    return Path(store.path).expanduser().resolve().parent / "checkpoints"


def checkpoints(store: Store) -> pd.DataFrame:
    """Every stored mini-run checkpoint: ``run_id, name, step, path`` (newest first)."""
    rows = store.df("""SELECT m.run_id, r.name, m.train_step AS step FROM metrics m JOIN runs r USING (run_id)
                       WHERE m.name = 'checkpoint' ORDER BY r.created_at DESC, m.train_step DESC""")
    root = checkpoint_root(store)
    rows["path"] = [str(root / rid / f"step-{int(s):05d}") for rid, s in zip(rows["run_id"], rows["step"])]
    return rows[[Path(p).is_dir() for p in rows["path"]]].reset_index(drop=True)


def _reward_spec(store: Store, version: str, task: str) -> tuple[dict, str, pd.DataFrame | None]:
    """(spec for the worker, the rule version id the rewards are stored under, version row to write)."""
    from studio.rewards import DEFAULT_RULES, rule_version_frame
    from studio.rewards.rules import SOURCES_MARK

    if not version:
        rule = DEFAULT_RULES[task]
        return {"kind": "builtin"}, rule.version_id, rule_version_frame(rule)
    src = store.scalar("SELECT source FROM rule_versions WHERE rule_version_id = ?", [version])
    if src is None:
        raise TrainConfigError(f"rule version {version!r} is not in this store")
    builtin = {r.version_id: r for r in DEFAULT_RULES.values()}
    if version in builtin:
        return {"kind": "builtin"}, version, None
    if src.startswith("# reward model "):
        from backends import check_policy_folder
        from backends.types import weights_version

        folder = src.splitlines()[0].removeprefix("# reward model ").strip()
        try:
            check_policy_folder(folder)
        except ValueError as exc:
            raise TrainConfigError(f"{version} scores with a reward model that is gone: {exc}") from None
        if f"rm-{weights_version(folder)}" != version:
            raise TrainConfigError(f"the reward model behind {version} has changed on disk since it scored; score the "
                                   "rollouts with it again and train on the new version")
        return {"kind": "reward_model", "path": folder}, version, None
    if SOURCES_MARK in src:
        raise TrainConfigError(f"{version} reads other versions' rewards (ctx sources), which new rollouts do not "
                               "have yet; train on a rule without them")
    return {"kind": "rule", "source": src}, version, None


def _training_prompts(store: Store, cfg: MiniRunConfig, task) -> list[Prompt]:
    if cfg.prompt_set.startswith("run:"):
        rid = cfg.prompt_set[4:]
        df = store.df("""SELECT DISTINCT p.text, p.gold FROM rollouts ro JOIN prompts p USING (prompt_id)
                         WHERE ro.run_id = ? ORDER BY 1""", [rid])
        if df.empty:
            raise TrainConfigError(f"run {rid!r} has no prompts in this store")
        return [Prompt(t, json.loads(g) if isinstance(g, str) else g) for t, g in zip(df["text"], df["gold"])]
    return task_prompts(task, cfg.prompt_set, cfg.n_prompts, cfg.seed)


def start(store: Store, cfg: MiniRunConfig, name: str | None = None, task: str = "arithmetic",
          resume_run: str | None = None) -> str:
    """Start a mini-run (or resume ``resume_run``) and return its run id; the work goes on
    in the background. Raises :class:`TrainConfigError` for bad settings and
    :class:`MiniRunBusy` when another run holds the machine."""
    from backends import check_policy_folder

    cfg.validate()
    the_task = get_task(task)
    folder = resolve_policy(cfg.policy)
    check_policy_folder(folder)
    spec, vid, version_row = _reward_spec(store, cfg.rule_version, the_task.name)
    prompts = _training_prompts(store, cfg, the_task)
    label = policy_label(folder)
    with _lock:
        busy = [r for r in _runs.values() if r.live]
        same = [r for r in busy if r.policy == label]
        if same:
            raise MiniRunBusy(f"{same[0].name} is training this policy (step {same[0].step}/{same[0].total_steps}); "
                              "stop it or wait for it to finish")
        if len(busy) >= capacity():
            raise MiniRunBusy(f"{busy[0].name} is using the machine (this machine trains {capacity()} mini-run at a "
                              "time); stop it or wait for it to finish")
        if resume_run:
            run_id, first, ckpt = _prepare_resume(store, resume_run)
            run_name = store.scalar("SELECT name FROM runs WHERE run_id = ?", [run_id])
        else:
            run_id, first, ckpt = new_id("run_"), 1, None
            run_name = name or f"mini-run · {cfg.estimator} · {cfg.steps} steps"
            rows = {"runs": pd.DataFrame([{
                "run_id": run_id, "kind": "minirun", "name": run_name, "policy": label, "task": the_task.name,
                "config": json.dumps(cfg.to_dict() | {"reward_version": vid}), "created_at": now(),
                "status": "running"}]), "prompts": prompt_rows(the_task, prompts)}
            if version_row is not None:
                rows["rule_versions"] = version_row
            store.write(rows)
        st = RunState(run_id, run_name, label, cfg.steps, first_step=first, step=first - 1)
        _runs[run_id] = st
    ctx = multiprocessing.get_context("spawn")
    q, stop_event = ctx.Queue(), ctx.Event()
    ckpt_dir = checkpoint_root(store) / run_id
    proc = ctx.Process(target=_worker_entry, name=f"minirun-{run_id}", daemon=False, args=(
        cfg.to_dict(), str(folder), spec, [{"text": p.text, "gold": p.gold} for p in prompts], the_task.name,
        str(ckpt_dir), first, ckpt, q, stop_event, os.getpid()))
    st.process, st.stop_event = proc, stop_event
    try:
        proc.start()
    except Exception as exc:
        _finish(store, st, "failed", f"the training process did not start: {exc}")
        raise
    threading.Thread(target=_reader, args=(store, st, q, the_task, prompts, vid), daemon=True,
                     name=f"minirun-reader-{run_id}").start()
    return run_id


def _worker_entry(*args) -> None:
    from backends.device import yield_to_server
    from studio.runs.training import train_worker

    yield_to_server()  # training waits for pages, not pages for training
    train_worker(*args)


def stop(run_id: str) -> bool:
    """Ask a live run to stop after the step in flight (it saves a checkpoint first)."""
    st = state_of(run_id)
    if st is None or not st.live:
        return False
    st.status = "stopping"
    st.stop_event.set()
    return True


def last_checkpoint(store: Store, run_id: str) -> tuple[int, str] | None:
    cps = checkpoints(store)
    cps = cps[cps["run_id"] == run_id]
    if cps.empty:
        return None
    best = cps.sort_values("step").iloc[-1]
    return int(best["step"]), best["path"]


def _prepare_resume(store: Store, run_id: str) -> tuple[str, int, str | None]:
    kind = store.scalar("SELECT kind FROM runs WHERE run_id = ?", [run_id])
    if kind != "minirun":
        raise TrainConfigError(f"{run_id!r} is not a mini-run of this store")
    last = last_checkpoint(store, run_id)
    k, path = last if last else (0, None)
    with store.transaction() as cur:  # steps after the checkpoint are trained again: drop them whole
        later = "SELECT rollout_id FROM rollouts WHERE run_id = ? AND train_step > ?"
        for table in (schema.TOKEN_ROWS, "rewards", "step_rewards", "token_scores"):  # a mini-run's tokens: never sharded
            cur.execute(f"DELETE FROM {table} WHERE rollout_id IN ({later})", [run_id, k])
        cur.execute("DELETE FROM rollouts WHERE run_id = ? AND train_step > ?", [run_id, k])
        cur.execute("DELETE FROM metrics WHERE run_id = ? AND train_step > ?", [run_id, k])
        cur.execute("UPDATE runs SET status = 'running', error = NULL WHERE run_id = ?", [run_id])
    return run_id, k + 1, path


def resume(store: Store, run_id: str) -> str:
    """Resume a stopped, failed or interrupted mini-run from its last checkpoint (with its
    stored config); steps stored after that checkpoint are dropped and trained again."""
    raw = store.scalar("SELECT config FROM runs WHERE run_id = ?", [run_id])
    if raw is None:
        raise TrainConfigError(f"no run {run_id!r} in this store")
    if (st := state_of(run_id)) is not None and st.live:
        raise MiniRunBusy(f"{st.name} is still running")
    cfg = json.loads(raw)
    cfg.pop("reward_version", None)
    task = store.scalar("SELECT task FROM runs WHERE run_id = ?", [run_id])
    return start(store, MiniRunConfig.from_dict(cfg), task=task, resume_run=run_id)


def _finish(store: Store, st: RunState, status: str, error: str | None = None) -> None:
    st.status, st.error = status, error
    with store.transaction() as cur:
        cur.execute("UPDATE runs SET status = ?, error = ? WHERE run_id = ?", [status, error, st.run_id])


def _reader(store: Store, st: RunState, q, task, prompts: list[Prompt], vid: str) -> None:
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
                    _finish(store, st, "failed", f"{why} during step {st.step + 1}; resume continues from the last "
                                                 f"checkpoint (step {max(st.checkpoints or [st.first_step - 1])})")
                    return
            else:
                continue
        try:
            ended = _handle(store, st, msg, task, vid)
        except Exception as exc:  # the store refused a write: stop the worker, say why
            st.stop_event.set()
            proc.kill()
            _finish(store, st, "failed", f"storing step {st.step + 1} failed: {type(exc).__name__}: {exc}")
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
        _finish(store, st, msg["status"])
        return True
    elif kind == "error":
        _finish(store, st, "failed", msg["message"])
        return True
    return False


def write_step(store: Store, run_id: str, task, out, vid: str, golds: list[dict]) -> None:
    """One training step's rollouts, tokens, rewards and metrics: one transaction."""
    prompts = [Prompt(t, g) for t, g in zip(out.prompts, golds)]
    lag = int(out.metrics.get("staleness", 0) or 0)  # overlapped sampling: drawn by the weights `lag` updates back
    rollouts, tokens = generation_rows(run_id, task, prompts, out.generations, f"{run_id}@{out.step - 1 - lag}",
                                       train_step=out.step)
    rollouts["train_advantage"] = np.asarray(out.advantages, dtype=np.float64)
    weights = np.concatenate(out.token_weights) if out.token_weights else np.zeros(0)
    tokens = tokens.append_column("train_weight", pa.array(weights.astype(np.float32), pa.float32()))
    errs = out.reward_errors or [{} for _ in out.rewards]
    rw = [(rid, vid, comp, val, None if val is not None else (why.get(comp) or "the rule failed on this completion"))
          for rid, comps, why in zip(rollouts["rollout_id"], out.rewards, errs) for comp, val in comps.items()]
    rewards = pd.DataFrame(rw, columns=["rollout_id", "rule_version_id", "component", "value", "error"])
    rewards["value"] = rewards["value"].astype("float64")
    metrics = pd.DataFrame([{"run_id": run_id, "train_step": out.step, "name": k, "value": float(v)}
                            for k, v in out.metrics.items()])
    with store.transaction() as cur:
        store.write({"rollouts": rollouts, "tokens": tokens, "rewards": rewards, "metrics": metrics}, cur=cur)


def metrics(store: Store, run_ids: list[str]) -> pd.DataFrame:
    """Long metrics of runs: ``run_id, name (run name), train_step, metric, value``."""
    return store.df("""SELECT m.run_id, r.name AS run, m.train_step, m.name AS metric, m.value
                       FROM metrics m JOIN runs r USING (run_id)
                       WHERE list_contains(?, m.run_id) AND m.name <> 'checkpoint' ORDER BY m.run_id, m.train_step""",
                    [run_ids])


SUMMARY = ("reward_mean", "accuracy", "entropy", "kl", "completion_len", "all_equal_share", "step_s")


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
                            (SELECT max(train_step) FROM metrics m WHERE m.run_id = r.run_id AND m.name = 'step_s') AS steps
                     FROM runs r WHERE r.kind = 'minirun' ORDER BY r.created_at DESC""")
    df["total"] = [json.loads(c).get("steps") if isinstance(c, str) else None for c in df["config"]]
    return df.drop(columns=["config"])


async def evaluate(policy_path: str | Path, n_prompts: int = 200, k: int = 4, task: str = "arithmetic",
                   max_new_tokens: int = 40, seed: int = 0) -> dict:
    """Accuracy, pass@k, greedy accuracy, mean length and entropy of a policy on the
    held-out prompts (in the worker pool)."""
    import asyncio

    from studio import workers
    from studio.runs.training import evaluate_job

    the_task = get_task(task)
    prompts = [{"text": p.text, "gold": p.gold} for p in heldout_prompts(the_task, n_prompts)]
    fut = workers.pool().submit(evaluate_job, str(resolve_policy(policy_path)), prompts, the_task.name, k,
                                max_new_tokens, seed)
    return await asyncio.wrap_future(fut)


def wait(run_id: str, timeout_s: float = 3600) -> RunState:
    """Block until a run ends (for scripts and tests)."""
    t0 = time.time()
    st = state_of(run_id)
    while st is not None and st.live and time.time() - t0 < timeout_s:
        time.sleep(0.2)
    return st
