"""Rollout Studio core: data model, store, tasks, rewards, advantages.

``studio.open(path)`` is the Python API (see :mod:`studio.face.api`); importing ``studio`` alone
stays light (no Panel, no torch).
"""
__version__ = "0.1.0"


def open(db=None, policy=None, *, create: bool = False):  # noqa: A001 (the API's entry point, like duckdb.connect)
    """Open a studio store: see :func:`studio.face.api.open`."""
    from studio.face.api import open as _open

    return _open(db, policy, create=create)
