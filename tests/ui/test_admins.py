"""A shared deployment: signed-in users browse; only admins get code-running actions."""
from __future__ import annotations

import json

import pytest

from .harness import Server, open_row, text

pytestmark = pytest.mark.ui


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory):
    d = tmp_path_factory.mktemp("auth")
    creds = d / "users.json"
    creds.write_text(json.dumps({"alice": "alice-pass", "bob": "bob-pass"}))
    s = Server(d / "studio.duckdb", ["--basic-auth", str(creds), "--admins", "alice", "--cookie-secret", "test-secret"])
    yield s
    s.stop()


def sign_in(browser, server, user: str, password: str):
    ctx = browser.new_context(viewport={"width": 1600, "height": 1000})
    pg = ctx.new_page()
    pg.goto(server.url)
    pg.locator("input[name=username]").fill(user)
    pg.locator("input[name=password]").fill(password)
    pg.locator("input[name=password]").press("Enter")
    return ctx, pg


def test_admin_gets_generate_and_others_browse_only(browser, auth_server):
    ctx, alice = sign_in(browser, auth_server, "alice", "alice-pass")
    alice.wait_for_selector(".tabulator-row", timeout=60_000)
    assert alice.locator(".generate-button button").count() == 1
    open_row(alice, 0)  # (the strip of the clicked row: a token picked on the one before is redrawn away)
    alice.locator(".token-strip .tok").nth(3).click()
    # the first fork panel of the run waits on the worker and the policy's tokenizer, loaded cold in a fresh
    # CI environment: a minute was once not enough there (a bound on the wait, not a timing)
    alice.wait_for_selector(".branch-button button", timeout=180_000)
    ctx.close()

    ctx, bob = sign_in(browser, auth_server, "bob", "bob-pass")
    bob.wait_for_selector(".tabulator-row", timeout=60_000)
    assert bob.locator(".generate-button button").count() == 0
    assert "Signed in as bob: browsing only" in text(bob.locator(".browse-only"))
    open_row(bob, 0)  # browsing still works
    bob.locator(".token-strip .tok").nth(3).click()  # picking a token shows no branch form to bob
    bob.wait_for_selector("text=Browsing only: branching runs the policy", timeout=60_000)
    assert bob.locator(".branch-button button").count() == 0
    bob.locator(".lower-tabs .bk-tab", has_text="Compare policies").click()  # built when first opened
    assert bob.locator(".compare-button button").is_disabled()
    ctx.close()
    assert not auth_server.tracebacks()


def test_wrong_password_never_reaches_the_studio(browser, auth_server):
    ctx, pg = sign_in(browser, auth_server, "bob", "wrong")
    pg.wait_for_url("**/login?error=*", timeout=20_000)
    assert pg.locator(".tabulator-row").count() == 0
    ctx.close()
