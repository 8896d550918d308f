"""The tool sandbox: tool calls of agent trajectories run in a worker process with limits.

A tool is a top-level function (``module.name``: the task's ``tools``); the sandbox's process
imports it and calls it with the call's arguments. One persistent spawn-context process per
sandbox, with an address-space limit (``memory_mb``: a 10 GB allocation fails there with
``MemoryError``) and a per-call time limit (``call_s``: past it the process is killed and a new
one started on the next call). A call never raises: :meth:`ToolSandbox.call` returns the result
or the error the policy will read, so one bad call is one failed tool turn and the trajectory
goes on. The process ends with its owner (``exit_with_parent``).
"""
from __future__ import annotations

import importlib
import multiprocessing
import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class ToolLimits:
    """Resource limits of one tool call."""

    call_s: float = 5.0
    """Longest one call may take; past it the sandbox process is killed and restarted."""
    memory_mb: int = 1024
    """Address space of the sandbox process (the tool plus Python itself)."""


class ToolSandbox:
    """A persistent process that runs tool functions under :class:`ToolLimits` (started on first call)."""

    def __init__(self, limits: ToolLimits = ToolLimits()):  # noqa: B008  (frozen)
        self.limits = limits
        self._proc = None
        self._conn = None
        self._lock = threading.Lock()  # one call at a time through the pipe
        self.restarts = 0  # processes killed (time limit) or lost (killed by the system)

    def call(self, fn, args: dict) -> tuple[object, str | None]:
        """Run ``fn(**args)`` in the sandbox: ``(result, None)``, or ``(None, error)`` saying why it failed
        (the exception's type and message; the time or memory limit it ran past)."""
        ref = (fn.__module__, fn.__qualname__)
        with self._lock:
            self._start()
            try:
                self._conn.send((ref, args))
            except (BrokenPipeError, OSError):
                return None, self._lost()
            if not self._conn.poll(self.limits.call_s):
                self._kill()
                return None, f"the tool ran past its time limit of {self.limits.call_s:g} s"
            try:
                status, value = self._conn.recv()
            except (EOFError, OSError):
                return None, self._lost()
        return (value, None) if status == "ok" else (None, value)

    def close(self) -> None:
        """Stop the sandbox's process (a later call starts a new one)."""
        with self._lock:
            self._kill(count=False)

    def __enter__(self) -> ToolSandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            return
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, self.limits.memory_mb), daemon=True,
                                 name="tool-sandbox")
        self._proc.start()
        child.close()

    def _kill(self, count: bool = True) -> None:
        if self._proc is None:
            return
        if self._proc.pid is not None:  # started
            self._proc.kill()
            self._proc.join(5)
        self._conn.close()
        self._proc = self._conn = None
        self.restarts += count

    def _lost(self) -> str:
        """The process died during a call: killed by the system (its memory, most likely) or exited."""
        self._proc.join(1)
        code = self._proc.exitcode
        self._kill()
        if code is not None and code >= 0:
            return f"the tool ended its sandbox process (exit code {code})"
        return f"the tool ran out of memory (limit {self.limits.memory_mb} MB): its process was killed"


def _serve(conn, memory_mb: int) -> None:
    """The sandbox process: answer ``((module, name), args)`` requests until the pipe closes."""
    import resource

    from studio.workers.processes import exit_with_parent, ignore_interrupts

    ignore_interrupts()
    limit = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    exit_with_parent()
    tools: dict[tuple[str, str], object] = {}
    while True:
        try:
            (module, name), args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            if (module, name) not in tools:
                obj = importlib.import_module(module)
                for part in name.split("."):
                    obj = getattr(obj, part)
                tools[(module, name)] = obj
            answer = ("ok", tools[(module, name)](**args))
        except MemoryError:
            answer = ("error", f"the tool ran out of memory (limit {memory_mb} MB)")
        except Exception as exc:  # a tool raises anything: the policy reads its message
            answer = ("error", str(exc) or type(exc).__name__)
        try:
            conn.send(answer)
        except MemoryError:
            conn.send(("error", f"the tool ran out of memory (limit {memory_mb} MB)"))
        except Exception as exc:  # a result that cannot be pickled
            conn.send(("error", f"the tool's result cannot be sent back: {type(exc).__name__}: {exc}"))
