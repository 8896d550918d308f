"""Rollout Studio: see inside the rollouts of RL fine-tuning runs.

``studio.open(path)`` is the Python API (:mod:`studio.face.api`); importing ``studio`` alone stays
light (no Panel, no torch). The code is cut by job into subpackages that stack in layers
(``docs/architecture.md`` draws them; ``tests/test_layers.py`` keeps them): ``tasks`` < ``store``,
``signals`` < ``queries`` < ``workers`` < ``rewards`` < ``runs``, ``ingest``, ``curation`` <
``face`` (the served app, the API's views, the command line: the only part that imports the UI).
"""
import importlib

__version__ = "0.1.0"


def open(db=None, policy=None, *, create: bool = False):  # noqa: A001 (the API's entry point, like duckdb.connect)
    """Open a studio store: see :func:`studio.face.api.open`."""
    # the face by name, at call time: the package root stays an entry point that no layer imports
    return importlib.import_module("studio.face.api").open(db, policy, create=create)
