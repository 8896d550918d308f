"""Curation's typed errors: what a user asked for that cannot be done, each message saying what
to change (:class:`CurationError`), and the two refusals of an export that exit with
``NOT_DONE`` (nothing to write; stale pairs)."""
from __future__ import annotations

import pandas as pd

from studio.errors import NOT_DONE, StudioError


class CurationError(StudioError, ValueError):
    """A pair or export request that cannot be done as asked; the message says what to change."""


class NothingToExport(CurationError):
    """The export would write no rows."""

    exit_code = NOT_DONE
    label = "refused"


class StalePairsError(CurationError):
    """Accepted pairs whose rollouts were deleted or re-scored; ``stale`` lists them."""

    exit_code = NOT_DONE
    label = "refused"

    def __init__(self, message: str, stale: pd.DataFrame):
        super().__init__(message)
        self.stale = stale
