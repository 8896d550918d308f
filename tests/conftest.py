"""Shared fixtures: the real sample policy, and stores built from it."""
from __future__ import annotations

import pytest

from sample_data import POLICY_DIR, ROLLOUTS_DIR


@pytest.fixture(scope="session")
def sample_policy():
    """The real tiny policy shipped in sample_data/ (loaded once for the whole run)."""
    from backends import load_policy

    if not (POLICY_DIR / "config.json").exists():
        pytest.fail(f"sample policy missing at {POLICY_DIR}: run `python -m sample_data.build_policy`")
    return load_policy(POLICY_DIR, device="cpu")


@pytest.fixture()
def seeded_store(tmp_path):
    """A fresh on-disk store seeded with the shipped sample rollouts."""
    from studio.store import Store

    store = Store.open(tmp_path / "studio.duckdb", seed_dir=ROLLOUTS_DIR)
    yield store
    store.close()
