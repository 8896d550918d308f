"""A mini-run's life, from the owner: :func:`start`, :func:`stop`, :func:`resume`.

The owner process (the server, or the CLI ``rollout-studio minirun``) holds the store.
:func:`start` checks the settings, records the run (``runs.kind = 'minirun'``, its config
as JSON), registers it (:mod:`studio.runs.minirun.registry`) and starts
:func:`studio.runs.training.train_worker` in its own process, with a reader thread that
stores each step (:mod:`studio.runs.minirun.steps`). :func:`stop` asks the run to end after
the step in flight (:func:`stop_all`: every live run, as the owner exits); :func:`resume` restarts a stopped, failed or killed run from its last
checkpoint, dropping any stored steps after it.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import threading

import pandas as pd

from studio.runs.minirun.reads import checkpoint_root, last_checkpoint
from studio.runs.minirun.registry import MiniRunBusy, RunState, _lock, _runs, capacity, state_of
from studio.runs.minirun.steps import finish, receive
from studio.runs.training import MiniRunConfig, TrainConfigError, task_prompts, train_split, with_task_defaults
from studio.store import Store, schema
from studio.store.records import new_id, now, prompt_rows
from studio.tasks import Prompt, get_task
from studio.workers.vocab import policy_label, resolve_policy


def _reward_spec(store: Store, version: str, task: str) -> tuple[dict, str, pd.DataFrame | None]:
    """(spec for the worker, the rule version id the rewards are stored under, version row to write)."""
    from studio.rewards import DEFAULT_RULES, default_rule, rule_version_frame
    from studio.rewards.rules import SOURCES_MARK

    if not version:
        rule = default_rule(task)
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
        df = store.df("""SELECT DISTINCT p.text, p.gold, p.meta, p.messages FROM rollouts ro JOIN prompts p USING (prompt_id)
                         WHERE ro.run_id = ? ORDER BY 1""", [rid])
        if df.empty:
            raise TrainConfigError(f"run {rid!r} has no prompts in this store")
        return [Prompt.from_json({k: json.loads(v) if isinstance(v, str) and k != "text" else v for k, v in r.items()})
                for r in df.to_dict("records")]
    if not task.generates:  # a stored prompt set: a seeded draw of its training split
        from studio.queries.prompts import draw_prompts

        return draw_prompts(store, task.name, cfg.n_prompts, seed=cfg.seed, split=train_split(task, cfg.prompt_set))
    return task_prompts(task, cfg.prompt_set, cfg.n_prompts, cfg.seed)


def start(store: Store, cfg: MiniRunConfig, name: str | None = None, task: str = "arithmetic",
          resume_run: str | None = None) -> str:
    """Start a mini-run (or resume ``resume_run``) and return its run id; the work goes on
    in the background. On an agent task, settings left at their defaults take the task's
    (:func:`~studio.runs.training.with_task_defaults`). Raises :class:`TrainConfigError` for bad settings and
    :class:`MiniRunBusy` when another run holds the machine."""
    from backends import check_policy_folder

    the_task = get_task(task)
    cfg = with_task_defaults(cfg, the_task)  # an agent task: its policy and budgets where cfg keeps the defaults
    cfg.validate()
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
        cfg.to_dict(), str(folder), spec, [p.to_json() for p in prompts], the_task.spec,
        str(ckpt_dir), first, ckpt, q, stop_event, os.getpid()))
    st.process, st.stop_event = proc, stop_event
    try:
        proc.start()
    except Exception as exc:
        finish(store, st, "failed", f"the training process did not start: {exc}")
        raise
    threading.Thread(target=receive, args=(store, st, q, the_task, prompts, vid), daemon=True,
                     name=f"minirun-reader-{run_id}").start()
    return run_id


def _worker_entry(*args) -> None:
    from studio.workers.processes import ignore_interrupts, quiet_models

    ignore_interrupts()  # Ctrl-C is the owner's: it stops the run with a checkpoint (stop, stop_all)
    from backends.device import yield_to_server
    from studio.runs.training import train_worker

    yield_to_server()  # training waits for pages, not pages for training
    quiet_models()
    train_worker(*args)


def stop(run_id: str) -> bool:
    """Ask a live run to stop after the step in flight (it saves a checkpoint first)."""
    st = state_of(run_id)
    if st is None or not st.live:
        return False
    st.status = "stopping"
    st.stop_event.set()
    return True


def stop_all(timeout_s: float = 20.0) -> None:
    """The owner is exiting: ask every live run to stop (each saves a checkpoint), wait up to
    ``timeout_s`` for them, then end the ones still going (they resume from a checkpoint)."""
    import time

    from studio.runs.minirun.registry import live_runs

    live = live_runs()
    for st in live:
        stop(st.run_id)
    deadline = time.monotonic() + timeout_s
    for st in live:
        if st.process is not None:
            st.process.join(max(0.0, deadline - time.monotonic()))
            if st.process.is_alive():
                st.process.terminate()
                st.process.join(5)


def _prepare_resume(store: Store, run_id: str) -> tuple[str, int, str | None]:
    kind = store.scalar("SELECT kind FROM runs WHERE run_id = ?", [run_id])
    if kind != "minirun":
        raise TrainConfigError(f"{run_id!r} is not a mini-run of this store")
    last = last_checkpoint(store, run_id)
    k, path = last if last else (0, None)
    with store.transaction() as cur:  # steps after the checkpoint are trained again: drop them whole
        later = "SELECT rollout_id FROM rollouts WHERE run_id = ? AND train_step > ?"
        # a mini-run's tokens are never sharded: DELETE reaches them all
        for table in (schema.TOKEN_ROWS, "rewards", "step_rewards", "token_scores"):
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
