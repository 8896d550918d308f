"""``TaskEnv``: the environment of the agent loop (``backends.agent``) for a task with tools.

A task with tools (``studio.tasks.agent.CalculatorAgent``) says where a call ends
(``call_end``), reads a call (``parse_call(text) -> (name, args_json, args)``, raising
``ToolCallError``), names its tools (``tools``: top-level functions) and writes what the policy
reads back (``format_response(result, error=...)``). :class:`TaskEnv` puts them together and runs
the tool in the :class:`studio.workers.tools.ToolSandbox`. It never raises: a call that is not
valid JSON, names an unknown tool, or whose tool raises, runs past its time or out of memory, is
answered with a tool turn whose ``error`` says so (and whose text tells the policy).
"""
from __future__ import annotations

from backends.types import ToolReply
from studio.workers.tools import ToolSandbox


class TaskEnv:
    """An ``backends.types.AgentEnv`` over ``task``'s tools, run in ``sandbox`` (None: in this
    process, for trusted tools only: the sample world's build script)."""

    def __init__(self, task, sandbox: ToolSandbox | None = None):
        if not getattr(task, "tools", None):
            raise ValueError(f"task {task.name!r} has no tools: an agent loop needs a task with tools")
        self.task, self.sandbox = task, sandbox
        self.call_end: str = task.call_end

    def reply(self, prompt_index: int, call: str) -> ToolReply:
        """Answer the call that ends ``call`` (the assistant turn's text)."""
        try:
            name, args_json, args = self.task.parse_call(call)
        except Exception as exc:  # ToolCallError, or a task's parser failing on odd text: the policy reads why
            msg = str(exc) or type(exc).__name__
            return ToolReply(self.task.format_response(error=msg), error=msg)
        result, error = self._run(self.task.tools[name], args)
        text = self.task.format_response(error=error) if error is not None else self.task.format_response(result)
        return ToolReply(text, tool_name=name, tool_args=args_json, error=error)

    def _run(self, fn, args: dict) -> tuple[object, str | None]:
        if self.sandbox is not None:
            return self.sandbox.call(fn, args)
        try:
            return fn(**args), None
        except Exception as exc:  # a tool raises anything: the policy reads its message
            return None, str(exc) or type(exc).__name__
