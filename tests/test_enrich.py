"""Enrich: rollouts imported without token statistics get them from teacher forcing on the real
sample policy, the same numbers the sampler recorded when it drew them."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sample_data import POLICY_DIR
from studio import queries
from studio.face.cli import enrich as enrich_cli
from studio.runs import enrich


@pytest.fixture()
def stripped(seeded_store):
    """Six sampled rollouts, stripped as imports arrive: three with no token rows, one with ids but
    no entropy / top-k, one with token texts only, one untouched."""
    ids = seeded_store.df("SELECT rollout_id FROM rollouts ORDER BY rollout_id LIMIT 6")["rollout_id"].tolist()
    sampled = {r: queries.tokens(seeded_store, r) for r in ids}
    with seeded_store.transaction() as cur:
        cur.execute("DELETE FROM token_rows WHERE list_contains(?, rollout_id)", [ids[:3]])
        cur.execute("UPDATE rollouts SET n_tokens = NULL WHERE list_contains(?, rollout_id)", [ids[:3]])
        cur.execute("UPDATE token_rows SET entropy = NULL, topk_ids = NULL, topk_logprobs = NULL WHERE rollout_id = ?",
                    [ids[3]])
        cur.execute("UPDATE token_rows SET token_id = NULL, logprob = NULL, entropy = NULL WHERE rollout_id = ?", [ids[4]])
    return seeded_store, ids, sampled


def test_what_each_rollout_lacks_is_found(stripped):
    store, ids, _ = stripped
    need = enrich.needs_enrich(store, rollout_ids=ids).set_index("rollout_id")["missing"].to_dict()
    assert need == {ids[0]: "tokens", ids[1]: "tokens", ids[2]: "tokens", ids[3]: "stats", ids[4]: "ids"}


def test_enriching_restores_the_samplers_statistics(stripped):
    store, ids, sampled = stripped
    seen = []
    report = enrich.enrich_sync(store, POLICY_DIR, rollout_ids=ids, batch=2, progress=lambda d, t: seen.append((d, t)))
    assert report.n_rollouts == 5 and not report.skipped and seen[-1] == (5, 5)
    for rid in ids[:5]:
        got, want = queries.tokens(store, rid), sampled[rid]
        assert got["token_text"].tolist() == want["token_text"].tolist()
        assert got["token_id"].tolist() == want["token_id"].tolist()
        # teacher forcing gives the numbers sampling recorded (same policy, same context)
        np.testing.assert_allclose(got["logprob"], want["logprob"], atol=2e-4)
        np.testing.assert_allclose(got["entropy"], want["entropy"], atol=2e-4)
        assert [list(x) for x in got["topk_ids"]] == [list(x) for x in want["topk_ids"]]
    rows = store.df("SELECT rollout_id, n_tokens, enriched_by FROM rollouts WHERE list_contains(?, rollout_id)",
                    [ids]).set_index("rollout_id")
    assert rows.loc[ids[0], "n_tokens"] == len(sampled[ids[0]])
    assert rows.loc[ids[0], "enriched_by"].startswith("policy@") and pd.isna(rows.loc[ids[5], "enriched_by"])
    # nothing is left to do: a second pass writes nothing
    again = enrich.enrich_sync(store, POLICY_DIR, rollout_ids=ids)
    assert again.n_rollouts == 0 and enrich.needs_enrich(store, rollout_ids=ids).empty


def test_a_sources_own_logprobs_are_kept(stripped):
    store, ids, _ = stripped
    with store.transaction() as cur:  # the source logged its behaviour policy's log-probs, not ours
        cur.execute("UPDATE token_rows SET logprob = -1.5 WHERE rollout_id = ?", [ids[3]])
    enrich.enrich_sync(store, POLICY_DIR, rollout_ids=[ids[3]])
    got = queries.tokens(store, ids[3])
    assert (got["logprob"] == -1.5).all() and got["entropy"].notna().all()


def test_token_texts_the_policy_would_split_differently_are_skipped_with_the_reason(stripped):
    store, ids, _ = stripped
    with store.transaction() as cur:
        cur.execute("UPDATE token_rows SET token_text = 'xx' WHERE rollout_id = ? AND pos = 0", [ids[4]])
    report = enrich.enrich_sync(store, POLICY_DIR, rollout_ids=[ids[4]])
    assert report.n_rollouts == 0 and report.skipped[0][0] == ids[4] and "splits" in report.skipped[0][1]
    assert queries.tokens(store, ids[4])["token_id"].isna().all()  # untouched


def test_a_missing_policy_folder_is_refused_before_anything_runs(stripped, tmp_path):
    from backends import PolicyLoadError

    store, ids, _ = stripped
    with pytest.raises(PolicyLoadError):
        enrich.enrich_sync(store, tmp_path / "nope", rollout_ids=ids)
    assert len(enrich.needs_enrich(store, rollout_ids=ids)) == 5


def test_the_cli_enriches_a_run(tmp_path, capsys):
    from sample_data import ROLLOUTS_DIR
    from studio.store import Store

    db = tmp_path / "s.duckdb"
    store = Store.open(db, seed_dir=ROLLOUTS_DIR)
    run, rid = store.df("SELECT run_id, rollout_id FROM rollouts ORDER BY rollout_id LIMIT 1").iloc[0]
    with store.transaction() as cur:
        cur.execute("DELETE FROM token_rows WHERE rollout_id = ?", [rid])
    store.close()
    assert enrich_cli.main(["--policy", "sample", "--run", run, "--db", str(db)]) == 0
    assert "enriched 1 rollouts" in capsys.readouterr().out
    assert enrich_cli.main(["--policy", str(tmp_path / "missing"), "--db", str(db)]) == 2


def test_the_cli_refuses_a_store_that_is_not_there(tmp_path, capsys):
    missing = tmp_path / "typo.duckdb"
    assert enrich_cli.main(["--policy", "sample", "--db", str(missing)]) == 2
    assert "no studio store" in capsys.readouterr().err and not missing.exists()


def test_a_rollout_longer_than_the_policys_context_is_skipped_with_the_reason(tmp_path):
    """The sample policy reads 96 positions: a longer import is reported, the others enriched."""
    import json

    from sample_data import POLICY_DIR
    from studio.ingest.importers import import_run
    from studio.runs.enrich import enrich_sync
    from studio.store import Store

    store = Store.open(tmp_path / "s.duckdb")
    try:
        lines = [{"input": "Q: 1+1=", "output": "1+1=2;A:2", "gts": "2", "score": 1.0, "step": 0},
                 {"input": "Q: 1+1=", "output": "1+1=2;" * 30 + "A:2", "gts": "2", "score": 1.0, "step": 0}]
        (tmp_path / "0.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        rep = import_run(store, tmp_path / "0.jsonl", "verl")
        long_id = store.scalar("SELECT rollout_id FROM rollouts WHERE length(text) > 100")
        report = enrich_sync(store, POLICY_DIR, run_id=rep.run_id)
        assert report.n_rollouts == 1
        assert [rid for rid, _ in report.skipped] == [long_id]
        assert "reads at most 96" in report.skipped[0][1]
        assert store.scalar("SELECT count(*) FROM tokens WHERE rollout_id = ?", [long_id]) == 0
    finally:
        store.close()


def test_a_rollout_without_token_rows_shows_its_text_not_a_crash(tmp_path, store_factory):
    """An import of text only: the token strip, its advantages and the static HTML export answer
    with the completion's text and say Enrich fills its tokens (they raised TypeError on n_tokens NULL)."""
    import json

    from studio.face.api import Studio
    from studio.ingest.importers import import_run
    from studio.queries import credit
    from studio.signals.advantages import Credit
    from widgets.base.state import StudioState
    from widgets.token_strip import TokenStrip

    (tmp_path / "run").mkdir()
    rows = [{"input": "Q: 1+1=", "output": "1+1=2;A:2", "gts": "2", "score": 1.0, "step": 0},
            {"input": "Q: 1+1=", "output": "1+1=3;A:3", "gts": "2", "score": 0.0, "step": 0}]
    (tmp_path / "run" / "0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    store = store_factory("s.duckdb")
    import_run(store, [tmp_path / "run"], "verl")
    rid = store.scalar("SELECT rollout_id FROM rollouts WHERE text = '1+1=2;A:2'")
    assert store.scalar("SELECT n_tokens FROM rollouts WHERE rollout_id = ?", [rid]) is None
    view = credit.rollout_view(store, rid, Credit())
    assert view.credit.values is None and "enrich" in view.credit.note
    state = StudioState(store=store)
    strip = TokenStrip(state=state)
    state.open_rollout(rid)
    shown = [p.object for p in vars(strip).values() if isinstance(getattr(p, "object", None), str)]
    assert any("1+1=2;A:2" in o and "imported as text" in o for o in shown)
    assert not any("None" in o for o in shown if "meta-line" in o)  # no "· None ·" for a missing finish reason
    page = Studio(store, None).save_html(tmp_path / "r.html", rollout=rid)
    assert "1+1=2;A:2" in page.read_text()
