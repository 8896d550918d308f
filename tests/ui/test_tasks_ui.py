r"""Tasks beyond arithmetic in real Chromium: the Generate panel's task picker lists a stored
prompt set and draws N prompts of a split deterministically; the token strip shows a chat
rollout as a conversation (system and user turns, the ``<think>`` band labelled "reasoning",
the answer outlined, the extracted answer beside the gold one); a rollout imported as text
alone shows its text and the Enrich hint. With ``ROLLOUT_STUDIO_SHOTS=<folder>`` the served
page is also photographed at 1440×900 and 1280×800 with a chat rollout selected."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from studio.ingest.importers import import_run
from studio.ingest.prompt_sets import PromptSetConfig, add_prompt_set
from studio.queries.prompts import draw_prompts
from studio.rewards import default_rule
from studio.runs.generation import ingest
from studio.store import Store
from studio.store.runs import set_status, start_run
from studio.tasks import Prompt, get_task

from .harness import Server, studio_page, text, wait_text

pytestmark = pytest.mark.ui

SYSTEM = "Reason step by step inside <think></think>, then give the answer as \\boxed{n}."
QUESTION = "Natalia sold 48 clips in April, and then she sold half as many clips in May. How many clips in May?"
# the completion as the chat policy answers, cut into tokens (the stop token ends it, not part of its text)
PIECES = ["<think>", "\n", "48", " /", " 2", " =", " 24", "\n", "</think>", "\n", "\\boxed{", "24", "}"]
STOP = "<|im_end|>"


def gsm8k_files(folder: Path) -> list[Path]:
    """A small GSM8K-shaped prompt set: ``question``, ``answer`` ending in ``#### n``."""
    rows = [{"question": f"A farmer has {n} sheep and buys {n // 2} more. How many sheep now?",
             "answer": f"{n} + {n // 2} = {n + n // 2}\n#### {n + n // 2}"} for n in range(10, 50, 2)]
    paths = []
    for name, part in (("train", rows[:14]), ("test", rows[14:])):
        p = folder / f"{name}.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in part))
        paths.append(p)
    return paths


def generation(i: int, prompt: str, pieces: list[str]):
    """A completion with token rows, as a policy's sample job returns it (entropy high at the fork)."""
    from backends.types import Generation

    texts = pieces + [STOP]
    n = len(texts)
    rng = np.random.default_rng(i)
    entropy = rng.uniform(0.02, 0.4, n).astype(np.float32)
    entropy[4] = 1.6  # the division: where the policy hesitated
    ids = np.arange(5, 5 + n, dtype=np.int64)
    topk = np.stack([ids, ids + 1, ids + 2], axis=1)
    return Generation(prompt_index=0, sample_idx=i, prompt=prompt, text="".join(pieces), token_ids=ids,
                      token_texts=texts, logprobs=-entropy / 2, entropies=entropy, topk_ids=topk,
                      topk_logprobs=np.log(np.tile([0.7, 0.2, 0.1], (n, 1))).astype(np.float32),
                      finish_reason="stop")


