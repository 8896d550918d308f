"""The worker pool: one spawn-context process pool per owner process, started on first use.

Heavy work (sampling, teacher forcing, reward and value models) runs in its worker, never
in the owner: the owner submits a job of :mod:`studio.workers.jobs` and writes what it
returns. Models are cached inside the worker (``backends.load_policy``), so a second job
on the same policy reuses the loaded weights; :func:`warm` loads one ahead of the first
click. A worker ends with its owner (:func:`exit_with_parent`), and a pool whose worker
died is dropped and started again (:func:`reset_pool`); an owner that exits stops it
(:func:`shutdown`). Workers ignore SIGINT (:func:`ignore_interrupts`): their owner stops them.
"""
from __future__ import annotations

import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from studio.workers.jobs import warm_job

_lock = threading.Lock()
_pool: ProcessPoolExecutor | None = None
_warmed: set[str] = set()  # policies the pool's worker has loaded (or is loading)
_devices: dict[str, str] = {}  # resolved policy folder -> the device its worker loaded it on ("cpu", "cuda")
_load_errors: dict[str, str] = {}  # resolved policy folder -> why its worker could not load it (by warm)


def local_device(policy: str | Path) -> str | None:
    """The device a local policy folder's worker reported (once warmed or run; else None).

    Process-wide: a device learned by one session is shown in every session's backend line."""
    with _lock:
        return _devices.get(str(Path(policy).resolve()))


def note_local_device(policy: str | Path, device: str) -> None:
    """Remember that a local policy folder's worker runs on ``device``."""
    with _lock:
        _devices[str(Path(policy).resolve())] = device
        _load_errors.pop(str(Path(policy).resolve()), None)


def load_error(policy: str | Path) -> str | None:
    """Why the worker could not load a local policy folder when :func:`warm` asked it to (else None)."""
    with _lock:
        return _load_errors.get(str(Path(policy).resolve()))


def _init_worker() -> None:
    ignore_interrupts()  # first: a Ctrl-C while torch imports must not print a traceback either
    import torch

    from backends.device import cpu_threads, yield_to_server

    torch.set_num_threads(cpu_threads())  # one core stays with the server
    yield_to_server()  # and the server goes first when the cores are contended
    quiet_models()
    exit_with_parent()


def ignore_interrupts() -> None:
    """Leave SIGINT to the owner. A terminal's Ctrl-C and a notebook kernel's interrupt or
    shutdown reach every process of the group; a worker is stopped by its owner (its pool
    shut down, its mini-run asked to stop), so it ignores the signal instead of printing a
    ``KeyboardInterrupt`` traceback. Called first thing in every worker process."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def quiet_models() -> None:
    """No transformers progress bars ("Loading weights", "Writing model shards") from a worker:
    its owner's console (a server, a notebook cell, a CLI) shows only what a user reads."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def exit_with_parent(poll_s: float = 1.0, parent: int | None = None) -> None:
    """End this worker when its owner process is gone (killed by a signal, it cannot shut
    the pool down, and the worker would otherwise live on holding a model in memory).

    ``parent`` is the owner's pid when the caller knows it (a process given its owner's pid
    at start); by default this process's parent now."""
    import os
    import time

    parent = os.getppid() if parent is None else parent

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def pool() -> ProcessPoolExecutor:
    """The shared worker pool, started on first use."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                        initializer=_init_worker)
        return _pool


def reset_pool(broken: ProcessPoolExecutor | None = None) -> None:
    """Drop the pool ``broken`` (a worker died); the next :func:`pool` starts a new one.

    Only that pool is dropped: another session may already have replaced it with a healthy
    one, whose queued work must not be cancelled.
    """
    global _pool
    with _lock:
        if _pool is not None and (broken is None or _pool is broken):
            _pool.shutdown(wait=False, cancel_futures=True)
            _pool = None
            _warmed.clear()


def shutdown() -> None:
    """Stop the pool now and close its queues (the owner is exiting): a job in flight is
    abandoned (its worker terminated) rather than waited for, and the pool's semaphores are
    released, so the exit leaves no process and no "leaked semaphore" warning behind."""
    global _pool
    with _lock:
        ex, _pool = _pool, None
        _warmed.clear()
    if ex is None:
        return
    for proc in list((getattr(ex, "_processes", None) or {}).values()):
        proc.terminate()
    ex.shutdown(wait=True, cancel_futures=True)


def warm(policy: str | Path | None) -> None:
    """Start the worker and load ``policy`` in the background (once per policy per process),
    so the first branch or sample request does not wait for the process and the weights."""
    from backends.types import is_policy_url
    from studio.workers.vocab import resolve_policy

    if not policy or is_policy_url(policy):
        return  # nothing to load here for a backend URL: the backend loads on its own
    folder = resolve_policy(policy)
    if folder is None or not (folder / "config.json").is_file():
        return
    key = str(folder.resolve())
    with _lock:
        if key in _warmed:
            return
        _warmed.add(key)

    def loaded(future) -> None:  # the worker says where it put the weights, or why it could not
        exc = future.exception()
        if exc is None:
            note_local_device(key, future.result())
            return
        with _lock:
            _load_errors[key] = f"{type(exc).__name__}: {exc}"
            _warmed.discard(key)  # the next warm tries again

    pool().submit(warm_job, key).add_done_callback(loaded)
