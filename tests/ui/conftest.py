"""Serve the real studio (``launch.py``) on a free loopback port and drive Debian's Chromium."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from .harness import CHROMIUM, FLAGS, Server, studio_page


@pytest.fixture(scope="session")
def browser():
    if not shutil.which(CHROMIUM) and not Path(CHROMIUM).exists():
        pytest.fail("Debian's chromium is required for UI tests: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("ui") / "studio.duckdb")
    yield s
    s.stop()


@pytest.fixture()
def page(browser, server):
    with studio_page(browser, server) as pg:
        yield pg
