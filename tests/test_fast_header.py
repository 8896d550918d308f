"""The token strip's header from point reads (``queries.scored_group``: the group's rows, their
rewards, the numpy twins of the estimators) against the SQL path it replaces
(``scored_rollouts_sql`` over the rollout's group), case by case: every estimator and setting,
every rule version (the newest per rollout, or one asked for), on groups built to hit the SQL's
rules: equal rewards, missing and NULL rewards, NaN rewards, versions without a time or missing
from ``rule_versions``, a group of one, rollouts without tokens or without a prompt row,
REINFORCE++ batches (NULL steps, a group across two steps), reference log-probs and critic
values with gaps, and imported runs (TRL tables, an OpenRLHF board with its critic's values).
Then: a write is never answered from an earlier read, the click's shared reads equal separate
ones, and the token read's DataFrame is ``Store.df``'s.
"""
from __future__ import annotations

import math
from datetime import datetime, timedelta

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from sample_data import ROLLOUTS_DIR
from studio import queries
from studio.ingest.importers import import_run
from studio.queries import credit
from studio.queries.reads import _small_df
from studio.queries.scoring import _components_dict
from studio.signals.advantages import Credit, reinforce_pp, whiten
from studio.signals.steps import Segmenter
from studio.store import Store
from tests.fixtures import board_line, trl_log, write_jsonl

TOL = 1e-12  # the numpy twins sum in another order than DuckDB: equal to the last few bits
T0 = datetime(2030, 1, 1)  # after the seeded rule version


# ---------------------------------------------------------------------------- the SQL path

def sql_rows(store: Store, group_id: str, rv: str | None, cr: Credit) -> dict[str, dict]:
    """What ``queries.rollout`` returned for each rollout of the group before the fast path:
    ``scored_rollouts_sql`` over the group with components, joined to its prompt and run."""
    base, params = queries.scored_rollouts_sql(rv, "ro.group_id = ?", [group_id], cr, components=True)
    df = store.df(f"""
        SELECT s.* EXCLUDE (_components), p.text AS prompt, p.gold, p.task, r.name AS run, r.policy, s._components
        FROM ({base}) s JOIN prompts p USING (prompt_id) JOIN runs r USING (run_id)""", params)
    out = {}
    for rec in df.to_dict("records"):
        rec["components"] = _components_dict(rec.pop("_components"))
        out[rec["rollout_id"]] = rec
    return out


def sql_rollout(store: Store, rollout_id: str, rv: str | None, cr: Credit) -> dict | None:
    """The SQL ``queries.rollout`` itself (the group found from the rollout id)."""
    base, params = queries.scored_rollouts_sql(rv, queries.GROUP_OF, [rollout_id], cr, components=True)
    rows = store.df(f"""
        SELECT s.* EXCLUDE (_components), p.text AS prompt, p.gold, p.task, r.name AS run, r.policy, s._components
        FROM ({base}) s JOIN prompts p USING (prompt_id) JOIN runs r USING (run_id)
        WHERE s.rollout_id = ?""", params + [rollout_id])
    if rows.empty:
        return None
    out = rows.drop(columns="_components").iloc[0].to_dict()
    out["components"] = _components_dict(rows["_components"].iloc[0])
    return out


def _null(x) -> bool:
    return x is None or x is pd.NA or x is pd.NaT or (isinstance(x, (float, np.floating)) and math.isnan(x))


def differences(fast: dict, sql: dict) -> list[str]:
    """Fields where the fast row is not the SQL row: same keys in the same order, NULLs alike,
    floats within TOL, an exact 0 (a collapsed group) exactly 0, everything else equal."""
    if list(fast) != list(sql):
        return [f"keys {list(fast)} != {list(sql)}"]
    out = []
    for k, b in sql.items():
        a = fast[k]
        if k == "components":
            if list(a) != list(b) or any(differences({c: a[c]}, {c: b[c]}) for c in b):
                out.append(f"components {a} != {b}")
        elif _null(a) or _null(b):
            if not (_null(a) and _null(b)):
                out.append(f"{k}: {a!r} != {b!r}")
        elif isinstance(a, float) or isinstance(b, (float, np.floating)):
            if abs(float(a) - float(b)) > TOL or (float(b) == 0.0) != (float(a) == 0.0):
                out.append(f"{k}: {a!r} != {b!r}")
        elif a != b:
            out.append(f"{k}: {a!r} != {b!r}")
    return out


