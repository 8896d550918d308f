"""The one base of every error a user can cause, with the exit code the command line gives it.

Every user-facing error of the studio derives from :class:`StudioError` (beside the built-in
base it always had, so ``except ValueError`` keeps working). ``exit_code`` follows the
command line's contract (:mod:`studio.face.cli`): 2 = bad input, nothing changed; 1 = ran but
did not succeed. Model runners' errors (``backends.PolicyLoadError`` and the remote backend's)
stay in ``backends/``, which knows nothing of the studio; the command line maps them to 2.
"""
from __future__ import annotations

BAD_INPUT = 2
NOT_DONE = 1


class StudioError(Exception):
    """An error a user can cause; the message says what to do."""

    exit_code: int = BAD_INPUT
    label: str = "error"  # what the command line prints before the message ("refused" for a refusal)
