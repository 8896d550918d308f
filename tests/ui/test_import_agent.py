"""Importing an agent framework's trajectories in real Chromium: verl's agent-loop dump
(``tests/data/imports/verl_agent_loop.jsonl``) through Import & enrich, with the sample chat policy
named as its tokenizer, opens as a conversation: the call, the masked tool response, the answer."""
from __future__ import annotations

from pathlib import Path

import pytest

from .harness import wait_text

pytestmark = pytest.mark.ui

DUMP = Path(__file__).resolve().parents[1] / "data" / "imports" / "verl_agent_loop.jsonl"


def test_a_verl_agent_dump_imports_with_its_tokenizer_and_opens_as_a_conversation(page):
    page.locator(".lower-tabs .bk-tab", has_text="Import & enrich").click()
    page.locator(".import-source input").fill(str(DUMP))
    page.locator(".import-source input").press("Enter")
    page.locator(".import-tokenizer input").fill("sample-chat")
    page.locator(".import-tokenizer input").press("Enter")
    page.locator(".import-button button").click()
    wait_text(page, page.locator(".import-message"), "Imported 4 rollouts (528 tokens)", timeout_s=60)
    wait_text(page, page.locator(".table-count"), "4 of", timeout_s=30)  # the table jumps to the imported run
    page.locator(".tabulator-row").first.click()
    strip = wait_text(page, page.locator(".token-strip"), "<tool_response>888</tool_response>", timeout_s=30)
    assert '"expression": "37*24"' in strip  # the call read back from the assistant's tokens
    assert "calculatormasked39 tok" in strip  # the tool's reply: its 39 tokens masked, not the policy's