# ---------------------------------------------------------------------------- a store with every case

def version(store, vid: str, at: datetime | None) -> None:
    store.write({"rule_versions": pd.DataFrame({"rule_version_id": [vid], "name": [vid.split("@")[0]],
                                                "source": [""], "sha256": [""],
                                                "created_at": pd.Series([at], dtype="datetime64[us]"),
                                                "note": [""]})})


def rewards(store, rows: list[tuple]) -> None:
    """``(rollout_id, version, component, value)`` rows, through Arrow: NaN stays NaN, None is NULL."""
    rid, ver, comp, val = zip(*rows)
    store.write({"rewards": pa.table({"rollout_id": list(rid), "rule_version_id": list(ver), "component": list(comp),
                                      "value": pa.array(val, type=pa.float64(), from_pandas=False),
                                      "error": [None if v is not None else "ZeroDivisionError" for v in val]})})


def rollouts(store, rows: list[dict]) -> list[str]:
    """New rollouts (no tokens) from ``{rollout_id, run_id, group_id, train_step, prompt_id, sample_idx}``."""
    frame = pd.DataFrame([{"text": f"completion {r['rollout_id']}", "n_tokens": 3, "finish_reason": "stop",
                           "created_at": T0, **r} for r in rows])
    store.write({"rollouts": frame})
    return frame["rollout_id"].tolist()


def token_scores(store, rids: list[str], pv: str, column: str, drop: dict[str, int]) -> None:
    """Fake ``token_scores`` of ``pv`` for every token of ``rids`` (``drop``: rollout → a position left out)."""
    toks = store.df("SELECT rollout_id, pos, logprob FROM tokens WHERE rollout_id IN (SELECT unnest(?::VARCHAR[]))",
                    [rids])
    toks = toks[[drop.get(r) != p for r, p in zip(toks["rollout_id"], toks["pos"])]]
    rng = np.random.default_rng(len(pv))
    frame = pd.DataFrame({"rollout_id": toks["rollout_id"], "pos": toks["pos"], "policy_version": pv})
    frame[column] = (toks["logprob"] - rng.random(len(toks)) * 0.5) if column == "logprob" else rng.random(len(toks))
    store.write({"token_scores": frame})


