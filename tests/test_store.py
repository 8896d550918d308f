"""The DuckDB store: round trips, atomic writes, and refusing bad files without touching them."""
import hashlib
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from sample_data import ROLLOUTS_DIR
from studio import queries
from studio.rewards import ARITHMETIC_V1
from studio.runs.generation import ingest
from studio.store import Store, StoreError, schema
from studio.store.runs import start_run
from studio.tasks import get_task


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_new_store_is_seeded_with_the_sample_rollouts(seeded_store):
    c = seeded_store.counts()
    shipped = pd.read_parquet(ROLLOUTS_DIR / "rollouts.parquet")
    assert c["rollouts"] == len(shipped) >= 256 and c["tokens"] > 10 * c["rollouts"]
    assert seeded_store.scalar("SELECT value FROM meta WHERE key='schema_version'") == str(schema.SCHEMA_VERSION)
    # every rollout has its components under the built-in rule version
    per = seeded_store.df("SELECT rollout_id, count(*) AS n FROM rewards GROUP BY 1")
    assert len(per) == c["rollouts"] and set(per["n"]) == {4}


def test_generation_round_trip(sample_policy, tmp_path):
    task = get_task("arithmetic")
    prompts = [task.parse_prompt("Q: 23+48-7="), task.parse_prompt("Q: 5-9=")]
    gens = sample_policy.sample([p.text for p in prompts], n=3, seed=2)
    path = tmp_path / "s.duckdb"
    store = Store.open(path)
    run = start_run(store, "generate", "test", "sample", "arithmetic", {})
    n, groups = ingest(store, run, task, prompts, gens, ARITHMETIC_V1, "policy@abc")
    assert n == 6 and len(groups) == 2
    store.close()

    store = Store.open(path)  # survives a reopen
    table = queries.rollout_table(store)
    assert len(table) == 6 and table.groupby("group_id").size().tolist() == [3, 3]
    g0 = next(g for g in gens if g.prompt_index == 0)
    row = table[(table.prompt == "Q: 23+48-7=") & (table.completion == g0.text)].iloc[0]
    toks = queries.tokens(store, row.rollout_id)
    assert toks["token_id"].tolist() == g0.token_ids.tolist()
    assert toks["token_text"].tolist() == g0.token_texts
    assert toks["entropy"].to_numpy() == pytest.approx(g0.entropies, abs=1e-6)
    assert [list(x) for x in toks["topk_ids"]] == g0.topk_ids.tolist()
    expected = ARITHMETIC_V1.score(task, prompts[0], g0.text)
    assert queries.rollout(store, row.rollout_id)["components"] == pytest.approx(expected)
    store.close()


def test_step_index_follows_the_task_spans(sample_policy):
    from studio.store.records import step_index

    task = get_task("arithmetic")
    p = task.parse_prompt("Q: 23+48-7=")
    texts = list("23+48=71;71-7=64;A:64") + ["<eos>"]
    idx = step_index(texts, task, p, "23+48=71;71-7=64;A:64")
    # 8 chars + ';' in step 0, 7 chars + ';' in step 1, answer and end token in none
    assert idx == [0] * 9 + [1] * 8 + [None] * 5


def test_failed_write_leaves_nothing(tmp_path):
    store = Store.open(tmp_path / "s.duckdb")
    good = pd.DataFrame([{"run_id": "r1", "kind": "generate", "name": "ok"}])
    bad = pd.DataFrame([{"rollout_id": "x", "not_a_column": 1}])
    with pytest.raises(StoreError, match="no columns"):
        store.write({"runs": good, "rollouts": bad})
    assert store.scalar("SELECT count(*) FROM runs") == 0


def test_corrupt_file_is_refused_and_untouched(tmp_path):
    path = tmp_path / "corrupt.duckdb"
    path.write_bytes(b"DUCK" + bytes(range(256)) * 64)
    before = digest(path)
    with pytest.raises(StoreError, match="not a readable DuckDB store"):
        Store.open(path)
    assert digest(path) == before