def build_store(folder: Path) -> tuple[Path, dict[str, list[str]]]:
    """The sample store, a prompt set ``wp``, a text-only import, then a chat group of ``wp``
    (newest: the table's first rows); and the prompts a seed-0 draw of 3 gives of each split."""
    from sample_data import ROLLOUTS_DIR

    db = folder / "tasks.duckdb"
    store = Store.open(db, seed_dir=ROLLOUTS_DIR)
    add_prompt_set(store, gsm8k_files(folder), PromptSetConfig(name="wp", preset="gsm8k", system=SYSTEM,
                                                               extract="boxed"))
    (folder / "run").mkdir()
    (folder / "run" / "0.jsonl").write_text(json.dumps(
        {"input": "Imported question: what is 6 times 7?", "output": "6 * 7 = 42, so the answer is 42.",
         "gts": "42", "score": 1.0, "step": 0}) + "\n")
    import_run(store, [folder / "run"], "verl", task="import")
    task = get_task("wp")
    prompt = Prompt(QUESTION, {"answer": "24", "solution": "48 / 2 = 24\n#### 24"}, {"split": "train"},
                    messages=({"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}))
    run = start_run(store, "generate", "chat sample", "sample", "wp", {})
    wrong = PIECES[:6] + [" 42", "\n", "</think>", "\n", "\\boxed{", "42", "}"]
    ingest(store, run, task, [prompt], [generation(0, QUESTION, PIECES), generation(1, QUESTION, wrong)],
           default_rule(task), "sample@test")
    set_status(store, run, "done")
    drawn = {split: [p.text for p in draw_prompts(store, "wp", 3, seed=0, split=split)] for split in ("train", "test")}
    store.close()
    return db, drawn


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    db, drawn = build_store(tmp_path_factory.mktemp("tasks"))
    s = Server(db)
    s.drawn = drawn
    yield s
    s.stop()


def shoot(page, name: str, at=None) -> None:
    """A screenshot at 1440×900 (``at`` scrolled into view) into ``$ROLLOUT_STUDIO_SHOTS`` when it is set."""
    shots = os.environ.get("ROLLOUT_STUDIO_SHOTS")
    if shots:
        Path(shots).mkdir(parents=True, exist_ok=True)
        page.set_viewport_size({"width": 1440, "height": 900})
        page.wait_for_timeout(800)
        if at is not None:
            at.scroll_into_view_if_needed()
            page.wait_for_timeout(300)
        page.screenshot(path=str(Path(shots) / name))


def test_generate_task_picker_and_deterministic_draw(page, server):
    task = page.locator(".generate-task select")
    assert "wp" in task.locator("option").all_inner_texts()
    assert page.locator(".fresh-prompts").is_visible()  # arithmetic: new prompts with a difficulty
    task.select_option("wp")
    page.locator(".draw-row").wait_for(state="visible", timeout=20_000)
    page.locator(".fresh-prompts").wait_for(state="hidden", timeout=10_000)  # only for the arithmetic task
    assert "train (15)" in page.locator(".draw-split select option").all_inner_texts()
    page.locator(".draw-n input").fill("3")
    page.locator(".draw-n input").press("Tab")
    page.locator(".draw-button button").click()
    first = wait_text(page, page.locator(".drawn-prompts"), "3 drawn prompts")
    expected = server.drawn["train"]
    assert all(t in first for t in expected), (expected, first)
    assert [first.index(t) for t in expected] == sorted(first.index(t) for t in expected)  # in the draw's order
    page.locator(".draw-button button").click()  # the same seed draws the same prompts
    page.wait_for_timeout(500)
    assert text(page.locator(".drawn-prompts")) == first
    page.locator(".draw-split select").select_option(label="test (6)")
    page.locator(".draw-button button").click()
    wait_text(page, page.locator(".generate-status"), "from wp · test")
    assert all(t in text(page.locator(".drawn-prompts")) for t in server.drawn["test"])
    shoot(page, "generate-drawn-1440x900.png", page.locator(".drawn-prompts"))


def test_chat_rollout_shows_the_conversation_and_marks(page, server):
    page.locator(".rollout-table .tabulator-row").first.click()
    page.wait_for_selector(".token-strip .tok", timeout=20_000)
    strip = page.locator(".token-strip")
    wait_text(page, strip, "Natalia sold 48 clips")
    shown = text(strip)
    assert "reasoning" in shown and SYSTEM in shown and "<|im_start|>" not in shown
    assert page.locator(".token-strip .convo .turn.user .say").inner_text().startswith("Natalia")
    assert page.locator(".token-strip .think-block .tok").count() >= 8
    assert page.locator(".token-strip .tok.answer").count() >= 1
    header = text(page.locator(".strip-header"))
    assert "gold" in header and "None" not in header
    assert "answer 24" in " ".join(header.split()) or "answer 42" in " ".join(header.split())
    assert "reasoning" in text(page.locator(".strip-legend"))  # the band's key
    shoot(page, "chat-rollout-1440x900.png")
    if os.environ.get("ROLLOUT_STUDIO_SHOTS"):
        page.set_viewport_size({"width": 1280, "height": 800})
        page.wait_for_timeout(800)
        page.screenshot(path=str(Path(os.environ["ROLLOUT_STUDIO_SHOTS"]) / "chat-rollout-1280x800.png"))


def test_text_only_import_shows_its_text_and_is_enriched_in_place(page, server):
    page.get_by_placeholder("e.g. 48-7").fill("Imported question")
    page.get_by_placeholder("e.g. 48-7").press("Enter")
    wait_text(page, page.locator(".table-count"), "1 of", timeout_s=30)
    page.locator(".rollout-table .tabulator-row").first.click()
    shown = wait_text(page, page.locator(".token-strip"), "6 * 7 = 42, so the answer is 42.")
    assert "imported as text" in shown and "Enrich" in shown
    assert "what is 6 times 7?" in shown  # the prompt, as the user's turn
    assert page.locator(".token-strip .tok").count() == 0  # never the previous rollout's tokens
    header = text(page.locator(".strip-header"))
    assert "None" not in header and "gold 42" in " ".join(header.split())
    shoot(page, "text-only-import-1440x900.png")
    # the Enrich action: teacher-forced by the Generate policy, the rollout gets its tokens in place
    page.get_by_role("button", name="Enrich this rollout with the Generate policy").click()
    page.wait_for_selector(".token-strip .tok", timeout=60_000)
    assert page.locator(".token-strip .tok").count() >= 20
    assert page.get_by_role("button", name="Enrich this rollout with the Generate policy").count() == 0


def test_add_a_prompt_set_in_the_import_tab(browser, server, tmp_path):
    with studio_page(browser, server) as pg:
        paths = gsm8k_files(tmp_path)
        pg.locator(".lower-tabs .bk-tab", has_text="Import & enrich").click()
        pg.locator(".set-path input").fill(", ".join(map(str, paths)))
        pg.locator(".set-path input").press("Tab")
        pg.locator(".set-name input").fill("sheep")
        pg.locator(".set-name input").press("Tab")
        pg.locator(".set-add button").click()
        msg = wait_text(pg, pg.locator(".set-message"), "Added task sheep", timeout_s=60)
        assert "14 train" in msg and "6 test" in msg
        shoot(pg, "add-prompt-set-1440x900.png", pg.locator(".set-message"))
        wait_opt = pg.locator(".generate-task select option", has_text="sheep")
        wait_opt.wait_for(state="attached", timeout=20_000)  # the Generate task picker lists it
        pg.locator(".set-name input").fill("sheep")  # the same name again: refused in the banner
        pg.locator(".set-name input").press("Tab")
        pg.locator(".set-add button").click()
        wait_text(pg, pg.locator(".set-message"), "already has a task 'sheep'", timeout_s=60)
