"""launch.py as a user runs it: headless check, refusals with clear messages, panel serve."""
import hashlib
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from studio.face import serve
from tests.ui.harness import free_port

ROOT = Path(__file__).resolve().parents[1]


def run(*args, env=None, timeout=180):
    return subprocess.run([sys.executable, str(ROOT / "launch.py"), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_check_builds_the_app_on_a_fresh_store(tmp_path):
    db = tmp_path / "fresh" / "studio.duckdb"
    r = run("--db", str(db), "--check")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("ok: ") and " rollouts" in r.stdout, r.stdout + r.stderr
    assert db.exists() and not list(db.parent.glob(".*building*"))


def test_corrupt_store_is_refused_without_change(tmp_path):
    db = tmp_path / "bad.duckdb"
    db.write_bytes(os.urandom(8192))
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    r = run("--db", str(db), "--check")
    assert r.returncode == 2 and "not a readable DuckDB store" in r.stderr and "Traceback" not in r.stderr
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_missing_policy_is_refused(tmp_path):
    r = run("--db", str(tmp_path / "s.duckdb"), "--policy", str(tmp_path / "nowhere"), "--check")
    assert r.returncode == 2 and "--policy: policy folder" in r.stderr and "does not exist" in r.stderr


def test_non_loopback_address_needs_authentication(tmp_path):
    r = run("--db", str(tmp_path / "s.duckdb"), "--address", "0.0.0.0", "--check")
    assert r.returncode == 2 and "refusing to listen on 0.0.0.0 without authentication" in r.stderr
    assert "--basic-auth" in r.stderr
    assert not (tmp_path / "s.duckdb").exists()


def test_admins_need_authentication():
    r = run("--admins", "alice", "--check")
    assert r.returncode == 2 and "--admins needs authentication" in r.stderr
    assert serve.admin_set(" alice, bob ,") == {"alice", "bob"} and serve.admin_set(None) is None


def test_bad_port_is_an_argument_error():
    r = run("--port", "70000", "--check")
    assert r.returncode == 2 and "--port must be 1-65535" in r.stderr


@pytest.mark.parametrize("addr,loop", [("127.0.0.1", True), ("localhost", True), ("::1", True), ("127.0.0.2", True),
                                       ("0.0.0.0", False), ("192.168.1.4", False), ("example.org", False)])
def test_is_loopback(addr, loop):
    assert serve.is_loopback(addr) is loop


def test_websocket_origins():
    assert serve.websocket_origins("127.0.0.1", 5006) == ["127.0.0.1:5006", "localhost:5006"]
    assert "[::1]:8000" in serve.websocket_origins("::1", 8000)
    assert serve.websocket_origins("0.0.0.0", 5006) == ["*"]  # only reachable with auth


@pytest.mark.parametrize("argv,refused", [
    (["--address", "127.0.0.1"], False), (["--address=localhost"], False),
    ([], True),  # Bokeh listens on every interface without --address
    (["--address", "0.0.0.0"], True), (["--address", "0.0.0.0", "--basic-auth", "pw"], False),
    (["--oauth-provider=github"], False),
])
def test_panel_serve_exposure_rule(argv, refused):
    problem = serve.unauthenticated_exposure(["panel", "serve", "launch.py", *argv])
    assert (problem is not None) is refused
    if refused:
        assert "--address 127.0.0.1" in problem and "--basic-auth" in problem


def test_no_browser_without_a_display(monkeypatch):
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    assert serve.can_show() is False


def test_panel_serve_launch_py_works(tmp_path):
    port = free_port()
    env = dict(os.environ, ROLLOUT_STUDIO_DB=str(tmp_path / "ps.duckdb"))
    proc = subprocess.Popen([sys.executable, "-m", "panel", "serve", "launch.py", "--port", str(port),
                             "--address", "127.0.0.1", "--allow-websocket-origin", f"127.0.0.1:{port}"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        deadline, body = time.time() + 90, ""
        while time.time() < deadline:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/launch", timeout=30).read().decode()
                break
            except OSError:
                time.sleep(0.5)
        assert "Rollout Studio" in body and "refusing" not in body
        assert (tmp_path / "ps.duckdb").exists()  # the session built the app on the configured store
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(10)


@pytest.mark.parametrize("env, expected", [({}, False), ({"BOKEH_PERFORM_ERROR_DIAGNOSTICS": "true"}, True)])
def test_serving_turns_off_bokeh_s_costly_diagnostics_unless_asked(monkeypatch, env, expected):
    """A served studio skips Bokeh's close-match suggestions and callback signature checks (work on
    every update of a custom component); someone debugging keeps them with Bokeh's own variable."""
    from bokeh.models import Div
    from bokeh.settings import settings

    monkeypatch.delenv("BOKEH_PERFORM_ERROR_DIAGNOSTICS", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    try:
        serve.serving_diagnostics()
        assert settings.perform_error_diagnostics() is expected
        with pytest.raises(AttributeError, match="objekt") as err:
            Div().objekt  # noqa: B018 - still an error, with suggestions only when asked for
        assert ("possible attributes" in str(err.value)) is expected
    finally:
        settings.perform_error_diagnostics.unset_value()
