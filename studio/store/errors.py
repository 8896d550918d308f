"""What the store raises: a store that cannot be opened or written, and a read past its time limit."""
from __future__ import annotations

from studio.errors import NOT_DONE, StudioError


class StoreError(StudioError, RuntimeError):
    """The store cannot be opened or written; the message says why and what to do."""


class QueryTimeout(StoreError):
    """A read ran past its time limit and was interrupted (the store is unchanged)."""

    exit_code = NOT_DONE


class WriteConflict(StoreError):
    """Another process committed a change to a table this write changed (a shared store): nothing
    was written, and the same write may simply run again."""
