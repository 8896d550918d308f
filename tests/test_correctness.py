"""Correctness is a fact of the rollout (``rollouts.correct``), not a reading of the reward version
shown: scoring with a reward model (or any rule without an ``accuracy`` component) never turns a
right answer into ✗, and every reward the table shows says which version it comes from."""
from __future__ import annotations

from datetime import timedelta

import numpy as np
import pandas as pd

from studio import queries
from studio.queries import RolloutFilter
from studio.queries.table import reward_source
from studio.store import Store, schema
from tests.fixtures import open_store

RM = "rm-sample@0123456789"


def _score_with_a_reward_model(store: Store) -> None:
    """A newer version that scores every rollout on another scale and has no ``accuracy`` component,
    as *Score with reward model* writes one."""
    ids = store.df("SELECT rollout_id FROM rollouts ORDER BY rollout_id")["rollout_id"]
    newest = store.scalar("SELECT max(created_at) FROM rule_versions")
    rng = np.random.default_rng(0)
    store.write({
        "rule_versions": pd.DataFrame([{"rule_version_id": RM, "name": "rm-sample", "source": "# reward model",
                                        "sha256": "0" * 64, "created_at": newest + timedelta(minutes=1),
                                        "note": "reward model"}]),
        "rewards": pd.DataFrame({"rollout_id": ids, "rule_version_id": RM, "component": "total",
                                 "value": rng.normal(0.0, 3.0, len(ids))}),
    })


def _correct_counts(store: Store, rule_version_id: str | None = None) -> tuple[int, int, dict]:
    n_ok = queries.rollout_table_count(store, RolloutFilter(correct=True), rule_version_id)
    n_bad = queries.rollout_table_count(store, RolloutFilter(correct=False), rule_version_id)
    groups = queries.groups(store, rule_version_id=rule_version_id).set_index("group_id")["n_correct"].to_dict()
    return n_ok, n_bad, groups


def test_seeded_rollouts_carry_their_task_s_verdict(seeded_store):
    """The sample rollouts (Parquet files without the columns) get answer and correctness from their task,
    and they agree with the built-in rule's accuracy component."""
    df = seeded_store.df("""SELECT ro.correct, ro.answer, acc.value AS accuracy FROM rollouts ro
                            JOIN rewards acc ON acc.rollout_id = ro.rollout_id AND acc.component = 'accuracy'""")
    assert df["correct"].notna().all() and df["answer"].notna().any()
    assert (df["correct"] == (df["accuracy"] >= 1)).all()
    assert 0 < df["correct"].sum() < len(df)


def test_the_correct_filter_counts_rollouts_correct(seeded_store):
    want_ok = seeded_store.scalar("SELECT count(*) FROM rollouts WHERE correct")
    want_bad = seeded_store.scalar("SELECT count(*) FROM rollouts WHERE NOT correct")
    ok = queries.rollout_table(seeded_store, RolloutFilter(correct=True, limit=100_000))
    bad = queries.rollout_table(seeded_store, RolloutFilter(correct=False, limit=100_000))
    assert (len(ok), len(bad)) == (want_ok, want_bad)
    assert queries.rollout_table_count(seeded_store, RolloutFilter(correct=True)) == want_ok
    assert ok["correct"].all() and not bad["correct"].any()
    page = queries.rollout_table(seeded_store, RolloutFilter(correct=True, limit=18), offset=18)
    assert list(page["rollout_id"]) == list(ok["rollout_id"].iloc[18:36])


def test_a_reward_model_version_never_changes_correctness(seeded_store):
    """The bug: after scoring with a reward model, "latest scoring" showed every answer ✗ and the correct
    filter found 0. Correctness is the rollout's own, whatever version is shown."""
    store = seeded_store
    before = _correct_counts(store)
    page_before = queries.rollout_table(store, RolloutFilter(limit=100_000)).set_index("rollout_id")["correct"]
    gid = store.scalar("SELECT group_id FROM rollouts WHERE correct ORDER BY rollout_id LIMIT 1")
    header_before = [(r["rollout_id"], r["correct"], r["accuracy"]) for r in queries.scored_group(store, group_id=gid).rows]
    assert before[0] > 0
    _score_with_a_reward_model(store)
    for shown in (None, RM, "arithmetic@52029205d6"):
        assert _correct_counts(store, shown) == before
        page = queries.rollout_table(store, RolloutFilter(limit=100_000), shown).set_index("rollout_id")
        pd.testing.assert_series_equal(page["correct"].loc[page_before.index], page_before)
        rows = queries.scored_group(store, group_id=gid, rule_version_id=shown).rows
        assert [(r["rollout_id"], r["correct"], r["accuracy"]) for r in rows] == header_before
        group = queries.group(store, gid, shown)
        assert list(group["correct"]) == [c for _, c, _ in header_before]
    # the table says which version each reward comes from: the reward model's, each rollout's latest scoring
    latest = queries.rollout_table(store, RolloutFilter(limit=18))
    assert set(latest["version"]) == {RM}
    assert set(queries.rollout_table(store, RolloutFilter(limit=18), "arithmetic@52029205d6")["version"]) == {
        "arithmetic@52029205d6"}


