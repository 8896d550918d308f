"""Generate end to end: worker process, scoring, storing; bad input writes nothing."""
import pytest

from backends import PolicyLoadError
from sample_data import POLICY_DIR
from studio import queries
from studio.generation import GenerateConfig, generate_sync
from studio.store import Store
from studio.tasks import TaskParseError


@pytest.fixture()
def store(tmp_path):
    s = Store.open(tmp_path / "g.duckdb")
    yield s
    s.close()


def test_generate_stores_scored_groups(store):
    progress = []
    res = generate_sync(store, POLICY_DIR, ["Q: 23+48-7=", "12+5", "Q: 3-8="], GenerateConfig(group_size=4, seed=1),
                        on_progress=lambda d, t, m: progress.append((d, t)), chunk_prompts=2)
    assert res.status == "done" and res.rollouts == 12 and res.device == "cpu"
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
    with pytest.raises(ValueError, match="group size must be 1-64"):
        generate_sync(store, POLICY_DIR, ["Q: 1+2="], GenerateConfig(group_size=0))
    assert store.counts()["runs"] == 0
