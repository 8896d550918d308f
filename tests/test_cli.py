"""``rollout-studio``: every subcommand end to end in a temp directory, as a script runs it,
with the exit codes the CLI documents (0 done, 1 did not succeed, 2 bad input)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sample_data import ROLLOUTS_DIR
from studio.store import Store

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "studio", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=_env(cwd))


def _env(cwd: Path) -> dict:
    import os

    # the embedded default store must never be the user's: point it into the temp dir
    return dict(os.environ, ROLLOUT_STUDIO_DB=str(cwd / "default.duckdb"), PYTHONPATH=str(ROOT))


@pytest.fixture()
def work(tmp_path):
    Store.open(tmp_path / "s.duckdb", seed_dir=ROLLOUTS_DIR).close()
    return tmp_path


def count(db: Path, sql: str) -> int:
    s = Store.open(db)
    try:
        return int(s.scalar(sql))
    finally:
        s.close()


def test_console_script_is_installed_and_helps():
    exe = shutil.which("rollout-studio")
    assert exe, "pip install -e . installs the rollout-studio command"
    out = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    for sub in ("serve", "generate", "score", "import", "export", "backend"):
        assert sub in out.stdout


@pytest.mark.parametrize("sub", ["serve", "generate", "score", "import", "export", "curate", "enrich", "minirun", "backend"])
def test_every_subcommand_has_help(sub, tmp_path):
    out = cli(sub, "--help", cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.startswith(f"usage: rollout-studio {sub}")
    assert {"curate": "build", "backend": "--policy"}.get(sub, "--db") in out.stdout


def test_usage_errors_exit_2(tmp_path):
    assert cli(cwd=tmp_path).returncode == 2
    bad = cli("frobnicate", cwd=tmp_path)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
    assert cli("generate", "--group-size", "many", cwd=tmp_path).returncode == 2


def test_generate_stores_a_run_and_refuses_bad_input(work):
    out = cli("generate", "--db", "s.duckdb", "--prompt", "Q: 2+3=", "--fresh", "1", "--group-size", "3",
              "--max-new-tokens", "24", cwd=work)
    assert out.returncode == 0, out.stderr
    run_id = out.stdout.strip().splitlines()[-1].split(":")[0]
    assert "done, 6 rollouts stored" in out.stdout
    assert count(work / "s.duckdb", f"SELECT count(*) FROM rollouts WHERE run_id = '{run_id}'") == 6

    runs = count(work / "s.duckdb", "SELECT count(*) FROM runs")
    bad = cli("generate", "--db", "s.duckdb", "--prompt", "hello there", cwd=work)
    assert bad.returncode == 2 and "cannot read 'hello there'" in bad.stderr
    settings = cli("generate", "--db", "s.duckdb", "--prompt", "Q: 1+1=", "--temperature", "9", cwd=work)
    assert settings.returncode == 2 and "temperature must be" in settings.stderr
    missing = cli("generate", "--db", "nope.duckdb", "--prompt", "Q: 1+1=", cwd=work)
    assert missing.returncode == 2 and "no studio store at nope.duckdb" in missing.stderr
    assert not (work / "nope.duckdb").exists()
    no_policy = cli("generate", "--db", "s.duckdb", "--prompt", "Q: 1+1=", "--policy", str(work / "none"), cwd=work)
    assert no_policy.returncode == 2 and "does not exist" in no_policy.stderr
    assert count(work / "s.duckdb", "SELECT count(*) FROM runs") == runs  # nothing written by refusals


def test_score_with_a_rule_file(work):
    (work / "short.py").write_text("def reward(prompt, completion, gold, steps, **ctx):\n"
                                   "    return {'total': float(len(completion) < 20)}\n")
    out = cli("score", "--db", "s.duckdb", "--rule", "short.py", cwd=work)
    assert out.returncode == 0, out.stderr
    vid = out.stdout.split(":")[0]
    assert "512 scored, 0 failed" in out.stdout
    assert count(work / "s.duckdb", f"SELECT count(*) FROM rewards WHERE rule_version_id = '{vid}' "
                                    "AND component = 'total'") == 512
    (work / "boom.py").write_text("def reward(prompt, completion, gold, steps, **ctx):\n    return 1 / 0\n")
    failed = cli("score", "--db", "s.duckdb", "--rule", "boom.py", cwd=work)
    assert failed.returncode == 1 and "ZeroDivisionError" in failed.stdout
    syntax = cli("score", "--db", "s.duckdb", "--rule", "nope.py", cwd=work)
    assert syntax.returncode == 2 and "does not exist" in syntax.stderr
    both = cli("score", "--db", "s.duckdb", "--rule", "short.py", "--reward-model", "x", cwd=work)
    assert both.returncode == 2 and "not allowed with" in both.stderr


def test_import_then_export_pairs_and_html(work):
    lines = [{"input": "Q: 1+1=", "output": "1+1=2;A:2", "gts": "2", "score": 1.0, "step": 0},
             {"input": "Q: 1+1=", "output": "1+1=3;A:3", "gts": "2", "score": 0.0, "step": 0}]
    (work / "0.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + "{not json\n")
    refused = cli("import", "--db", "s.duckdb", "0.jsonl", "--format", "verl", cwd=work)
    assert refused.returncode == 2 and "0.jsonl:3" in refused.stderr  # bad input: said on stderr
    assert count(work / "s.duckdb", "SELECT count(*) FROM rollouts") == 512  # an aborted import leaves nothing
    out = cli("import", "--db", "s.duckdb", "0.jsonl", "--format", "verl", "--skip-bad", cwd=work)
    assert out.returncode == 0, out.stdout + out.stderr
    assert count(work / "s.duckdb", "SELECT count(*) FROM rollouts") == 514

    nothing = cli("export", "--db", "s.duckdb", "--out", "pairs.jsonl", cwd=work)
    assert nothing.returncode == 1 and "nothing to export" in nothing.stderr
    assert cli("curate", "build", "--db", "s.duckdb", cwd=work).returncode == 0
    build = cli("curate", "status", "--db", "s.duckdb", cwd=work).stdout.splitlines()[1].split()[0]
    assert cli("curate", "accept", "--db", "s.duckdb", "--build", build, cwd=work).returncode == 0
    ok = cli("export", "--db", "s.duckdb", "--out", "pairs.jsonl", cwd=work)
    assert ok.returncode == 0, ok.stderr
    rows = [json.loads(x) for x in (work / "pairs.jsonl").read_text().splitlines()]
    assert rows and set(rows[0]) == {"prompt", "chosen", "rejected"}

    rid = Store.open(work / "s.duckdb")
    try:
        rollout = rid.scalar("SELECT rollout_id FROM rollouts WHERE parent_rollout_id IS NULL ORDER BY rollout_id LIMIT 1")
        n_tok = int(rid.scalar("SELECT count(*) FROM tokens WHERE rollout_id = ?", [rollout]))
    finally:
        rid.close()
    html = cli("export", "--db", "s.duckdb", "--out", "one.html", "--rollout", rollout, "--channel", "logprob", cwd=work)
    assert html.returncode == 0 and (work / "one.html").read_text().count('class="card"') == n_tok
    unknown = cli("export", "--db", "s.duckdb", "--out", "x.html", "--rollout", "r-nope", cwd=work)
    assert unknown.returncode == 2 and "no rollout 'r-nope'" in unknown.stderr and not (work / "x.html").exists()


def test_serve_refuses_an_exposed_address_without_auth(tmp_path):
    out = cli("serve", "--address", "0.0.0.0", "--no-show", cwd=tmp_path)
    assert out.returncode == 2 and "without authentication" in out.stderr


def test_serve_check_builds_the_page_on_the_embedded_default(tmp_path):
    out = cli("serve", "--check", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok:") and "1728 rollouts" in out.stdout  # the four sample worlds
    assert (tmp_path / "default.duckdb").exists()


def test_one_error_to_exit_code_map():
    """Every user-facing error is a StudioError carrying its exit code; the CLI maps by it alone."""
    from backends.types import PolicyLoadError
    from studio.curation import NothingToExport, StalePairsError
    from studio.errors import StudioError
    from studio.face.cli.common import command, exit_code
    from studio.rewards.sandbox import RuleSourceError
    from studio.store import QueryTimeout, StoreError
    from studio.tasks import TaskParseError, UnknownTaskError

    for bad_input in (StoreError("x"), TaskParseError("x"), UnknownTaskError("x"), RuleSourceError("x"),
                      PolicyLoadError("x"), FileNotFoundError("x")):
        assert exit_code(bad_input) == 2, type(bad_input)
    for not_done in (NothingToExport("x"), StalePairsError("x", stale=None), QueryTimeout("x")):
        assert isinstance(not_done, StudioError) and exit_code(not_done) == 1, type(not_done)
    assert exit_code(KeyboardInterrupt()) == 130

    @command
    def main(argv, prog):
        raise StoreError("there is no studio store at /nowhere")

    assert main([], "x") == 2
