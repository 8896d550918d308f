"""Property-based sweep of every input boundary that exists: bad input gets a clear, typed
error (or is handled), and the store is never changed by it."""
import hashlib
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sample_data import POLICY_DIR
from studio import queries
from studio.configs import settings_of
from studio.face import serve
from studio.rewards import ARITHMETIC_V1
from studio.runs.generation import ConfigError, GenerateConfig, generate_sync
from studio.store import Store, StoreError
from studio.tasks import TaskParseError, get_task
from tests.fixtures import open_store

task = get_task("arithmetic")
BOUNDS = {s.name: s.bounds for s in settings_of(GenerateConfig) if s.bounds}  # what the form and CLI enforce
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def store():
    s = open_store(seeded=True)  # one for the module: the properties check it per example
    yield s
    s.close()


def fingerprint(store) -> tuple:
    return tuple(store.scalar(f"SELECT count(*) FROM {t}") for t in ("runs", "prompts", "rollouts", "tokens", "rewards"))


@FAST
@given(st.text(max_size=40))
def test_typed_prompts_parse_or_raise_a_task_error(text):
    try:
        p = task.parse_prompt(text)
    except TaskParseError as exc:
        assert repr(text) in str(exc)  # the message quotes what was typed
        return
    assert p.text.startswith("Q: ") and p.text.endswith("=")
    assert task.is_correct(p, task.parse_completion(p, p.gold["solution"]).answer)


@FAST
@given(st.text(max_size=60))
def test_any_completion_is_parsed_and_scored_without_raising(completion):
    p = task.parse_prompt("Q: 23+48-7=")
    parsed = task.parse_completion(p, completion)
    for s in parsed.steps:
        assert completion[s.start:s.end] == s.text
    values, errors = ARITHMETIC_V1.score_detailed(task, p, completion)
    assert not errors and 0.0 <= values["total"] <= 1.35


@FAST
@given(st.lists(st.text(alphabet="abcxyz*?/", min_size=1, max_size=12), min_size=1, max_size=3))
def test_unparsable_prompts_never_reach_the_store(store, bad_lines):
    before = fingerprint(store)
    with pytest.raises(TaskParseError, match="prompt 1: cannot read"):
        generate_sync(store, POLICY_DIR, [*bad_lines, "Q: 1+2="])
    assert fingerprint(store) == before


@FAST
@given(group_size=st.integers(-5, 100), temperature=st.floats(-1, 10, allow_nan=False),
       top_p=st.floats(-1, 2, allow_nan=False), max_new_tokens=st.integers(-5, 5000), top_k_stats=st.integers(-2, 30))
def test_generate_settings_are_in_bounds_or_named(group_size, temperature, top_p, max_new_tokens, top_k_stats):
    cfg = GenerateConfig(group_size=group_size, temperature=temperature, top_p=top_p,
                         max_new_tokens=max_new_tokens, top_k_stats=top_k_stats)
    try:
        cfg.validate()
    except ConfigError as exc:
        bad = [n for n, (lo, hi) in BOUNDS.items() if not lo <= getattr(cfg, n) <= hi]
        assert bad and all(n.replace("_", " ") in str(exc) for n in bad)
        return
    assert all(lo <= getattr(cfg, n) <= hi for n, (lo, hi) in BOUNDS.items())


@FAST
@given(contains=st.text(max_size=20), correct=st.sampled_from([None, True, False]),
       lo=st.none() | st.floats(-10, 10, allow_nan=False), hi=st.none() | st.floats(-10, 10, allow_nan=False),
       run_id=st.none() | st.text(max_size=10))
def test_any_filter_is_a_query_not_a_change(store, contains, correct, lo, hi, run_id):
    before = fingerprint(store)
    df = queries.rollout_table(store, queries.RolloutFilter(run_id=run_id, prompt_contains=contains, correct=correct,
                                                              reward_min=lo, reward_max=hi))
    if lo is not None:
        assert (df["reward"] >= lo).all()
    if contains and contains.strip():
        assert all(contains.strip().lower() in p.lower() for p in df["prompt"])
    assert fingerprint(store) == before


@settings(max_examples=15, deadline=None)
@given(st.binary(min_size=1, max_size=20_000))
def test_any_file_given_as_store_is_refused_untouched(data):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "x.duckdb"
        path.write_bytes(data)
        digest = hashlib.sha256(data).hexdigest()
        with pytest.raises(StoreError, match="not a readable DuckDB store"):
            Store.open(path)
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


@FAST
@given(port=st.integers(-10, 100_000), address=st.sampled_from(["127.0.0.1", "0.0.0.0", "::1", "10.1.2.3", "host"]))
def test_cli_arguments_parse_or_exit_2(port, address):
    try:
        args = serve.parse_args(["--port", str(port), "--address", address])
    except SystemExit as exc:
        assert exc.code == 2 and not 0 < port < 65536
        return
    assert 0 < args.port < 65536
    refused = serve.unauthenticated_exposure(["panel", "serve", "launch.py", "--address", address]) is not None
    assert refused is (not serve.is_loopback(address))
