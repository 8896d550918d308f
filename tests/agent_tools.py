"""Tools that misbehave, for the agent loop's tests: the sandbox imports them by name
(``studio.workers.tools``), so they are top-level functions of a module with light imports."""
from __future__ import annotations


def boom() -> str:
    """A tool that raises."""
    raise RuntimeError("the tool broke on purpose")


def spin() -> str:
    """A tool that never returns."""
    while True:
        pass


def hog() -> int:
    """A tool that allocates 10 GB."""
    return len(bytearray(10 * 1024 ** 3))
