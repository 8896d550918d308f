"""Documentation test: a setting, rule component, channel or module that exists is documented."""
import dataclasses
import re
from pathlib import Path

from studio.face import serve
from studio.rewards import DEFAULT_RULES
from studio.runs.generation import GenerateConfig
from studio.store.schema import TABLES
from widgets.base.style import CHANNELS

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
ARCH = (ROOT / "docs" / "architecture.md").read_text()
# the reference: the README and every page of docs/ (a setting is documented when it is in any of them)
DOCS = "\n".join([README] + [p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))])


def test_readme_starts_with_the_two_setup_commands():
    block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    cmds = [line for line in block.splitlines() if line and not line.startswith("#")]
    assert cmds[0] == "pip install torch==2.13.0 && pip install -e . && python launch.py"
    assert cmds[1] == 'pip install torch==2.13.0 && pip install -e ".[test]" && python -m pytest'
    # CI runs exactly the README's test command
    assert cmds[1] in (ROOT / ".ci" / "run").read_text().splitlines()


def test_readme_onboards_in_five_minutes():
    """The README is the way in (set up, a picture, what to click, your own run, links); the reference is in docs/."""
    assert len(README.splitlines()) <= 220, "README.md is over 220 lines: move the reference into a docs/ page"
    assert "](docs/studio.png)" in README, "README.md does not show docs/studio.png"
    png = (ROOT / "docs" / "studio.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "docs/studio.png is not a PNG: run python docs/screenshot.py"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")  # the IHDR chunk
    assert (width, height) == (1440, 900), (width, height)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_docs_link_leads_somewhere():
    """Every link between the README and docs/ pages names a file that exists and, with ``#``, a heading in it;
    every docs/ page is linked from the README."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            assert file.exists(), f"{page.name} links to {target}, which does not exist"
            if anchor and file.suffix == ".md":
                anchors = {slug(h) for h in re.findall(r"^#+ (.+)$", file.read_text(), flags=re.M)}
                assert anchor in anchors, f"{page.name} links to {target}: no such heading in {file.name}"
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)", README))
    assert linked == {p.name for p in pages[1:]}, "docs/ pages not linked from README.md: " + str(
        sorted({p.name for p in pages[1:]} - linked))


def test_every_environment_variable_is_documented():
    code = "".join(p.read_text() for top in ("studio", "backends", "widgets") for p in (ROOT / top).rglob("*.py"))
    for var in sorted(set(re.findall(r"ROLLOUT_STUDIO_[A-Z_]*[A-Z]", code))):
        assert f"`{var}`" in DOCS, var


def test_every_launch_option_is_documented():
    flags = [a.option_strings[-1] for a in serve.build_parser()._actions if a.option_strings and a.dest != "help"]
    assert "--db" in flags and "--check" in flags
    for flag in flags:
        assert f"`{flag}" in DOCS, flag


def test_every_generate_setting_is_documented():
    for f in dataclasses.fields(GenerateConfig):
        assert f"`{f.name}`" in DOCS, f.name


def test_every_reward_component_and_channel_is_documented():
    for rule in DEFAULT_RULES.values():
        for name in rule.components:
            assert f"`{name}`" in DOCS, name
    for ch in CHANNELS:
        assert f"`{ch}`" in DOCS, ch


def map_sections() -> dict[str, str]:
    """docs/architecture.md's package tables: folder -> its table's text."""
    parts = re.split(r"^### `([^`]+)/`$", ARCH, flags=re.M)
    return {parts[i]: parts[i + 1].split("\n## ")[0] for i in range(1, len(parts), 2)}


def test_every_table_and_module_is_in_the_architecture_map():
    for table in TABLES:
        assert f"`{table}`" in ARCH, table
    sections = map_sections()
    for top in ("studio", "backends", "widgets"):
        for py in sorted((ROOT / top).rglob("*.py")):
            folder = py.parent.relative_to(ROOT).as_posix()
            assert folder in sections, f"docs/architecture.md has no table for {folder}/"
            assert f"| `{py.name}` |" in sections[folder], f"{folder}/{py.name} is not in docs/architecture.md"


def _resolves(dotted: str) -> bool:
    """Whether ``studio.a.b.c`` names a module or an attribute of one."""
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def test_every_dotted_name_in_the_docs_exists():
    """A name the README, a docs page or the map gives (``studio.queries.table.RolloutFilter``) is one a reader can import."""
    names = set(re.findall(r"\b((?:studio|backends|widgets)\.[A-Za-z_][\w.]*[A-Za-z_\d])", DOCS))
    names = {n for n in names if not n.startswith(("studio.duckdb", "studio.prefix", "studio.completions",
                                                     "studio.choices")) and not n.endswith((".md", ".png"))}
    missing = sorted(n for n in names if not _resolves(n))
    assert not missing, f"the docs name what the code does not have: {missing}"


def test_every_minirun_setting_is_documented():
    from studio.runs.training import MiniRunConfig

    for f in dataclasses.fields(MiniRunConfig):
        assert f"`{f.name}`" in DOCS, f.name