def build_cases(store, tmp_path) -> dict:
    """Cases on top of the seeded sample; returns the groups to check and the settings to check them with."""
    g = store.df("SELECT group_id, list(rollout_id ORDER BY sample_idx) AS ids FROM rollouts GROUP BY 1 ORDER BY 1")
    ids = dict(zip(g["group_id"], g["ids"]))
    gids = list(ids)
    seed_v = store.scalar("SELECT rule_version_id FROM rule_versions")
    run = store.scalar("SELECT run_id FROM runs")
    prompt = store.scalar("SELECT prompt_id FROM prompts LIMIT 1")
    e, m, n, x, k = (list(ids[gid]) for gid in gids[:5])
    # E: a newer version gives all eight the same total (0.1 + 0.125, with float residue) ...
    version(store, "tie@1", T0)
    rewards(store, [(r, "tie@1", c, v) for r in e for c, v in (("total", 0.1 * 1.0 + 0.25 * 0.5), ("accuracy", 1.0))])
    # ... and one without a time gives them other totals, which arg_max skips
    version(store, "undated@1", None)
    rewards(store, [(r, "undated@1", "total", float(i)) for i, r in enumerate(e)])
    # M: a newer version scores half the group (the other half keeps the seeded version), and a
    # version missing from rule_versions scores all of it (not picked: the SQL joins rule_versions)
    version(store, "part@1", T0 + timedelta(minutes=1))
    rewards(store, [(r, "part@1", c, v) for i, r in enumerate(m[:4])
                    for c, v in (("total", 0.3 * i), ("accuracy", float(i % 2)), ("format", 0.5))])
    rewards(store, [(r, "ghost@1", "total", 9.0) for r in m])
    # N: a rule that failed on two rollouts (NULL totals), and one rollout with a component but no total
    version(store, "err@1", T0 + timedelta(minutes=2))
    rewards(store, [(r, "err@1", "total", None if i < 2 else 0.1 * i) for i, r in enumerate(n[:7])]
            + [(n[7], "err@1", "format", 1.0), (n[2], "err@1", "accuracy", None)])
    # X: a NaN total (a trainer logged nan); a total written twice, once NaN (SQL's max: NaN) and once
    # larger (max: the larger)
    version(store, "nan@1", T0 + timedelta(minutes=3))
    rewards(store, [(r, "nan@1", "total", math.nan if i == 0 else 0.2 * i) for i, r in enumerate(x)]
            + [(x[1], "nan@1", "total", math.nan), (x[2], "nan@1", "total", 7.0), (x[2], "nan@1", "total", None)])
    # K: reference log-probs with one position missing for one rollout, critic values likewise
    token_scores(store, k, "ref@1", "logprob", {k[7]: 0})
    token_scores(store, k, "critic@1", "value", {k[6]: 2})
    # new rollouts: a group of one, a group never scored, a rollout without a prompt row (in the
    # sixth seeded group), all without tokens
    rollouts(store, [{"rollout_id": "r~solo", "run_id": run, "group_id": "g~solo", "train_step": None,
                      "prompt_id": prompt, "sample_idx": 0}])
    rewards(store, [("r~solo", seed_v, "total", 0.7)])
    rollouts(store, [{"rollout_id": f"r~bare{i}", "run_id": run, "group_id": "g~bare", "train_step": None,
                      "prompt_id": prompt, "sample_idx": i} for i in range(3)])
    rollouts(store, [{"rollout_id": "r~noprompt", "run_id": run, "group_id": gids[5], "train_step": None,
                      "prompt_id": "p~missing", "sample_idx": 8}])
    rewards(store, [("r~noprompt", seed_v, "total", 5.0)])
    # a run with training steps (REINFORCE++ whitens per step): two groups a step, one group sampled across
    # steps 1 and 2, one more run's rollouts at NULL steps, some rewards NULL
    store.write({"runs": pd.DataFrame({"run_id": ["run~steps", "run~nulls"], "kind": "minirun",
                                       "name": ["steps", "nulls"], "policy": None, "task": "arithmetic",
                                       "created_at": T0, "status": "done"})})
    rng = np.random.default_rng(7)
    rows = []
    for step, grp in ((0, "g~s0a"), (0, "g~s0b"), (1, "g~s1a"), (1, "g~s1b"), (2, "g~s2a")):
        for i in range(4):
            rows.append({"rollout_id": f"r~{grp}{i}", "run_id": "run~steps", "group_id": grp,
                         "train_step": 2 if (grp, i) == ("g~s1b", 3) else step, "prompt_id": prompt, "sample_idx": i})
    for grp in ("g~na", "g~nb"):
        rows += [{"rollout_id": f"r~{grp}{i}", "run_id": "run~nulls", "group_id": grp, "train_step": None,
                  "prompt_id": prompt, "sample_idx": i} for i in range(4)]
    new = rollouts(store, rows)
    rewards(store, [(r, seed_v, "total", None if i % 7 == 3 else float(rng.integers(0, 3)))
                    for i, r in enumerate(new)])
    # imported runs: TRL tables (steps; a reward function that returned None) and an OpenRLHF board
    # (token log-probs and its critic's values, stored as value-import@<run>)
    out = tmp_path / "trl"
    for step in (10, 20):
        prompts = [q for q in ("What is 2+2?", "Name a prime.") for _ in range(4)]
        trl_log(out, step, prompts, [f"{p} -> {i}" for i, p in enumerate(prompts)],
                {"accuracy_reward": rng.integers(0, 2, 8).astype(float).tolist(),
                 "format_reward": [0.5] * 7 + [None]})
    import_run(store, out)
    board = tmp_path / "board"
    board.mkdir()
    write_jsonl(board / "rollouts.jsonl", [board_line("Tell a joke.", ["Why", " did", " the"], 0.5, 100, 1),
                                           board_line("Tell a joke.", ["Knock", " knock"], 1.0, 100, 2),
                                           board_line("Sum 1+1", ["2"], 0.0, 101, 3)])
    board_run = import_run(store, board).run_id
    new_groups = store.df("SELECT DISTINCT group_id FROM rollouts WHERE run_id NOT IN (?) OR group_id LIKE 'g~%'",
                          [run])["group_id"].tolist()
    versions = [None] + store.df("SELECT rule_version_id FROM rule_versions ORDER BY 1")["rule_version_id"].tolist()
    return {"groups": gids[:8] + sorted(new_groups), "versions": versions + ["ghost@1"],
            "token_groups": [gids[4], gids[5]] + store.df("SELECT DISTINCT group_id FROM rollouts WHERE run_id = ?",
                                                          [board_run])["group_id"].tolist(),
            "value_import": f"value-import@{board_run}"}


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fast_header")
    store = Store.open(tmp / "studio.duckdb", seed_dir=ROLLOUTS_DIR)
    yield store, build_cases(store, tmp)
    store.close()


