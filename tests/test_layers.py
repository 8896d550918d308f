"""The layers of the code, read from every import statement (lazy ones too) with ``ast``.

The picture (docs/architecture.md draws it): ``backends/`` knows nothing of the studio or the
UI; ``studio/``'s subpackages stack in the order of :data:`LAYERS`, each importing only the
ones below it; ``studio/face/`` is the one place in ``studio/`` that imports ``widgets`` or a
UI library; ``widgets/`` draws what the core reads and never runs a model, writes SQL or
imports the face. ``studio/errors.py`` (``StudioError``) and ``studio/configs.py`` (config fields) are below
every layer. ``studio/``'s
top-level modules and any ``__main__.py`` are entry points (``studio.open``, the
documented ``python -m studio.X`` commands, the ``studio.rewardlib`` name stored rules import):
they may import any layer, and nothing in a subpackage imports them.

There is no allowlist: a new edge that breaks a rule fails here, named by file and module.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UI = {"widgets", "panel", "holoviews", "bokeh", "param", "pyviz_comms"}
# studio's subpackages, bottom to top: a subpackage may import those on a lower layer only.
LAYERS = [
    ("tasks",),
    ("store", "signals"),
    ("queries",),
    ("workers",),
    ("rewards",),
    ("runs", "ingest", "curation"),
    ("face",),
]
LEVEL = {pkg: i for i, row in enumerate(LAYERS) for pkg in row}
DYNAMIC = {("importlib", "import_module"), ("runpy", "run_module")}


def imports(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, absolute module) for every import in a file: top-level, lazy, relative or by name
    (``importlib.import_module`` / ``runpy.run_module`` with a literal name)."""
    package = list(path.relative_to(root).parts[:-1])
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module or ""
            else:
                up = package[: len(package) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            out.append((node.lineno, base))
            # `from pkg import module` imports the submodule too
            out += [(node.lineno, f"{base}.{a.name}") for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and isinstance(node.func.value, ast.Name) and (node.func.value.id, node.func.attr) in DYNAMIC \
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            out.append((node.lineno, node.args[0].value))
    return out


def modules(top: str, root: Path = ROOT):
    for path in sorted((root / top).rglob("*.py")):
        yield path.relative_to(root), imports(path, root)


def exists(module: str, root: Path = ROOT) -> bool:
    """Whether a dotted name is a module or package of this repository (not a name inside one)."""
    p = root.joinpath(*module.split("."))
    return p.with_suffix(".py").exists() or (p / "__init__.py").exists()


def subpackage(rel: Path) -> str | None:
    return rel.parts[1] if rel.parts[0] == "studio" and len(rel.parts) > 2 else None


def edges(root: Path = ROOT):
    """Every import edge of the three packages: (file, line, module)."""
    for top in ("studio", "backends", "widgets"):
        for rel, mods in modules(top, root):
            for line, mod in mods:
                yield rel, line, mod


def forbidden(root: Path = ROOT) -> list[str]:
    bad = []
    for rel, line, mod in edges(root):
        top, parts = rel.parts[0], mod.split(".")
        where = f"{rel}:{line} imports {mod}"
        if top == "backends" and parts[0] in ("studio", "widgets", "launch"):
            bad.append(f"{where}: backends/ knows nothing of the studio or the UI")
        if top == "widgets" and parts[0] in ("backends", "launch"):
            bad.append(f"{where}: widgets/ never runs a model (ask the core)")
        if top == "widgets" and parts[:2] == ["studio", "face"]:
            bad.append(f"{where}: widgets/ does not import the face that composes it")
        if top == "studio":
            pkg = subpackage(rel)
            if parts[0] == "launch":
                bad.append(f"{where}: launch.py is an entry point; nothing imports it")
            if parts[0] in UI and pkg != "face":
                bad.append(f"{where}: only studio/face/ imports the UI")
            if parts[:2] in (["studio", "errors"], ["studio", "configs"]):
                continue  # bases of every layer (StudioError; config fields): they import nothing of the studio
            if pkg is None or rel.name == "__main__.py":
                continue  # an entry point: any layer
            if parts[0] == "studio" and len(parts) > 1:
                other = parts[1]
                if other not in LEVEL:
                    if exists(mod, root):
                        bad.append(f"{where}: studio/{pkg}/ imports a top-level entry point")
                elif other != pkg and LEVEL[other] >= LEVEL[pkg]:
                    bad.append(f"{where}: {pkg} (layer {LEVEL[pkg]}) imports {other} (layer {LEVEL[other]})")
    return bad


def test_every_subpackage_has_a_layer():
    found = {d.name for d in (ROOT / "studio").iterdir() if (d / "__init__.py").exists()}
    assert found == set(LEVEL), f"subpackages without a layer or layers without a package: {found ^ set(LEVEL)}"


def test_no_forbidden_import():
    bad = forbidden()
    assert not bad, "imports that break the layers:\n" + "\n".join(bad)


def test_the_check_sees_lazy_relative_and_dynamic_imports(tmp_path):
    """The reader itself: a lazy import inside a function, a relative import and an import by name
    are all edges (a check that missed them would pass on anything)."""
    src = ("import os\n"
           "def f():\n    from ..face import app\n    from . import db\n"
           "def g():\n    import importlib\n    importlib.import_module('widgets.style')\n")
    for d in ("studio/store", "studio/face", "backends", "widgets"):
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "__init__.py").write_text("")
    path = tmp_path / "studio" / "store" / "probe.py"
    path.write_text(src)
    (tmp_path / "backends" / "runner.py").write_text("from studio.store import db\n")
    got = {m for _, m in imports(path, tmp_path)}
    assert {"studio.face", "studio.face.app", "studio.store", "studio.store.db", "widgets.style"} <= got
    bad = forbidden(tmp_path)
    assert any("probe.py:3 imports studio.face:" in b for b in bad)
    assert any("probe.py:7 imports widgets.style" in b for b in bad)
    assert any("runner.py:1 imports studio.store" in b for b in bad)
    assert not any("probe.py:4" in b for b in bad)  # its own subpackage


def test_subpackages_form_no_cycle():
    graph: dict[str, set[str]] = {pkg: set() for pkg in LEVEL}
    for rel, _, mod in edges():
        pkg, parts = subpackage(rel), mod.split(".")
        if pkg and rel.name != "__main__.py" and parts[0] == "studio" and len(parts) > 1 and parts[1] in graph \
                and parts[1] != pkg:
            graph[pkg].add(parts[1])
    order: list[str] = []
    state: dict[str, int] = {}

    def visit(node, path):
        if state.get(node) == 1:
            pytest.fail("import cycle between subpackages: " + " -> ".join(path + [node]))
        if state.get(node) == 2:
            return
        state[node] = 1
        for nxt in sorted(graph[node]):
            visit(nxt, path + [node])
        state[node] = 2
        order.append(node)

    for node in sorted(graph):
        visit(node, [])
    assert len(order) == len(graph)


SQL = re.compile(r"\bSELECT\b[\s\S]+\bFROM\b|\bINSERT INTO\b|\bUPDATE \w+ SET\b|\bDELETE FROM\b")


def test_widgets_write_no_sql():
    """Widgets call named functions of the core; a SQL string in a widget is a query that
    belongs in studio/queries/ (where it can be tested and timed)."""
    bad = []
    for path in sorted((ROOT / "widgets").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and SQL.search(node.value):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.strip()[:60]!r}")
    assert not bad, "SQL in widgets/:\n" + "\n".join(bad)


BASES = {"errors.py", "configs.py"}


def test_bases_import_nothing_of_the_studio():
    for name in BASES:
        mods = [m for _, m in imports(ROOT / "studio" / name) if m.split(".")[0] in ("studio", "widgets", "backends")]
        assert not mods, f"studio/{name} is below every layer but imports {mods}"


def test_entry_points_are_thin():
    """studio/'s top-level modules only name what they stand for (a documented command, the
    rule library's stored name, ``studio.open``): no logic lives outside a subpackage."""
    for path in sorted((ROOT / "studio").glob("*.py")):
        if path.name in BASES:
            continue
        n = len(path.read_text().splitlines())
        assert n <= 40, f"{path.relative_to(ROOT)} has {n} lines: move its logic into a subpackage"
