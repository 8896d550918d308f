"""The Python API (``studio.open``): the same queries and actions as the UI, on the real
sample policy and stores seeded with the sample rollouts."""
from __future__ import annotations

import json

import pandas as pd
import pytest

import studio
from sample_data import ROLLOUTS_DIR, WORDPROBLEMS_TASK
from studio import queries
from studio.face.api import StudioAPIError
from studio.store import Store, StoreError


@pytest.fixture()
def s(tmp_path):
    Store.open(tmp_path / "runs.duckdb", seed_dir=ROLLOUTS_DIR).close()
    with studio.open(tmp_path / "runs.duckdb") as st:
        yield st


def test_open_refuses_a_missing_store_unless_asked_to_create(tmp_path):
    with pytest.raises(StoreError, match="create=True"):
        studio.open(tmp_path / "typo.duckdb")
    assert not (tmp_path / "typo.duckdb").exists()  # nothing made at a mistyped path
    with studio.open(tmp_path / "new.duckdb", create=True) as st:
        assert st.rollouts().empty and st.runs().empty


def test_open_without_a_path_is_the_embedded_default(tmp_path, monkeypatch):
    monkeypatch.setenv("ROLLOUT_STUDIO_DB", str(tmp_path / "default.duckdb"))
    with studio.open() as st:
        assert st.store.path == str(tmp_path / "default.duckdb")
        assert st.store.counts()["rollouts"] == 512 + 384 + 320 + 512  # seeded with the four sample worlds
        assert "1,728 rollouts" in repr(st)
        assert WORDPROBLEMS_TASK in set(st.tasks()["name"])  # the realistic world's prompt set, known to the process


def test_rollouts_filters_match_the_tables_query(s):
    run = s.runs().run_id.iloc[0]
    wrong = s.rollouts(run=run, correct=False, reward=(0.2, None), limit=50)
    same = queries.rollout_table(s.store, queries.RolloutFilter(run_id=run, correct=False, reward_min=0.2, limit=50))
    assert list(wrong.rollout_id) == list(same.rollout_id)
    assert len(wrong) and not wrong.correct.any() and (wrong.reward >= 0.2).all()
    page2 = s.rollouts(run=run, correct=False, reward=(0.2, None), limit=50, offset=50)
    assert not set(page2.rollout_id) & set(wrong.rollout_id)
    has = s.rollouts(prompt="20+97")
    assert len(has) and has.prompt.str.contains("20+97", regex=False).all()


def test_rollout_tokens_group_and_sql(s):
    rid = s.rollouts(limit=1).rollout_id.iloc[0]
    ro = s.rollout(rid)
    toks = s.tokens(rid)
    assert len(toks) == ro["n_tokens"] and {"logprob", "entropy", "topk_ids"} <= set(toks.columns)
    g = s.group(ro["group_id"])
    assert rid in set(g.rollout_id) and len(g) == 8
    # a prompt id stands for its newest group
    assert set(s.group(s.store.scalar("SELECT prompt_id FROM rollouts WHERE rollout_id = ?", [rid])).rollout_id) \
        == set(g.rollout_id)
    assert int(s.sql("SELECT count(*) AS n FROM rollouts").n[0]) == 512
    with pytest.raises(ValueError, match="SELECT"):
        s.sql("DELETE FROM rollouts")
    assert s.store.counts()["rollouts"] == 512
    with pytest.raises(StudioAPIError, match="no rollout"):
        s.tokens("r-nope")


def test_bad_arguments_say_what_is_wrong(s):
    with pytest.raises(StudioAPIError, match="estimator"):
        s.rollouts(estimator="ppo-ish")
    with pytest.raises(StudioAPIError, match="limit"):
        s.rollouts(limit=0)
    with pytest.raises(StudioAPIError, match="channel"):
        s.token_view(s.rollouts(limit=1).rollout_id.iloc[0], channel="rainbow")
    with pytest.raises(StudioAPIError, match="neither a group id nor a prompt id"):
        s.group_view("g-nope")
    with pytest.raises(StudioAPIError, match="exactly one"):
        s.save_html("x.html")
    with pytest.raises(StudioAPIError, match="rule"):
        s.score()


def test_generate_scores_and_stores_like_the_panel(s):
    before = s.store.counts()["rollouts"]
    res = s.generate(["Q: 23+48-7=", "12+5"], group_size=3, max_new_tokens=24, seed=3)
    assert res.status == "done" and res.rollouts == 6
    new = s.rollouts(run=res.run_id)
    assert len(new) == 6 and new.reward.notna().all()
    assert s.store.counts()["rollouts"] == before + 6
    again = s.generate(["Q: 23+48-7=", "12+5"], group_size=3, max_new_tokens=24, seed=3)
    assert list(s.rollouts(run=again.run_id).sort_values(["prompt", "sample_idx"]).completion) == \
        list(new.sort_values(["prompt", "sample_idx"]).completion)  # same seed, same rollouts


def test_generate_refuses_bad_prompts_and_writes_nothing(s):
    from studio.tasks import TaskParseError

    runs = len(s.runs())
    with pytest.raises(TaskParseError, match="prompt 1"):
        s.generate(["hello there"])
    assert len(s.runs()) == runs


