"""Import & enrich and the SQL console in real Chromium: a verl dump with a malformed line is
refused with its file and line, imported with the line skipped, enriched with the sample
policy so its token strip fills in, a shard written later arrives through the watched
folder, and the SQL console reads the store but refuses to change it."""
from __future__ import annotations

import json

import pytest

from .harness import open_row, text, wait_text

pytestmark = pytest.mark.ui


def verl_dump(folder, step: int, n: int, bad_line: int | None = None) -> None:
    """``{step}.jsonl`` as verl's ``_dump_generations`` writes it: input, output, gts, score, step."""
    lines = []
    for i in range(n):
        a, b = 10 + i, 3 + step
        correct = i % 2 == 0
        lines.append(json.dumps({"input": f"Q: {a}+{b}=", "output": f"{a}+{b}={a + b if correct else a + b + 1};A: "
                                 f"{a + b if correct else a + b + 1}", "gts": str(a + b), "score": float(correct),
                                 "step": step, "acc": float(correct)}))
    if bad_line is not None:
        lines[bad_line - 1] = '{"input": "Q: 1+1=", "output": '  # cut off mid-record
    (folder / f"{step}.jsonl").write_text("\n".join(lines) + "\n")


def test_import_skip_enrich_tail_and_sql(page, tmp_path):
    run_dir = tmp_path / "verl-run"
    run_dir.mkdir()
    verl_dump(run_dir, 1, 8, bad_line=3)
    verl_dump(run_dir, 2, 8)
    page.locator(".lower-tabs .bk-tab", has_text="Import & enrich").click()
    page.locator(".import-source input").fill(str(run_dir))
    page.locator(".import-source input").press("Enter")
    page.locator(".import-button button").click()
    msg = wait_text(page, page.locator(".import-message"), "Nothing imported", timeout_s=60)
    assert "1.jsonl:3" in msg  # the file and the line, and nothing written
    page.locator(".import-on-error button", has_text="skip").click()
    page.locator(".import-tail input").check()
    page.locator(".import-button button").click()
    msg = wait_text(page, page.locator(".import-message"), "Imported 15 rollouts", timeout_s=60)
    assert "skipped 1 malformed" in msg and "1.jsonl:3" in msg
    # the table jumps to the imported run
    wait_text(page, page.locator(".table-count"), "15 of", timeout_s=30)
    wait_text(page, page.locator(".import-tails"), str(run_dir), timeout_s=30)  # (drawn after the table)

    # enrich: the imported run has no tokens; the sample policy fills them in
    wait_text(page, page.locator(".enrich-run"), "without tokens", timeout_s=30)  # (its options: after the tails)
    page.locator(".enrich-run select").select_option(index=0)
    assert "without tokens" in text(page.locator(".enrich-run"))
    page.locator(".enrich-button button").click()
    wait_text(page, page.locator(".enrich-message"), "Enriched 15 rollouts", timeout_s=120)
    open_row(page, 0)  # its tokens, from teacher forcing (not the strip shown before the click)
    assert page.locator(".token-strip .tok").count() > 3
    assert "+" in text(page.locator(".token-strip"))

    # a step written after the import arrives through the watched folder
    verl_dump(run_dir, 3, 8)
    wait_text(page, page.locator(".table-count"), "23 of", timeout_s=60)

    # SQL: a read answers, a write is refused
    page.locator(".lower-tabs .bk-tab", has_text="SQL").click()
    page.locator(".sql-examples select").select_option("Imported files")
    page.locator(".sql-run button").click()
    wait_text(page, page.locator(".sql-message"), "3 rows", timeout_s=30)
    wait_text(page, page.locator(".sql-result"), "3.jsonl", timeout_s=30)
    editor = page.locator(".sql-editor .ace_text-input")
    editor.focus()
    page.keyboard.press("Control+a")
    page.keyboard.type("DELETE FROM rollouts")
    page.locator(".sql-run button").click()
    wait_text(page, page.locator(".sql-message"), "only SELECT", timeout_s=30)
