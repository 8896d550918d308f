"""Shared fixtures (built on :mod:`tests.fixtures`) and the test tiers.

Tiers: ``python -m pytest -m "not slow"`` is the fast tier a developer runs while working
(every test but those that drive Chromium, train mini-runs, execute the notebook or run the
benchmarks); CI runs everything. A test is slow if it is marked ``slow`` or lives in a module
of :data:`SLOW_MODULES` or under ``tests/ui/``.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from sample_data import POLICY_DIR
from tests.fixtures import open_store
from tests.services import postgres, s3  # noqa: F401  (fixtures: real PostgreSQL and S3-compatible servers)

SLOW_MODULES = {"test_minirun.py", "test_notebook.py", "test_benchmarks.py", "test_crash.py"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.fspath))
        if path.parent.name == "ui" or path.name in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def sample_policy():
    """The real tiny policy shipped in sample_data/ (loaded once for the whole run)."""
    from backends import load_policy

    if not (POLICY_DIR / "config.json").exists():
        pytest.fail(f"sample policy missing at {POLICY_DIR}: run `python -m sample_data.build_policy`")
    return load_policy(POLICY_DIR, device="cpu")


@pytest.fixture()
def store_factory(tmp_path):
    """Open real stores for a test (``make(name_or_memory, seeded=...)``); all closed after it."""
    opened = []

    def make(name: str | None = None, *, seeded: bool = False):
        store = open_store(tmp_path / name if name else ":memory:", seeded=seeded)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


@pytest.fixture()
def seeded_store(store_factory):
    """A fresh on-disk store seeded with the shipped sample rollouts."""
    return store_factory("studio.duckdb", seeded=True)


@pytest.fixture()
def empty_store():
    """A fresh, empty in-memory store."""
    store = open_store()
    yield store
    store.close()


@pytest.fixture()
def minirun_store(tmp_path):
    """A new store for mini-runs; the runs still live at the end are stopped before it closes."""
    from studio.runs import minirun
    from studio.store import Store

    s = Store.open(tmp_path / "studio.duckdb")
    yield s
    for st in minirun.live_runs():
        minirun.stop(st.run_id)
        minirun.wait(st.run_id, 60)
    s.close()