def test_a_reward_filter_reads_one_version_and_says_so(seeded_store):
    """Rewards of two versions on different scales: under "latest scoring" a reward range (or a sort by
    reward) reads the newest version that scored the rows, the note names the others, and the rows
    shown carry that version's rewards; a version asked for reads that one, with no note."""
    store = seeded_store
    older = "arithmetic@52029205d6"
    _score_with_a_reward_model(store)
    # the reward model scored only half the rollouts: the rest keep the rule as their latest scoring
    half = store.df("SELECT rollout_id FROM rollouts ORDER BY rollout_id")["rollout_id"].iloc[::2].tolist()
    store.cursor().execute("DELETE FROM rewards WHERE rule_version_id = ? AND list_contains(?, rollout_id)", [RM, half])
    mixed = queries.rollout_table(store, RolloutFilter(limit=100_000))
    assert set(mixed["version"]) == {RM, older}
    f = RolloutFilter(reward_min=0.0, limit=100_000)
    src = reward_source(store, f)
    assert src.version == RM and src.versions == (RM, older) and not src.asked
    assert RM in src.note and older in src.note
    got = queries.rollout_table(store, f)
    assert set(got["version"]) == {RM} and (got["reward"] >= 0).all()
    want = store.scalar("SELECT count(*) FROM rewards WHERE rule_version_id = ? AND component = 'total' AND value >= 0",
                        [RM])
    assert len(got) == want == queries.rollout_table_count(store, f)
    assert got.attrs["reward_source"].note
    page, n = queries.rollout_table_counted(store, RolloutFilter(reward_min=0.0, limit=18))
    assert n == want and list(page["rollout_id"]) == list(got["rollout_id"].iloc[:18])
    by = queries.rollout_table(store, RolloutFilter(limit=100_000), sort=("reward", True))
    assert set(by["version"]) == {RM} and by["reward"].dropna().is_monotonic_decreasing
    asked = queries.rollout_table(store, RolloutFilter(reward_min=1.0, limit=100_000), older)
    assert set(asked["version"]) == {older} and asked.attrs["reward_source"].note is None
    assert len(asked) == store.scalar("""SELECT count(*) FROM rewards WHERE rule_version_id = ? AND component = 'total'
                                          AND value >= 1""", [older])


def test_a_schema_7_store_gets_its_correctness_backfilled(tmp_path):
    """A store from before correctness was a column: its rollouts' correctness comes from the built-in
    rule's accuracy component (SQL), and those the task can check that were never scored by it from
    the task's verdict, on open."""
    path = tmp_path / "old.duckdb"
    s = open_store(path, seeded=True)
    want = s.df("SELECT rollout_id, correct FROM rollouts ORDER BY rollout_id")
    unscored = want["rollout_id"].iloc[:40].tolist()
    with s.transaction() as cur:
        cur.execute("DELETE FROM rewards WHERE list_contains(?, rollout_id)", [unscored])  # only the verdict can tell
        for col in ("prompt_text", "answer", "correct"):
            cur.execute(f"ALTER TABLE rollouts DROP COLUMN {col}")
        cur.execute("ALTER TABLE prompts DROP COLUMN messages")
        cur.execute("DROP TABLE tasks")
        cur.execute("UPDATE meta SET value = '7' WHERE key = 'schema_version'")
    s.close()
    s = Store.open(path)
    try:
        assert s.scalar("SELECT value FROM meta WHERE key='schema_version'") == str(schema.SCHEMA_VERSION)
        got = s.df("SELECT rollout_id, correct FROM rollouts ORDER BY rollout_id")
        pd.testing.assert_frame_equal(got, want)
        assert s.scalar("SELECT count(answer) FROM rollouts WHERE list_contains(?, rollout_id)", [unscored]) > 0
    finally:
        s.close()


def test_an_imported_correctness_field_sets_rollouts_correct(tmp_path):
    """An import's correctness field is the rollout's correctness (and still a component of its version)."""
    from studio.ingest.formats import ColumnMapping
    from studio.ingest.importers import import_run

    rows = pd.DataFrame({"prompt": ["Q: 1+1="] * 4, "completion": ["2", "3", "2", "x"],
                         "reward": [1.2, 0.1, 1.1, 0.0], "is_correct": [1.0, 0.0, 1.0, None]})
    f = tmp_path / "run.parquet"
    rows.to_parquet(f)
    store = Store.open(tmp_path / "s.duckdb")
    try:
        import_run(store, [f], fmt="generic", mapping=ColumnMapping(prompt="prompt", completion="completion",
                                                                     reward="reward", rewards=("is_correct",)))
        got = store.df("SELECT text, correct FROM rollouts ORDER BY sample_idx")
        assert got["correct"].tolist()[:3] == [True, False, True] and pd.isna(got["correct"].iloc[3])
        assert queries.rollout_table_count(store, RolloutFilter(correct=True)) == 2
    finally:
        store.close()
