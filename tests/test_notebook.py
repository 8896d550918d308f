"""The example notebook runs top to bottom (nbclient, a real kernel, no network) and its
views come out as Panel/Bokeh outputs with every resource inline."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "walkthrough.ipynb"
PANEL_MIME = "application/vnd.holoviews_exec.v0+json"
# what an output would fetch from the network: a script or a stylesheet linked, not inline.
# (The loader script names CDN URLs too, but only for classic Notebook's requirejs, which
# JupyterLab lacks; tests/ui/test_notebook.py checks in JupyterLab that nothing is fetched.)
FETCHES = re.compile(r"""<script[^>]+src=["']?(https?:)?//|<link[^>]+href=["']?(https?:)?//""")


@pytest.fixture(scope="module")
def executed(tmp_path_factory, ):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK, as_version=4)
    tmp = tmp_path_factory.mktemp("nb")
    mp = pytest.MonkeyPatch()
    mp.setenv("ROLLOUT_STUDIO_DB", str(tmp / "studio.duckdb"))  # the embedded default, in a temp dir
    mp.setenv("PYTHONPATH", str(ROOT))
    try:
        NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "examples")}}).execute()
    finally:
        mp.undo()
    return nb


def test_example_notebook_runs_without_errors(executed):
    code = [c for c in executed.cells if c.cell_type == "code"]
    assert code and all(c.execution_count for c in code)
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, [f"{e.ename}: {e.evalue}" for e in errors]


def test_views_are_panel_outputs_with_resources_inline(executed):
    code = [c for c in executed.cells if c.cell_type == "code"]
    views = [c for c in code if any(PANEL_MIME in o.get("data", {}) for o in c.outputs)]
    sources = "\n".join(c.source for c in views)
    for call in ("s.token_view(", "s.group_view(", "s.fork_view(", "s.explorer("):
        assert call in sources, f"{call} did not render as a Panel component"
    tokens = next(c for c in views if "s.token_view(" in c.source)
    html = "".join(o["data"].get("text/html", "") for o in tokens.outputs if "data" in o)
    assert "bk-root" in html or "data-root-id" in html  # a Bokeh document, not a repr
    loader = [o["data"]["application/javascript"] for c in code for o in c.outputs
              if "application/javascript" in o.get("data", {})]
    assert loader and max(map(len, loader)) > 1_000_000  # BokehJS, Panel and Tabulator inline, not linked
    for c in code:
        for o in c.outputs:
            hit = FETCHES.search(o.get("data", {}).get("text/html", ""))
            assert hit is None, f"cell {c.source[:40]!r} links a resource from the network: {hit.group(0)}"


def test_walkthrough_results(executed):
    out = {c.source.splitlines()[0]: c.outputs for c in executed.cells if c.cell_type == "code"}
    text = lambda o: "".join(x.get("text", "") or x.get("data", {}).get("text/plain", "") for x in o)
    assert "1,728 rollouts" in text(out["import studio"])  # the embedded default: the four sample worlds
    assert "('done', 8," in text(out['res = s.generate(["Q: 23+48-7=", "Q: 91-35+12="], group_size=4, seed=1)'])
    assert "wrote" in text(out["import tempfile, pathlib"]) and '"chosen"' in text(out["import tempfile, pathlib"])
