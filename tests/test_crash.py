"""Crash safety: SIGKILL the owner mid-Generate, reopen, and find only whole chunks (a store file
and a shared store)."""
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from sample_data import ROLLOUTS_DIR
from studio import queries
from studio.store import Store, lake

ROOT = Path(__file__).resolve().parents[1]
GROUP = 4

WRITER = textwrap.dedent(f"""
    import sys
    from sample_data import POLICY_DIR, ROLLOUTS_DIR
    from studio.runs.generation import GenerateConfig, generate_sync
    from studio.store import Store, lake

    if __name__ == "__main__":
        store = Store.open(sys.argv[1], seed_dir=ROLLOUTS_DIR)
        prompts = [f"Q: {{a}}+{{a + 7}}-3=" for a in range(10, 40)]
        generate_sync(store, POLICY_DIR, prompts, GenerateConfig(group_size={GROUP}), chunk_prompts=1,
                      on_progress=lambda done, total, msg: print("stored", done, flush=True))
""")


@pytest.mark.parametrize("kind", ["file", "shared"])
def test_sigkill_during_generate_leaves_only_whole_chunks(tmp_path, kind):
    db = tmp_path / "crash.duckdb" if kind == "file" else lake.create_shared(tmp_path / "crash-shared")
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    proc = subprocess.Popen([sys.executable, str(script), str(db)], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), start_new_session=True)
    try:
        for _ in range(3):  # three chunks committed, the fourth is on its way
            line = proc.stdout.readline()
            assert line.startswith("stored"), line
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # owner and its sampling worker, mid-run
        proc.wait()

    store = Store.open(db)  # replays DuckDB's write-ahead log
    try:
        shipped = len(pd.read_parquet(ROLLOUTS_DIR / "rollouts.parquet"))
        added = queries.rollout_count(store) - shipped
        assert added >= 3 * GROUP and added % GROUP == 0  # committed chunks survive, whole
        # nothing half-written: every rollout has its tokens and its rewards, and no orphans
        orphans = store.scalar("""
            SELECT (SELECT count(*) FROM rollouts r WHERE NOT EXISTS (SELECT 1 FROM tokens t WHERE t.rollout_id = r.rollout_id))
                 + (SELECT count(*) FROM rollouts r WHERE NOT EXISTS (SELECT 1 FROM rewards w WHERE w.rollout_id = r.rollout_id))
                 + (SELECT count(*) FROM tokens t WHERE NOT EXISTS (SELECT 1 FROM rollouts r WHERE r.rollout_id = t.rollout_id))""")
        assert orphans == 0
        n_tok = store.scalar("SELECT count(*) FROM tokens")
        assert n_tok == store.scalar("SELECT sum(n_tokens) FROM rollouts")
        statuses = dict(store.cursor().execute("SELECT kind, status FROM runs").fetchall())
        assert statuses == {"sample": "done", "generate": "interrupted"}
    finally:
        store.close()
