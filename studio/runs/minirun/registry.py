"""The live mini-runs of this process: :class:`RunState` per run, one lock, the machine's capacity.

The owner keeps one :class:`RunState` per mini-run it started (live or just ended); views
poll it (:func:`state_of`, :func:`live_runs`), scripts block on it (:func:`wait`). This
machine trains :func:`capacity` runs at a time; a start past it, or on a policy already
training, raises :class:`MiniRunBusy`.
"""
from __future__ import annotations

import functools
import os
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from studio.errors import NOT_DONE, StudioError


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


_lock = threading.Lock()  # held while a start checks the machine and registers its run
_runs: dict[str, RunState] = {}


def live_runs() -> list[RunState]:
    """The runs starting, running or stopping now."""
    with _lock:
        return [r for r in _runs.values() if r.live]


def state_of(run_id: str) -> RunState | None:
    """What this process knows of a run it started (None for a run it did not)."""
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


def wait(run_id: str, timeout_s: float = 3600) -> RunState:
    """Block until a run ends (for scripts and tests)."""
    t0 = time.time()
    st = state_of(run_id)
    while st is not None and st.live and time.time() - t0 < timeout_s:
        time.sleep(0.2)
    return st