SEQUENCE = [Credit("grpo"), Credit("dr_grpo"), Credit("rloo"), Credit("reinforce_pp")]
TOKEN = [Credit("kl", beta=0.2, reference="ref@1"), Credit("kl", beta=0.05, reference="ref@1"), Credit("kl"),
         Credit("gae", gamma=0.9, lam=0.8, values="critic@1"), Credit("gae", values="critic@1"), Credit("gae")]


def check(store, gid: str, rv, cr: Credit) -> int:
    """Compare the fast rows of one group with the SQL rows; returns the rows compared."""
    want = sql_rows(store, gid, rv, cr)
    got = queries.scored_group(store, group_id=gid, rule_version_id=rv, credit=cr)
    assert [r["rollout_id"] for r in got.rows] == sorted(want, key=lambda r: (want[r]["sample_idx"], r)), (gid, rv, cr)
    for row in got.rows:
        diff = differences(row, want[row["rollout_id"]])
        assert not diff, (gid, rv, cr, row["rollout_id"], diff)
    return len(want)


def test_sequence_estimators_equal_the_sql_on_every_case(cases):
    store, c = cases
    n = 0
    for i, gid in enumerate(c["groups"]):
        # every version asked for on the groups built around versions; the newest and the seeded one elsewhere
        for rv in c["versions"] if i < 4 else c["versions"][:2]:
            n += sum(check(store, gid, rv, cr) for cr in SEQUENCE)
    assert n > 1500  # (4 groups x 10 versions + 19 x 2) x 4 estimators = 312 cases, ~6 rollouts each


def test_token_estimators_equal_the_sql(cases):
    store, c = cases
    credits = TOKEN + [Credit("gae", values=c["value_import"]), Credit("gae", 0.1, None, 0.5, 0.5, c["value_import"])]
    n = sum(check(store, gid, rv, cr) for gid in c["token_groups"] + c["groups"][:3] for rv in (None, c["versions"][1])
            for cr in credits)
    assert n > 600  # 7 groups x 2 versions x 8 settings = 112 cases
    # the cases are there: some first-token advantages, some NULL (a gap in the reference or the values)
    k = c["token_groups"][0]
    for cr in TOKEN[:1] + TOKEN[3:4]:
        adv = [r["advantage"] for r in queries.scored_group(store, group_id=k, credit=cr).rows]
        assert sum(math.isnan(a) for a in adv) == 1 and sum(a != 0 for a in adv if not math.isnan(a)) >= 6


def test_the_cases_are_what_they_say(cases):
    """The groups built above do hit the rules they are for (so the comparisons above test them)."""
    store, c = cases
    e, m, n, x = (queries.scored_group(store, group_id=g) for g in c["groups"][:4])
    assert {r["rule_version_id"] for r in e.rows} == {"tie@1"} and {r["advantage"] for r in e.rows} == {0.0}
    assert [r["rule_version_id"] for r in m.rows].count("part@1") == 4
    assert sum(math.isnan(r["reward"]) for r in n.rows) == 2 and n.rows[7]["rule_version_id"] != "err@1"
    assert all(math.isnan(r["advantage"]) for r in x.rows)
    solo = queries.rollout(store, "r~solo")
    assert solo["reward"] == 0.7 and solo["advantage"] == 0.0
    assert queries.rollout(store, "r~bare0")["components"] == {} and queries.rollout(store, "r~noprompt") is None
    assert "r~noprompt" in {m["rollout_id"] for m in queries.scored_group(store, "r~solo", group_id=c["groups"][5]).members}
    rpp = queries.scored_group(store, group_id="g~s1b", credit=Credit("reinforce_pp"))
    assert len({r["train_step"] for r in rpp.rows}) == 2 and any(r["advantage"] != 0 for r in rpp.rows)
    assert sum(math.isnan(r["reward"]) for g in ("g~na", "g~nb") for r in queries.scored_group(store, group_id=g).rows)