def test_score_with_a_rule_rescores_every_rollout(s):
    rule = ("def reward(prompt, completion, gold, steps, **ctx):\n"
            "    return {'short': float(len(completion) < 20), 'total': float(len(completion) < 20)}\n")
    res = s.score(rule, name="short", note="prefers short completions")
    assert res.status == "done" and res.scored == 512 and not res.failed
    df = s.rollouts(rule_version=res.rule_version_id, limit=600)
    assert len(df) == 512
    assert ((df.completion.str.len() < 20).astype(float) == df.reward).all()


def test_score_reports_a_rule_that_raises_per_rollout(s):
    res = s.score("def reward(prompt, completion, gold, steps, **ctx):\n    return 1 / 0\n", name="broken")
    assert res.failed == 512 and "ZeroDivisionError" in res.errors[0][1]


def test_build_accept_export_is_what_trl_reads(s, tmp_path):
    built = s.build_pairs(name="best_vs_worst", min_margin=0.5)
    assert built.pairs > 0
    assert s.accept(build=built.build_id) == built.pairs
    out = s.export(tmp_path / "pairs.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "pairs.jsonl").read_text().splitlines()]
    assert len(rows) == built.pairs and set(rows[0]) == {"prompt", "chosen", "rejected"}
    from datasets import load_dataset

    ds = load_dataset("json", data_files=str(tmp_path / "pairs.jsonl"))["train"]
    assert ds.num_rows == built.pairs and out.provenance_path.exists()
    with pytest.raises(StudioAPIError, match="PairRule has"):
        s.build_pairs(nme="typo")


def test_import_then_rollouts(s, tmp_path):
    lines = [{"input": "Q: 1+1=", "output": "1+1=2;A:2", "gts": "2", "score": 1.0, "step": 0},
             {"input": "Q: 1+1=", "output": "1+1=3;A:3", "gts": "2", "score": 0.0, "step": 0}]
    (tmp_path / "0.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    rep = s.import_run(tmp_path / "0.jsonl", "verl", name="verl run")
    assert rep.n_rollouts == 2
    df = s.rollouts(run=rep.run_id)
    assert sorted(df.completion) == ["1+1=2;A:2", "1+1=3;A:3"] and sorted(df.reward) == [0.0, 1.0]


def test_views_share_the_session_state_like_one_page(s):
    rid_a, rid_b = s.rollouts(limit=2).rollout_id
    follows = s.token_view()  # no id: follows the studio's shared selection
    fixed = s.token_view(rid_a, channel="logprob")  # its own state, fixed on rid_a
    table = s.table()
    strip_of = lambda view: view.objects[1].objects[2].object  # picker, then the strip's header, legend, strip
    assert "Select a rollout" in view_text(follows)
    tab = next(o for o in table.select(lambda o: type(o).__name__ == "Tabulator"))
    row = int(tab.value.index[tab.value.rollout_id == rid_b][0])
    tab.selection = [row]  # a click on the row
    assert s.state.rollout_id == rid_b
    assert 'data-pos="0"' in strip_of(follows) and s.tokens(rid_b).token_text[0] in strip_of(follows)
    assert 'data-channel="logprob"' in strip_of(fixed) and s.tokens(rid_a).token_text[0] in strip_of(fixed)
    picker = fixed.objects[0]
    picker.value = "entropy"  # a click on the channel picker recolours
    assert 'data-channel="entropy"' in strip_of(fixed)
    assert s.state.rollout_id == rid_b  # the fixed view did not move the shared selection


def view_text(view) -> str:
    import panel as pn

    return " ".join(o.object for o in pn.panel(view).select(lambda o: isinstance(getattr(o, "object", None), str)))


def test_group_fork_and_app_components_build(s):
    ro = s.rollout(s.rollouts(limit=1).rollout_id.iloc[0])
    g = s.group_view(ro["group_id"])
    assert ro["prompt"] in view_text(g)
    f = s.fork_view(ro["rollout_id"])
    assert "tree" in view_text(f)
    app = s.app()
    assert app.title == "Rollout Studio"


def test_save_html_is_one_self_contained_file(s, tmp_path):
    rid = s.rollouts(limit=1).rollout_id.iloc[0]
    page = s.save_html(tmp_path / "one", rollout=rid, channel="logprob")
    assert page.suffix == ".html"
    html = page.read_text()
    toks = s.tokens(rid)
    assert html.count('class="tok') == len(toks) and html.count('class="card"') == len(toks)
    assert "http://" not in html.replace("http://www.w3.org", "") and "https://" not in html  # nothing fetched
    assert "<script" not in html  # hover cards are CSS; the file runs nothing
    grp = s.save_html(tmp_path / "g.html", group=s.rollout(rid)["group_id"])
    assert grp.read_text().count('class="card"') == int(s.group(s.rollout(rid)["group_id"]).n_tokens.sum())


def test_rollouts_dataframe_types(s):
    df = s.rollouts(limit=5)
    assert isinstance(df, pd.DataFrame)
    assert {"rollout_id", "prompt", "completion", "reward", "advantage", "correct", "n_tokens", "run"} <= set(df.columns)


def test_every_tab_is_a_component(s):
    import panel as pn

    from studio.face.tabs import VIEWS

    rid = s.rollouts(limit=1).rollout_id.iloc[0]
    s.state.open_rollout(rid)
    for name in VIEWS:
        view = s.view(name)
        assert pn.panel(view).select(lambda o: True), name  # builds and lays out on the shared state
    assert "rollouts" in view_text(s.view("SQL"))  # the console lists the store's tables
    with pytest.raises(StudioAPIError, match="no view 'tabs'"):
        s.view("tabs")
