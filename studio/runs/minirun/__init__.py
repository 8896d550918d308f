"""Mini-runs, the owner side: start, watch, stop, resume, evaluate; write every step.

The owner process (the server, or the CLI ``rollout-studio minirun``) holds the store; the
training itself runs in a process of its own (:mod:`studio.runs.training`).

- :mod:`~studio.runs.minirun.lifecycle`: :func:`start`, :func:`stop`, :func:`resume`;
- :mod:`~studio.runs.minirun.registry`: the live runs of this process (:class:`RunState`,
  :func:`state_of`, :func:`live_runs`, :func:`wait`), the machine's :func:`capacity`;
- :mod:`~studio.runs.minirun.steps`: the reader thread that stores each step the training
  process sends, whole or not at all (:func:`write_step`), and marks how the run ended;
- :mod:`~studio.runs.minirun.reads`: the stored runs, metrics, summaries and checkpoints;
- :mod:`~studio.runs.minirun.evaluation`: held-out evaluation of a policy in the worker pool, and of a
  run's last checkpoint stored as its ``heldout/*`` metrics.

A killed training process (even SIGKILL) leaves no partial step: the run is marked
``failed`` with the reason, and :func:`resume` restarts it from its last checkpoint
(dropping any stored steps after it). Checkpoints are full policy folders under
``<store folder>/checkpoints/<run_id>/step-k``; :func:`checkpoints` lists them so every
policy picker can offer them.
"""
from studio.runs.minirun.evaluation import HELDOUT, evaluate, evaluate_run, heldout_metrics
from studio.runs.minirun.lifecycle import resume, start, stop, stop_all
from studio.runs.minirun.reads import (
    CURVES,
    SUMMARY,
    checkpoint_root,
    checkpoints,
    heldout,
    last_checkpoint,
    metrics,
    miniruns,
    summary,
)
from studio.runs.minirun.registry import MiniRunBusy, RunState, capacity, live_runs, state_of, wait
from studio.runs.minirun.steps import write_step

__all__ = ["CURVES", "HELDOUT", "SUMMARY", "MiniRunBusy", "RunState", "capacity", "checkpoint_root", "checkpoints",
           "evaluate", "evaluate_run", "heldout", "heldout_metrics", "last_checkpoint", "live_runs", "metrics", "miniruns", "resume", "start", "state_of", "stop", "stop_all",
           "summary", "wait", "write_step"]
