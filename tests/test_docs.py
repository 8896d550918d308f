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


def test_readme_starts_with_the_two_setup_commands():
    block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    cmds = [line for line in block.splitlines() if line and not line.startswith("#")]
    assert cmds[0] == "pip install torch==2.13.0 && pip install -e . && python launch.py"
    assert cmds[1] == 'pip install torch==2.13.0 && pip install -e ".[test]" && python -m pytest'
    # CI runs exactly the README's test command
    assert cmds[1] in (ROOT / ".ci" / "run").read_text().splitlines()


def test_every_launch_option_is_documented():
    flags = [a.option_strings[-1] for a in serve.build_parser()._actions if a.option_strings and a.dest != "help"]
    assert "--db" in flags and "--check" in flags
    for flag in flags:
        assert f"`{flag}" in README, flag


def test_every_generate_setting_is_documented():
    for f in dataclasses.fields(GenerateConfig):
        assert f"`{f.name}`" in README, f.name


def test_every_reward_component_and_channel_is_documented():
    for rule in DEFAULT_RULES.values():
        for name in rule.components:
            assert f"`{name}`" in README, name
    for ch in CHANNELS:
        assert f"`{ch}`" in README, ch


def test_every_table_and_module_is_in_the_architecture_map():
    for table in TABLES:
        assert f"`{table}`" in ARCH, table
    for py in [*ROOT.glob("studio/*.py"), *ROOT.glob("backends/*.py"), *ROOT.glob("widgets/*.py")]:
        if py.name == "__init__.py":
            continue
        rel = py.relative_to(ROOT).as_posix()
        assert f"`{rel}`" in ARCH, rel


def test_every_minirun_setting_is_documented():
    from studio.runs.training import MiniRunConfig

    for f in dataclasses.fields(MiniRunConfig):
        assert f"`{f.name}`" in README, f.name
