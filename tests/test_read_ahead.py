"""The click's reader threads (``queries.read_ahead``): results and errors come back through the
future, and an error beside a read in flight leaves only once that read has ended."""
from __future__ import annotations

import threading
import time

import pytest

from studio import queries


def test_read_ahead_returns_the_value_and_raises_the_error():
    assert queries.read_ahead(lambda a, b: a + b, 2, 3).result() == 5

    def boom():
        raise ValueError("bad read")
    with pytest.raises(ValueError, match="bad read"):
        queries.read_ahead(boom).result()


def test_an_error_waits_for_the_read_in_flight():
    done = threading.Event()

    def slow():
        time.sleep(0.2)
        done.set()
    ahead = queries.read_ahead(slow)
    with pytest.raises(RuntimeError), queries.settled(lambda: ahead):
        raise RuntimeError("the group's read failed")
    assert done.is_set()  # the store may be closed next: no cursor of this click is still reading


def test_a_missing_rollout_reads_nothing_more(seeded_store):
    assert queries.scored_group(seeded_store, "no-such-rollout").rows == []
    assert queries.rollout(seeded_store, "no-such-rollout") is None
