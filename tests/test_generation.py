"""Generate end to end: worker process, scoring, storing; bad input writes nothing."""
import asyncio
import threading

import pytest

from backends import PolicyLoadError, pick_device
from sample_data import POLICY_DIR
from studio import queries
from studio.runs.generation import ConfigError, GenerateConfig, generate_sync
from studio.tasks import TaskParseError


@pytest.fixture()
def store(store_factory):
    return store_factory("g.duckdb")


def test_generate_stores_scored_groups(store):
    progress = []
    res = generate_sync(store, POLICY_DIR, ["Q: 23+48-7=", "12+5", "Q: 3-8="], GenerateConfig(group_size=4, seed=1),
                        on_progress=lambda d, t, m: progress.append((d, t)), chunk_prompts=2)
    assert res.status == "done" and res.rollouts == 12 and res.device == pick_device()
    assert progress == [(8, 12), (12, 12)]
    table = queries.rollout_table(store)
    assert len(table) == 12 and set(table["prompt"]) == {"Q: 23+48-7=", "Q: 12+5=", "Q: 3-8="}
    assert table.groupby("group_id").size().tolist() == [4, 4, 4]
    assert table["reward"].notna().all()
    run = queries.runs(store).iloc[0]
    assert run.status == "done" and run.rollouts == 12 and run.policy == "sample"


def test_bad_prompt_writes_nothing(store):
    with pytest.raises(TaskParseError, match="prompt 2: cannot read 'what is 2\\+2\\?'"):
        generate_sync(store, POLICY_DIR, ["Q: 1+2=", "what is 2+2?"])
    assert store.counts() == {"runs": 0, "prompts": 0, "rollouts": 0, "tokens": 0}


def test_missing_policy_writes_nothing(store, tmp_path):
    with pytest.raises(PolicyLoadError, match="does not exist"):
        generate_sync(store, tmp_path / "no-model", ["Q: 1+2="])
    assert store.counts()["runs"] == 0


def test_invalid_settings_write_nothing(store):
    with pytest.raises(ConfigError, match="group size must be 1-64, got 0"):
        generate_sync(store, POLICY_DIR, ["Q: 1+2="], GenerateConfig(group_size=0))
    assert store.counts()["runs"] == 0


def test_cancel_stops_after_the_chunk_in_flight(store):
    cancel = threading.Event()
    res = generate_sync(store, POLICY_DIR, ["Q: 1+2=", "Q: 3+4=", "Q: 5+6="], GenerateConfig(group_size=2),
                        chunk_prompts=1, cancel=cancel, on_progress=lambda d, t, m: cancel.set())
    assert res.status == "cancelled" and res.rollouts == 2  # the first chunk is kept, whole
    assert store.counts()["rollouts"] == 2
    assert queries.runs(store).iloc[0].status == "cancelled"


def test_generate_sync_works_inside_a_running_event_loop(store):
    """As in a Jupyter cell, where an event loop is already running."""
    async def cell():
        return generate_sync(store, POLICY_DIR, ["Q: 9-4="], GenerateConfig(group_size=2))

    assert asyncio.run(cell()).status == "done"
    assert store.counts()["rollouts"] == 2
