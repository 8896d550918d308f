"""Tasks: prompt generators with gold answers and completion parsers."""
from . import arithmetic  # noqa: F401  (registers the sample task)
from .base import (
                   ParsedCompletion,
                   Prompt,
                   Step,
                   Task,
                   TaskParseError,
                   UnknownTaskError,
                   get_task,
                   register_task,
                   task_names,
)

__all__ = ["ParsedCompletion", "Prompt", "Step", "Task", "TaskParseError", "UnknownTaskError", "get_task", "register_task", "task_names"]