def test_rollout_equals_the_sql_rollout(cases):
    """``queries.rollout`` (found from the rollout id) equals the SQL ``rollout`` for a rollout of every group."""
    store, c = cases
    gids = c["groups"]
    rids = store.df("SELECT min(rollout_id) AS r FROM rollouts WHERE group_id IN (SELECT unnest(?::VARCHAR[])) "
                    "GROUP BY group_id", [gids])["r"].tolist() + ["r~noprompt", "nope"]
    for rid in rids:
        for rv, credits in ((None, SEQUENCE + TOKEN[:1] + TOKEN[3:4]), ("tie@1", SEQUENCE[:1])):
            for cr in credits:
                fast, sql = queries.rollout(store, rid, rv, cr), sql_rollout(store, rid, rv, cr)
                assert (fast is None) == (sql is None), (rid, rv, cr)
                assert fast is None or not differences(fast, sql), (rid, rv, cr, differences(fast, sql))


# ---------------------------------------------------------------------------- writes are never missed

def test_a_write_is_read_by_the_next_click(seeded_store):
    store = seeded_store
    rid = store.scalar("SELECT min(rollout_id) FROM rollouts")
    gid = store.scalar("SELECT group_id FROM rollouts WHERE rollout_id = ?", [rid])
    members = store.df("SELECT rollout_id FROM rollouts WHERE group_id = ? ORDER BY 1", [gid])["rollout_id"].tolist()
    before = queries.rollout(store, rid)
    view = credit.rollout_view(store, rid, Credit())
    assert not differences(view.rollout, before)
    # a rule edit: a new version scores the group, and it becomes the shown version at once
    version(store, "edit@1", T0)
    rewards(store, [(r, "edit@1", "total", float(i)) for i, r in enumerate(members)])
    after = queries.rollout(store, rid)
    assert after["rule_version_id"] == "edit@1" and after["reward"] == float(members.index(rid))
    assert not differences(after, sql_rollout(store, rid, None, Credit()))
    assert credit.rollout_view(store, rid, Credit()).rollout["advantage"] == after["advantage"] != before["advantage"]
    # new rollouts in the group move its mean: the next read has them
    rollouts(store, [{"rollout_id": "r~late", "run_id": store.scalar("SELECT run_id FROM runs"), "group_id": gid,
                      "train_step": None, "prompt_id": before["prompt_id"], "sample_idx": 9}])
    rewards(store, [("r~late", "edit@1", "total", 100.0)])
    later = queries.rollout(store, rid)
    assert later["advantage"] != after["advantage"] and not differences(later, sql_rollout(store, rid, None, Credit()))
    # a group scored before a write is not reused by token_advantages for other settings or after it
    old = queries.scored_group(store, rid)
    tc = credit.token_advantages(store, rid, Credit("rloo"), None, old)
    assert tc.sequence == pytest.approx(sql_rollout(store, rid, None, Credit("rloo"))["advantage"], abs=TOL)


# ---------------------------------------------------------------------------- one click, each thing read once

def test_the_click_s_shared_reads_equal_separate_reads(cases):
    store, c = cases
    k = c["token_groups"][0]
    rids = store.df("SELECT rollout_id FROM rollouts WHERE group_id = ? ORDER BY 1", [k])["rollout_id"].tolist()
    for cr in SEQUENCE + TOKEN:
        for rid in rids[5:]:  # with a gap in the reference (7) and in the values (6)
            view = credit.rollout_view(store, rid, cr, None, Segmenter("delimiter", ";"))
            alone = credit.token_advantages(store, rid, cr, None)
            assert not differences(view.rollout, queries.rollout(store, rid, None, cr))
            assert (view.credit.values is None) == (alone.values is None) and view.credit.note == alone.note
            if alone.values is not None:
                assert np.array_equal(view.credit.values, alone.values) and view.credit.sequence == alone.sequence
                assert alone.values[0] == pytest.approx(view.rollout["advantage"], abs=1e-5)  # first token = header
            pd.testing.assert_frame_equal(view.tokens, queries.tokens(store, rid))
            pd.testing.assert_frame_equal(view.steps, credit.steps_of(store, rid, Segmenter("delimiter", ";")))
    assert credit.rollout_view(store, "nope", Credit()) is None


