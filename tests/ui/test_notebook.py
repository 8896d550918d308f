"""A studio component in a real JupyterLab (served on 127.0.0.1) in Chromium: it renders,
reacts to a click through the kernel, and nothing is fetched from outside loopback."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from .harness import free_port, stop_server

pytestmark = pytest.mark.ui
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    import nbformat

    root = tmp_path_factory.mktemp("lab")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import studio\ns = studio.open()\n"
                                          "rid = s.rollouts(correct=False, limit=1).rollout_id[0]"),
                nbformat.v4.new_code_cell("s.token_view(rid)")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, root / "view.ipynb")
    port = free_port()
    env = dict(os.environ, ROLLOUT_STUDIO_DB=str(root / "studio.duckdb"), PYTHONPATH=str(ROOT),
               JUPYTER_CONFIG_DIR=str(root / ".config"), JUPYTER_RUNTIME_DIR=str(root / ".runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(root / ".settings"), JUPYTERLAB_WORKSPACES_DIR=str(root / ".workspaces"))
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
           "--IdentityProvider.token=", "--ServerApp.password=", "--ServerApp.disable_check_xsrf=True", f"--ServerApp.root_dir={root}", "--allow-root",
           "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    log = root / "lab.log"
    proc = subprocess.Popen(cmd, env=env, cwd=root, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.time() + 120
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=10)
            break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                stop_server(proc)
                pytest.fail(f"JupyterLab did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
    # start the notebook's kernel now: JupyterLab then opens it attached, without asking which kernel
    body = json.dumps({"path": "view.ipynb", "name": "view.ipynb", "type": "notebook", "kernel": {"name": "python3"}})
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/sessions", data=body.encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=60)
    yield f"http://127.0.0.1:{port}"
    stop_server(proc)


def test_token_view_renders_and_reacts_in_jupyterlab(browser, lab, tmp_path):
    lab_shot = tmp_path / "jupyterlab.png"
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = ctx.new_page()
    outside, errors = [], []

    def route(r):  # the machine is offline in spirit: anything not loopback is refused and recorded
        url = r.request.url
        host = url.split("/")[2].rsplit(":", 1)[0] if "://" in url else ""
        if url.startswith(("data:", "blob:")) or host in ("127.0.0.1", "localhost", "[::1]"):
            r.continue_()
        else:
            outside.append(url)
            r.abort()

    pg.route("**/*", route)
    pg.on("pageerror", lambda e: errors.append(str(e)))
    try:
        pg.goto(f"{lab}/lab/tree/view.ipynb")
        pg.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
        strip = pg.locator(".strip").first  # inside Bokeh's shadow roots: Playwright pierces them
        pick = pg.locator(".jp-Dialog button.jp-mod-accept")
        deadline, ran_at = time.time() + 240, 0.0
        while not strip.is_visible():  # JupyterLab may ask which kernel, early or late: answer, then run all
            if time.time() > deadline:
                pg.screenshot(path=str(lab_shot))
                pytest.fail(f"the token view did not render in JupyterLab (screenshot: {lab_shot})")
            idle = pg.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").count() > 0
            untouched = pg.locator(".jp-InputPrompt", has_text="[ ]:").count() == 2  # no cell has run yet
            if pick.is_visible():
                pick.click()
            elif idle and untouched and time.time() - ran_at > 15:  # a run swallowed by a late dialog: again
                pg.get_by_role("menuitem", name="Run").click()
                pg.get_by_role("menuitem", name="Run All Cells", exact=True).click()
                ran_at = time.time()
            elif idle and time.time() - ran_at > 30:  # a late dialog swallowed the first cell, not the next:
                pg.get_by_role("menuitem", name="Kernel").click()  # run everything afresh (its dialog: above)
                pg.get_by_role("menuitem", name=re.compile("^Restart Kernel and Run All Cells")).click()
                ran_at = time.time()
            pg.wait_for_timeout(500)
        assert strip.get_attribute("data-channel") == "entropy"
        assert pg.locator(".tok").count() >= 5
        pg.locator(".tok").nth(2).hover()
        assert pg.locator(".tok:hover .card").first.is_visible()  # the hover card

        pg.get_by_role("button", name="logprob", exact=True).click()  # through the kernel and back
        pg.wait_for_selector(".strip[data-channel='logprob']", timeout=60_000)
        assert pg.locator(".lg-name", has_text="log-prob").count() >= 1  # the legend followed
        assert not outside, f"fetched from outside loopback: {outside}"
        assert not errors, errors
    finally:
        ctx.close()
