"""Tasks: prompt generators with gold answers and completion parsers."""
from . import agent, arithmetic, text  # noqa: F401  (register the sample tasks and the free-text task of imports)
from .base import (
                   ParsedCompletion,
                   Prompt,
                   Step,
                   Task,
                   TaskParseError,
                   UnknownTaskError,
                   define,
                   from_spec,
                   get_task,
                   register_task,
                   seen_prompt,
                   task_names,
)

__all__ = ["ParsedCompletion", "Prompt", "Step", "Task", "TaskParseError", "UnknownTaskError", "define", "from_spec", "get_task", "register_task", "seen_prompt", "task_names"]