def test_token_reads_have_store_df_s_dtypes(cases):
    store, _ = cases
    sql = f"SELECT {queries.TOKEN_COLUMNS} FROM tokens WHERE rollout_id = ? ORDER BY pos"
    imported = store.df("SELECT rollout_id FROM rollouts WHERE run_id IN (SELECT run_id FROM runs WHERE kind = 'import')")
    # tokens written out of order (read without ORDER BY, put in order after)
    store.write({"tokens": pd.DataFrame({"rollout_id": "r~shuffled", "pos": [2, 0, 3, 1], "token_id": [5, 6, None, 8],
                                         "token_text": ["c", "a", None, "b"], "logprob": [-0.1, -0.2, None, -0.3]})})
    for rid in imported["rollout_id"].tolist() + [store.scalar("SELECT min(rollout_id) FROM rollouts"), "r~solo",
                                                  "r~shuffled"]:
        pd.testing.assert_frame_equal(queries.tokens(store, rid), store.df(sql, [rid]))
    for t, v in (("INTEGER", "1"), ("VARCHAR", "'x'"), ("FLOAT", "1.5"), ("INTEGER[]", "[1, 2]"), ("FLOAT[]", "[1.5]"),
                 ("BOOLEAN", "true"), ("DOUBLE", "2.5"), ("TIMESTAMP", "TIMESTAMP '2024-01-02 03:04:05'")):
        for q in (f"SELECT {v}::{t} AS a UNION ALL SELECT {v}::{t}", f"SELECT {v}::{t} AS a UNION ALL SELECT NULL",
                  f"SELECT NULL::{t} AS a UNION ALL SELECT NULL", f"SELECT {v}::{t} AS a WHERE false"):
            pd.testing.assert_frame_equal(_small_df(store, q, []), store.df(q), obj=q)


def test_a_group_s_tokens_read_at_once_equal_each_rollout_s(cases):
    """The group view reads its completions' tokens in one query (``tokens_of``) and cuts the rows per
    rollout: each part is that rollout's own read, imported rows (NULL ids and steps) and rows written
    out of order included; a rollout without tokens has no part."""
    store, c = cases
    store.write({"tokens": pd.DataFrame({"rollout_id": "r~unordered", "pos": [2, 0, 1], "token_id": [5, 6, None],
                                         "token_text": ["c", "a", None], "logprob": [-0.1, -0.2, None]})})
    imported = store.df("SELECT rollout_id FROM rollouts WHERE run_id IN (SELECT run_id FROM runs WHERE kind = 'import') "
                        "ORDER BY rollout_id LIMIT 6")["rollout_id"].tolist()
    group = store.df("SELECT rollout_id FROM rollouts WHERE group_id = ?", [c["token_groups"][0]])["rollout_id"].tolist()
    asked = group + imported + ["r~unordered", "r~no-such-rollout"]
    parts = queries.tokens_of(store, asked)
    with_tokens = [r for r in asked if len(queries.tokens(store, r))]
    assert sorted(parts) == sorted(with_tokens) and "r~no-such-rollout" not in parts and len(with_tokens) > len(group)
    for rid in with_tokens:  # the same values; a column with NULLs in another part reads as nullable (Int32)
        pd.testing.assert_frame_equal(parts[rid], queries.tokens(store, rid), obj=rid, check_dtype=False)
    assert queries.tokens_of(store, ["r~no-such-rollout"]) == {}


def test_whiten_is_reinforce_pp_s_second_stage():
    # a = (0.5, -0.5 | 0, 0): batch 0 has mean 0 and population std 0.5, batch 1 is all equal -> 0
    assert whiten(np.array([0.5, -0.5, 0.0, 0.0]), np.array([0, 0, 1, 1])) == pytest.approx([1.0, -1.0, 0.0, 0.0])
    r, g = np.array([1.0, 0.0, 2.0, 2.0, 0.5, 0.0]), np.array([0, 0, 1, 1, 2, 2])
    assert whiten(r - np.array([0.5, 0.5, 2.0, 2.0, 0.25, 0.25])).tolist() == reinforce_pp(r, g).tolist()