def test_newer_schema_is_refused_and_untouched(tmp_path):
    path = tmp_path / "future.duckdb"
    store = Store.open(path)
    with store.transaction() as cur:
        cur.execute("UPDATE meta SET value = '999' WHERE key = 'schema_version'")
    store.close()
    before = digest(path)
    with pytest.raises(StoreError, match="newer Rollout Studio \\(schema 999\\)"):
        Store.open(path)
    assert digest(path) == before


def test_duckdb_file_that_is_not_a_store(tmp_path):
    import duckdb

    path = tmp_path / "other.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE x AS SELECT 1 AS a")
    con.close()
    with pytest.raises(StoreError, match="not a Rollout Studio store"):
        Store.open(path)


def test_file_locked_by_another_process(tmp_path):
    path = tmp_path / "busy.duckdb"
    Store.open(path).close()
    holder = subprocess.Popen([sys.executable, "-c",
                               f"import duckdb,sys,time; c=duckdb.connect({str(path)!r}); print('ready', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(StoreError, match="open in another process"):
            Store.open(path)
    finally:
        holder.kill()
        holder.wait()


def test_filters(seeded_store):
    all_rows = queries.rollout_table(seeded_store)
    ok = queries.rollout_table(seeded_store, queries.RolloutFilter(correct=True))
    bad = queries.rollout_table(seeded_store, queries.RolloutFilter(correct=False))
    assert len(ok) + len(bad) == len(all_rows) and ok["correct"].all() and not bad["correct"].any()
    hi = queries.rollout_table(seeded_store, queries.RolloutFilter(reward_min=1.0))
    assert (hi["reward"] >= 1.0).all() and len(hi) > 0
    some = all_rows["prompt"].iloc[0]
    by_prompt = queries.rollout_table(seeded_store, queries.RolloutFilter(prompt_contains=some[3:]))
    assert set(by_prompt["prompt"]) >= {some} and len(by_prompt) < len(all_rows)
    # filtering never changes a rollout's advantage (it is computed over the whole group)
    merged = ok.merge(all_rows, on="rollout_id", suffixes=("", "_all"))
    assert merged["advantage"].to_numpy() == pytest.approx(merged["advantage_all"].to_numpy())
    # SQL-looking input is just text
    assert queries.rollout_table(seeded_store, queries.RolloutFilter(prompt_contains="'; DROP TABLE rollouts; --")).empty
    assert seeded_store.counts()["rollouts"] == len(all_rows)


def test_group_view_data(seeded_store):
    gs = queries.groups(seeded_store)
    g = queries.group(seeded_store, gs["group_id"].iloc[0])
    assert len(g) == gs["size"].iloc[0] and g.attrs["components"] == ["accuracy", "format", "steps"]
    assert g["advantage"].sum() == pytest.approx(0.0, abs=1e-6)
    flagged = gs[gs["all_equal"]]
    for gid in flagged["group_id"]:
        assert (queries.group(seeded_store, gid)["advantage"] == 0).all()


def test_groups_of_given_ids_and_the_newest(seeded_store):
    """The group picker's reads: just the groups asked for, or the newest few, with the same rows
    as listing every group."""
    every = queries.groups(seeded_store).set_index("group_id")
    some = list(every.index[3:6])
    picked = queries.groups(seeded_store, group_ids=some).set_index("group_id")
    assert set(picked.index) == set(some)
    pd.testing.assert_frame_equal(picked.loc[some], every.loc[some])
    newest = queries.groups(seeded_store, limit=5)
    assert len(newest) == 5
    assert newest["created_at"].min() >= every["created_at"].sort_values(ascending=False).iloc[4]


def test_table_pages_count_and_sort_every_row_in_the_store(seeded_store):
    """What the table's pager relies on: pages cut in DuckDB join up to the whole filter, the
    count is the filter's row count, and a sort orders every row before the page is cut."""
    from studio.queries import RolloutFilter

    everything = RolloutFilter(limit=100_000)
    whole = queries.rollout_table(seeded_store, everything)
    pages = pd.concat([queries.rollout_table(seeded_store, RolloutFilter(limit=18), offset=o)
                       for o in range(0, len(whole), 18)])
    assert list(pages["rollout_id"]) == list(whole["rollout_id"])
    for f in (RolloutFilter(), RolloutFilter(correct=True), RolloutFilter(prompt_contains="3"),
              RolloutFilter(reward_min=0.5, reward_max=1.2), RolloutFilter(run_id=whole["rollout_id"].iloc[0])):
        assert queries.rollout_table_count(seeded_store, f) == len(queries.rollout_table(seeded_store, replace(f, limit=100_000)))
    assert queries.rollout_table_count(seeded_store, RolloutFilter()) == len(whole) > 100
    by = queries.rollout_table(seeded_store, everything, sort=("reward", True))
    assert by["reward"].is_monotonic_decreasing and by["reward"].iloc[0] > by["reward"].iloc[-1]
    assert sorted(by["rollout_id"]) == sorted(whole["rollout_id"])
    second = queries.rollout_table(seeded_store, RolloutFilter(limit=18), offset=18, sort=("reward", True))
    assert list(second["rollout_id"]) == list(by["rollout_id"].iloc[18:36])
    short = queries.rollout_table(seeded_store, RolloutFilter(limit=18), sort=("n_tokens", False))
    assert list(short["n_tokens"]) == sorted(whole["n_tokens"])[:18]
    with pytest.raises(ValueError, match="cannot sort the rollout table by 'gold'"):
        queries.rollout_table(seeded_store, sort=("gold", True))


def test_a_page_carries_its_filter_s_count_where_its_read_knew_it(seeded_store):
    """Under a sort by reward or advantage the page comes from scoring every row under the filter,
    and that pass counts them; under a reward range over the whole store the version's reward rows
    count them (``reward_source``): the table shows that count, not a second pass. It equals the
    filter's count on every page, and the page's rows are the same. Correctness is a column of the
    rollouts: its pages are cut from them first (only their groups scored), equal to the same rows
    of the filter scored whole, and leave the count to ``rollout_table_count``."""
    from studio.queries import PAGE_FIRST_MAX, RolloutFilter

    run = seeded_store.scalar("SELECT run_id FROM rollouts ORDER BY rollout_id LIMIT 1")
    for f, sort in ((RolloutFilter(reward_min=0.5, limit=18), None), (RolloutFilter(limit=18), ("reward", False)),
                    (RolloutFilter(correct=True, reward_min=0.5, limit=18), ("advantage", True))):
        want = queries.rollout_table_count(seeded_store, f)
        assert want > 18
        for offset in (0, 18, want - 1):
            page, n = queries.rollout_table_counted(seeded_store, f, offset=offset, sort=sort)
            pd.testing.assert_frame_equal(page, queries.rollout_table(seeded_store, f, offset=offset, sort=sort))
            assert n == want and "_total" not in page.columns
        if sort is not None:
            assert queries.rollout_table_counted(seeded_store, f, offset=want, sort=sort)[1] is None  # no rows
    for f, sort in ((RolloutFilter(correct=False, limit=18), None), (RolloutFilter(correct=True, limit=18), None),
                    (RolloutFilter(prompt_contains="3", correct=False, limit=18), None),
                    (RolloutFilter(run_id=run, correct=False, limit=18), ("n_tokens", True)),
                    (RolloutFilter(correct=True, limit=18), ("correct", False)),
                    (RolloutFilter(limit=18), None), (RolloutFilter(run_id=run, limit=18), ("n_tokens", True))):
        whole = queries.rollout_table(seeded_store, replace(f, limit=PAGE_FIRST_MAX + 1), sort=sort)
        assert len(whole) == queries.rollout_table_count(seeded_store, f) > 36
        for offset in (0, 18, len(whole) - 5):
            page, n = queries.rollout_table_counted(seeded_store, f, offset=offset, sort=sort)
            assert not queries.scores_scope(f, sort) and n is None
            pd.testing.assert_frame_equal(page.reset_index(drop=True),
                                          whole.iloc[offset:offset + 18].reset_index(drop=True))


@pytest.mark.parametrize("column", sorted(queries.ROLLOUT_SORTS))
def test_pages_sorted_by_a_rollout_column_are_the_rows_of_the_whole_sorted_table(seeded_store, column):
    """Sorts that do not depend on rewards cut their page from the rollouts and score only its groups:
    every page, either way round and far down, holds the same rows, rewards and advantages as the
    filter scored whole and sorted (a limit above PAGE_FIRST_MAX takes that path)."""
    from studio.queries import PAGE_FIRST_MAX, RolloutFilter

    for desc in (False, True):
        whole = queries.rollout_table(seeded_store, RolloutFilter(limit=PAGE_FIRST_MAX + 1), sort=(column, desc))
        assert len(whole) > 100
        for offset in (0, 18, len(whole) - 10):
            page = queries.rollout_table(seeded_store, RolloutFilter(limit=18), offset=offset, sort=(column, desc))
            pd.testing.assert_frame_equal(page.reset_index(drop=True),
                                          whole.iloc[offset:offset + 18].reset_index(drop=True))
    run = whole["run"].iloc[0]
    run_id = seeded_store.scalar("SELECT run_id FROM runs WHERE name = ?", [run])
    f = RolloutFilter(run_id=run_id, prompt_contains="1")
    whole = queries.rollout_table(seeded_store, replace(f, limit=PAGE_FIRST_MAX + 1), sort=(column, True))
    page = queries.rollout_table(seeded_store, replace(f, limit=18), offset=5, sort=(column, True))
    pd.testing.assert_frame_equal(page.reset_index(drop=True), whole.iloc[5:23].reset_index(drop=True))


def test_a_newer_rule_version_does_not_blank_out_older_rollouts(seeded_store, sample_policy):
    """Each rollout shows its latest scoring: a new rule that scored only new rollouts
    leaves the others' rewards and advantages in place."""
    from studio.rewards import Rule, answer_correct

    before = queries.rollout_table(seeded_store).set_index("rollout_id")
    task = get_task("arithmetic")
    prompts = [task.parse_prompt("Q: 7+8=")]
    strict = Rule("strict", {"accuracy": answer_correct})
    run = start_run(seeded_store, "generate", "new rule", "sample", "arithmetic", {})
    ingest(seeded_store, run, task, prompts, sample_policy.sample([p.text for p in prompts], n=2, seed=0),
           strict, None)
    after = queries.rollout_table(seeded_store).set_index("rollout_id")
    assert len(after) == len(before) + 2
    old = after.loc[before.index]
    assert old["reward"].tolist() == before["reward"].tolist()
    assert old["advantage"].tolist() == pytest.approx(before["advantage"].tolist())
    new = after.drop(before.index)
    assert set(new["reward"]) <= {0.0, 1.0}  # scored by the strict rule: accuracy only
    # an explicit version shows every rollout under it: the old ones have no score there
    only_strict = queries.rollout_table(seeded_store, rule_version_id=strict.version_id)
    assert only_strict["reward"].notna().sum() == 2


def test_a_runaway_query_is_stopped_with_a_message(seeded_store):
    from studio.store import QueryTimeout

    before = seeded_store.counts()
    with pytest.raises(QueryTimeout, match="stopped after 0.5 s"):
        seeded_store.df("SELECT sum(a.range * b.range) FROM range(300000) a, range(300000) b", timeout_s=0.5)
    assert seeded_store.counts() == before  # and the connection still answers


def _as_schema_6(cur) -> None:
    """A store as schema 6 had it: token rows in the table ``tokens``, no shards."""
    cur.execute("DROP VIEW tokens")
    cur.execute("DROP TABLE token_shards")
    cur.execute("DROP TABLE tokens_moved")
    cur.execute("ALTER TABLE token_rows RENAME TO tokens")


def test_a_schema_6_store_keeps_its_token_rows_in_token_rows_read_through_the_tokens_view(tmp_path):
    from sample_data import ROLLOUTS_DIR

    path = tmp_path / "v6.duckdb"
    s = Store.open(path, seed_dir=ROLLOUTS_DIR)
    counts = s.counts()
    first = s.df("SELECT * FROM tokens ORDER BY rollout_id, pos LIMIT 50")
    with s.transaction() as cur:
        _as_schema_6(cur)
        cur.execute("UPDATE meta SET value = '6' WHERE key = 'schema_version'")
    s.close()
    s = Store.open(path)
    assert s.scalar("SELECT value FROM meta WHERE key='schema_version'") == str(schema.SCHEMA_VERSION)
    assert s.counts() == counts
    assert s.scalar("SELECT table_type FROM information_schema.tables WHERE table_name = 'tokens'") == "VIEW"
    assert s.scalar("SELECT count(*) FROM token_rows") == counts["tokens"]
    assert s.df("SELECT * FROM tokens ORDER BY rollout_id, pos LIMIT 50").equals(first)
    assert s.shard_paths() == []
    s.close()


def test_a_schema_1_store_is_migrated_and_keeps_its_rows(tmp_path):
    from sample_data import ROLLOUTS_DIR

    path = tmp_path / "v1.duckdb"
    s = Store.open(path, seed_dir=ROLLOUTS_DIR)
    counts = s.counts()
    with s.transaction() as cur:  # what a schema-1 file looks like: no token_scores
        _as_schema_6(cur)
        cur.execute("DROP TABLE token_scores")
        cur.execute("DROP TABLE import_files")
        cur.execute("ALTER TABLE rollouts DROP COLUMN enriched_by")
        cur.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    s.close()
    s = Store.open(path)
    assert s.scalar("SELECT value FROM meta WHERE key='schema_version'") == str(schema.SCHEMA_VERSION) == "11"
    assert s.scalar("SELECT count(*) FROM token_scores") == 0
    assert s.scalar("SELECT count(*) FROM import_files") == 0
    assert s.scalar("SELECT count(enriched_by) FROM rollouts") == 0
    assert s.counts() == counts
    s.close()


def test_a_schema_2_store_gains_token_values_and_keeps_its_scores(tmp_path):
    from sample_data import ROLLOUTS_DIR

    path = tmp_path / "v2.duckdb"
    s = Store.open(path, seed_dir=ROLLOUTS_DIR)
    with s.transaction() as cur:  # what a schema-2 file looks like: token_scores without value
        _as_schema_6(cur)
        cur.execute("DROP TABLE token_scores")
        cur.execute("CREATE TABLE token_scores (rollout_id VARCHAR NOT NULL, pos INTEGER NOT NULL, "
                    "policy_version VARCHAR NOT NULL, logprob FLOAT, entropy FLOAT)")
        cur.execute("INSERT INTO token_scores VALUES ('r1', 0, 'p@1', -0.5, 0.25)")
        cur.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    s.close()
    s = Store.open(path)
    assert s.scalar("SELECT value FROM meta WHERE key='schema_version'") == str(schema.SCHEMA_VERSION)
    assert s.df("SELECT logprob, entropy, value FROM token_scores").values.tolist()[0][:2] == [-0.5, 0.25]
    assert s.scalar("SELECT value FROM token_scores") is None
    s.close()


def test_a_schema_3_store_gains_the_training_columns_and_keeps_its_rows(tmp_path):
    from sample_data import ROLLOUTS_DIR

    path = tmp_path / "v3.duckdb"
    s = Store.open(path, seed_dir=ROLLOUTS_DIR)
    n = s.scalar("SELECT count(*) FROM tokens")
    with s.transaction() as cur:  # what a schema-3 file looks like: none of the mini-run columns
        _as_schema_6(cur)
        cur.execute("ALTER TABLE runs DROP COLUMN error")
        cur.execute("ALTER TABLE tokens DROP COLUMN train_weight")
        cur.execute("ALTER TABLE rollouts DROP COLUMN train_advantage")
        cur.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    s.close()
    s = Store.open(path)
    assert s.scalar("SELECT value FROM meta WHERE key='schema_version'") == str(schema.SCHEMA_VERSION)
    assert s.scalar("SELECT count(*) FROM tokens WHERE train_weight IS NULL") == n
    assert s.scalar("SELECT count(*) FROM rollouts WHERE train_advantage IS NULL") == 512
    assert s.scalar("SELECT count(error) FROM runs") == 0
    s.close()


def test_a_schema_4_store_gains_the_curation_tables_and_keeps_its_preference_rows(tmp_path):
    from sample_data import ROLLOUTS_DIR

    path = tmp_path / "v4.duckdb"
    s = Store.open(path, seed_dir=ROLLOUTS_DIR)
    counts = s.counts()
    with s.transaction() as cur:  # what a schema-4 file looks like: the placeholder preferences table, no curation
        _as_schema_6(cur)
        for table in ("pairs", "pair_builds", "exports", "export_pairs"):
            cur.execute(f"DROP TABLE {table}")
        cur.execute("CREATE TABLE preferences (pair_id VARCHAR PRIMARY KEY, prompt_id VARCHAR, "
                    "chosen_rollout_id VARCHAR, rejected_rollout_id VARCHAR, origin VARCHAR, margin DOUBLE, "
                    "status VARCHAR, note VARCHAR)")
        cur.execute("INSERT INTO preferences VALUES ('pr1', 'p1', 'ra', 'rb', 'hand', 0.5, 'accepted', 'kept')")
        cur.execute("UPDATE meta SET value = '4' WHERE key = 'schema_version'")
    s.close()
    s = Store.open(path)
    assert s.scalar("SELECT value FROM meta WHERE key='schema_version'") == str(schema.SCHEMA_VERSION)
    assert s.counts() == counts
    row = s.df("SELECT * FROM pairs").iloc[0]
    assert (row["pair_id"], row["chosen_rollout_id"], row["rejected_rollout_id"], row["status"], row["note"],
            row["kind"], row["source"], bool(row["swapped"])) == ("pr1", "ra", "rb", "accepted", "kept", "completion",
                                                                  "hand", False)
    assert s.scalar("SELECT count(*) FROM information_schema.tables WHERE table_name = 'preferences'") == 0
    assert s.scalar("SELECT count(*) FROM pair_builds") == s.scalar("SELECT count(*) FROM exports") == 0
    s.close()
    s = Store.open(path)  # opening again changes nothing
    assert s.scalar("SELECT count(*) FROM pairs") == 1
    s.close()


def test_new_ids_sort_in_the_order_they_were_made():
    """Rollout ids are made in order, so a lookup of one rollout's tokens among millions
    skips the row groups whose id range cannot hold it (DuckDB zone maps)."""
    from studio.store.records import new_id, new_ids

    ids = [new_id("r") for _ in range(50)] + list(new_ids("r", 5000)) + [new_id("r")]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert {len(i) for i in ids} == {17} and all(i.startswith("r") for i in ids)
    # the first 8 bytes (what DuckDB's string statistics keep) differ from one id to the next
    assert len({i[:8] for i in ids}) == len(ids)


def test_reads_share_one_watchdog_and_a_slow_one_is_still_stopped(seeded_store):
    import threading

    from studio.store import QueryTimeout

    for _ in range(50):
        seeded_store.scalar("SELECT count(*) FROM rollouts")
    before = threading.active_count()
    for _ in range(200):
        seeded_store.scalar("SELECT count(*) FROM rollouts")
    assert threading.active_count() == before  # no thread per read
    with pytest.raises(QueryTimeout):
        seeded_store.df("SELECT sum(a.range * b.range) FROM range(300000) a, range(300000) b", timeout_s=0.3)
    assert seeded_store.scalar("SELECT count(*) FROM rollouts") == 512


def test_a_store_file_written_by_duckdb_2_says_how_to_convert_it(tmp_path):
    """``tests/data/store_duckdb2.duckdb``: an empty store the studio wrote under DuckDB 2.0.1 (before
    it moved to 1.5.5 for shared stores). DuckDB 1.5 cannot read it: the message says how to convert
    it, and the file is left as it was."""
    import shutil

    path = tmp_path / "old.duckdb"
    shutil.copy(Path(__file__).parent / "data" / "store_duckdb2.duckdb", path)
    before = path.read_bytes()
    with pytest.raises(StoreError, match=r"written by a newer DuckDB.*pip install duckdb==2.0.1.*STORAGE_VERSION"):
        Store.open(path)
    assert path.read_bytes() == before