def test_the_strip_opens_an_imported_rollout_without_alternatives(cases):
    """Imported tokens have no top-k alternatives (NULL lists): the strip shows them without any."""
    from widgets.base.state import StudioState
    from widgets.token_strip import TokenStrip

    store, _ = cases
    rid = store.scalar("SELECT min(rollout_id) FROM rollouts WHERE run_id IN (SELECT run_id FROM runs WHERE kind = "
                       "'import') AND rollout_id IN (SELECT rollout_id FROM tokens WHERE topk_ids IS NULL)")
    state = StudioState(store=store)
    strip = TokenStrip(state=state)
    state.rollout_id = rid
    n = store.scalar("SELECT count(*) FROM tokens WHERE rollout_id = ?", [rid])
    assert f"{n} tokens" in strip._header.object and strip._strip.object.count('class="tok') == n
    assert "top-0 alternatives" in strip._strip.object


def test_a_click_drawn_ahead_on_a_thread_is_what_the_views_draw_in_place(seeded_store):
    """A served click draws the token strip and the group's cards on a preload thread, keyed by the
    state values they show; the event loop then sets that HTML. It must be exactly what the views
    draw in place for the same state, and a value changed meanwhile (the channel) is drawn afresh."""
    from widgets.base.state import StudioState
    from widgets.group_view import GroupView
    from widgets.token_strip import TokenStrip

    store = seeded_store
    rid, gid = store.df("SELECT rollout_id, group_id FROM rollouts ORDER BY rollout_id LIMIT 1").iloc[0]
    state = StudioState(store=store)
    strip, view = TokenStrip(state=state), GroupView(state=state)
    state.fork_pos = 3  # picked on another rollout: a new rollout shows none picked
    found: dict = {}
    for preload in state._preloaders:
        preload(rid, gid, found, False)
    ahead = found[strip._snapshot(rollout_id=rid, fork_pos=-1).key()]
    cards = found[("group_cards", view._group_key(gid), "entropy")]
    state.param.update(rollout_id=rid, group_id=gid)  # no served page: drawn in place, from no preload
    assert ahead == (strip._legend.object, strip._header.object, strip._strip.object)
    assert cards == view._grid.object and f'data-rollout="{rid}"' in ahead[2] and 'class="tok picked"' not in ahead[2]
    state._preloaded = found  # as StudioState._apply sets it, with the channel changed since the reads
    try:
        state.channel = "logprob"
    finally:
        state._preloaded = {}
    assert 'data-channel="logprob"' in strip._strip.object and strip._strip.object != ahead[2]
    assert 'data-channel="logprob"' in view._grid.object


def test_new_rows_reach_every_sidebar_picker_read_off_the_event_loop(seeded_store, monkeypatch):
    """After a Generate stores rows (``StudioState.stored``), the page's pickers and counts show them:
    the new run in the run picker, the store's rollout count, the new prompts to pick. What they show
    is read on the preload thread: the thread that then redraws them (in a served page, the event
    loop every page shares) reads nothing from the store."""
    import asyncio
    import threading

    import widgets.base.state as wstate
    from sample_data import POLICY_DIR
    from studio.face.app import create_app
    from studio.runs.generation import GenerateConfig, generate_sync
    from widgets.generate_panel import GeneratePanel
    from widgets.rollout_table import RolloutTable

    store = seeded_store
    made: list = []
    for cls in (wstate.StudioState, RolloutTable, GeneratePanel):
        init = cls.__init__
        monkeypatch.setattr(cls, "__init__", lambda self, _init=init, **p: (_init(self, **p), made.append(self))[0])
    page = create_app(store=store)
    state, table, generate = made
    before = store.counts()["rollouts"]
    result = generate_sync(store, POLICY_DIR, ["Q: 31+7-2="], GenerateConfig(group_size=3, max_new_tokens=8))
    assert result.rollouts == 3

    readers: list[str] = []
    read = store._read
    monkeypatch.setattr(store, "_read", lambda *a: (readers.append(threading.current_thread().name), read(*a))[1])
    # the page's event loop on a thread of its own (a Playwright test earlier in the session may hold
    # one running on this thread)
    loop = threading.Thread(target=asyncio.run, args=(state.stored(group_id=result.group_ids[0]),), name="event-loop")
    loop.start()
    loop.join(timeout=120)
    assert not loop.is_alive()

    assert readers and "event-loop" not in readers  # every read ran on the preload thread
    assert result.run_id in table._run_ids.values() and f"({result.rollouts})" in next(
        k for k, v in table._run_ids.items() if v == result.run_id)
    info = next(o for o in page.sidebar if "store-info" in (o.css_classes or []))
    assert f"{before + 3:,} rollouts" in info.object
    assert "Q: 31+7-2=" in generate.param.picked.objects
