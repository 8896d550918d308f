"""The mismatch channel in the served page (Chromium): a store where some rollouts carry a recomputed
(train) log-prob beside the sampler's, written through the record contract; the channel's colours and
legend, the hover card's numbers, the correction's marks following the sidebar's cap, a preset setting
the fields, and a rollout without recomputed log-probs saying what to do."""
from __future__ import annotations

import os
import re

import numpy as np
import pytest

from backends import Generation
from sample_data import ROLLOUTS_DIR
from studio.rewards.builtin import default_rule
from studio.runs.generation import ingest
from studio.signals.mismatch import PRESETS
from studio.store import Store
from studio.store.runs import start_run
from studio.tasks import Prompt, get_task

from .harness import Server, studio_page, text, wait_text
from .test_layout import OVERFLOW

pytestmark = pytest.mark.ui

TEXTS = ["2", "+", "2", "=", "4"]
BEHAVIOUR = np.array([-0.05, -1.5, -0.3, -0.2, -0.1], np.float32)
# Δ per token: the trainer gives "+" e^1.2 ≈ 3.3 times the sampler's probability, the second "2" e^-0.9 ≈ 0.41 times
DELTAS = np.array([0.0, 1.2, -0.9, 0.05, 0.0], np.float32)


def _generation(sample_idx: int, train: np.ndarray | None) -> Generation:
    T = len(TEXTS)
    topk = np.tile(np.arange(100, 103), (T, 1))
    topk[:, 1] = np.arange(T)  # each sampled token second of the sampler's top-3
    return Generation(prompt_index=0, sample_idx=sample_idx, prompt="2+2=", text="".join(TEXTS),
                      token_ids=np.arange(T), token_texts=TEXTS, logprobs=BEHAVIOUR, entropies=-BEHAVIOUR + 0.2,
                      topk_ids=topk, topk_logprobs=np.tile(np.array([-0.01, -0.05, -3.0], np.float32), (T, 1)),
                      finish_reason="stop", engine="torch 2.13.0 cpu bfloat16", train_logprobs=train,
                      ranks=None if train is None else np.array([1, 1, 3, 1, 1]))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The arithmetic world and one newer group: the worst rollout (sample 0), a nearly matched one, one never
    recomputed."""
    db = tmp_path_factory.mktemp("mismatch") / "studio.duckdb"
    store = Store.open(db, seed_dir=ROLLOUTS_DIR)
    task = get_task("arithmetic")
    run_id = start_run(store, "generate", "mismatch", "sample", task.name, {})
    gens = [_generation(0, BEHAVIOUR + DELTAS), _generation(1, BEHAVIOUR + DELTAS / 100), _generation(2, None)]
    ingest(store, run_id, task, [Prompt("2+2=", {"answer": 4})], gens, default_rule(task), None)
    ids = store.df("SELECT rollout_id FROM rollouts WHERE run_id = ? ORDER BY sample_idx", [run_id])["rollout_id"]
    store.close()
    s = Server(db)
    yield s, ids.tolist()
    s.stop()


def open_sample(page, ids: list[str], k: int) -> None:
    """Open sample ``k`` of the newest group (the table's first rows, newest first) and wait for its strip."""
    page.locator(".rollout-table .tabulator-row").nth(k).click()
    page.wait_for_selector(f'.token-strip .strip[data-rollout="{ids[k]}"] .tok', timeout=20_000)


def token(page, pos: int):
    return page.locator(f'.token-strip .tok[data-pos="{pos}"]').first


def set_cap(page, cap: float) -> None:
    box = page.locator(".mm-cap input")
    box.fill(str(cap))
    box.press("Tab")


def wait_marks(page, n: int) -> None:
    for _ in range(100):
        if page.locator(".token-strip .tok.mm-clipped").count() == n:
            return
        page.wait_for_timeout(200)
    assert page.locator(".token-strip .tok.mm-clipped").count() == n


def rgb(page, pos: int) -> tuple[int, ...]:
    bg = token(page, pos).evaluate("e => getComputedStyle(e).backgroundColor")
    return tuple(int(x) for x in re.findall(r"\d+", bg)[:3])


def test_channel_colours_legend_card_and_marks(browser, served):
    server, ids = served
    with studio_page(browser, server) as page:
        page.set_viewport_size({"width": 1440, "height": 900})
        open_sample(page, ids, 0)
        page.locator(".channel-picker button", has_text="mismatch").click()
        legend = page.locator(".strip-legend")
        wait_text(page, legend, "Δ = log π_train − log π_behaviour")
        page.wait_for_selector('.token-strip .strip[data-channel="mismatch"]', timeout=20_000)
        assert "blue = the trainer gives the token less probability than the sampler, red = more" in text(legend)
        r, _, b = rgb(page, 1)
        assert r > b  # Δ = +1.2: red
        r, _, b = rgb(page, 2)
        assert b > r  # Δ = -0.9: blue
        assert float(token(page, 1).get_attribute("data-channel-value")) == pytest.approx(1.2, abs=1e-4)
        # the default correction (TIS, C = 2) clips "+" (ratio 3.3), marked and counted in the legend
        wait_marks(page, 1)
        assert re.search(r"clipped \(weight reduced\)\s*1", text(legend))
        token(page, 1).hover()
        card = token(page, 1).locator(".card")
        card.wait_for(state="visible", timeout=5_000)
        got = re.sub(r"\s+", " ", card.inner_text())
        assert "behaviour -1.500 0.223 2" in got  # second of the sampler's top-3
        assert "train -0.300 0.741 1" in got
        assert "+1.2000 · 3.32" in got and "clipped to C = 2" in got
        assert "entropy" in got and "1.700" in got
        if os.environ.get("STUDIO_SHOTS"):
            page.screenshot(path=os.path.join(os.environ["STUDIO_SHOTS"], "mismatch-1440.png"))
        # the sidebar's cap moves the marks: C = 4 clips nothing, C = 1.2 clips "+" only (the ratio 1.05 of "=" kept)
        page.locator(".mismatch-card .card-header").click()
        set_cap(page, 4)
        wait_marks(page, 0)
        set_cap(page, 1.2)
        wait_marks(page, 1)
        assert page.evaluate(OVERFLOW) == []


def test_a_preset_sets_the_fields(browser, served):
    name, preset = next((n, c) for n, c in PRESETS.items() if c.cap not in (2.0, 0.0))
    server, ids = served
    with studio_page(browser, server) as page:
        page.set_viewport_size({"width": 1280, "height": 800})
        open_sample(page, ids, 0)
        page.locator(".mismatch-card .card-header").click()
        page.locator(".mm-preset select").select_option(label=name)
        for _ in range(50):
            if float(page.locator(".mm-cap input").input_value() or 0) == pytest.approx(preset.cap):
                break
            page.wait_for_timeout(200)
        assert float(page.locator(".mm-cap input").input_value()) == pytest.approx(preset.cap)
        assert page.locator(".mm-method select").input_value() == preset.method
        assert float(page.locator(".mm-low input").input_value()) == pytest.approx(preset.low)
        page.locator(".channel-picker button", has_text="mismatch").click()
        wait_text(page, page.locator(".strip-legend"), preset.describe())
        if os.environ.get("STUDIO_SHOTS"):
            page.screenshot(path=os.path.join(os.environ["STUDIO_SHOTS"], "mismatch-1280.png"))
            page.locator(".mismatch-card").screenshot(path=os.path.join(os.environ["STUDIO_SHOTS"], "mismatch-card.png"))
        assert page.evaluate(OVERFLOW) == []


def test_a_rollout_never_recomputed_says_what_to_do(browser, served):
    server, ids = served
    with studio_page(browser, server) as page:
        open_sample(page, ids, 2)
        page.locator(".channel-picker button", has_text="mismatch").click()
        wait_text(page, page.locator(".strip-legend"), "Rescore it in the Mismatch tab")
        page.wait_for_selector('.token-strip .strip[data-channel="mismatch"]', timeout=20_000)
        assert rgb(page, 1) == (241, 243, 245)  # no Δ: the neutral grey


def test_the_table_sorts_worst_mismatch_first_and_filters_by_it(browser, served):
    server, ids = served
    with studio_page(browser, server) as page:
        page.locator(".channel-picker button", has_text="mismatch").click()
        header = page.locator('.rollout-table .tabulator-col[tabulator-field="max_abs_delta"]')
        header.wait_for(state="visible", timeout=20_000)
        assert not page.locator('.rollout-table .tabulator-col[tabulator-field="reward"]').is_visible()
        header.click()  # one click: the worst first
        cells = page.locator(".rollout-table .tabulator-row [tabulator-field=max_abs_delta]")
        for _ in range(100):
            if cells.first.inner_text() == "1.200":
                break
            page.wait_for_timeout(200)
        assert cells.nth(0).inner_text() == "1.200" and cells.nth(1).inner_text() == "0.012"
        if os.environ.get("STUDIO_SHOTS"):
            page.set_viewport_size({"width": 1280, "height": 800})
            page.screenshot(path=os.path.join(os.environ["STUDIO_SHOTS"], "mismatch-table-1280.png"))
        assert page.evaluate(OVERFLOW) == []
        page.locator(".rollout-table .tabulator-row").first.click()
        page.wait_for_selector(f'.token-strip .strip[data-rollout="{ids[0]}"]', timeout=20_000)
        box = page.locator(".mm-min-delta input")
        box.fill("0.5")
        box.press("Tab")
        wait_text(page, page.locator(".table-count"), "1 of")
        assert page.locator(".rollout-table .tabulator-row").count() == 1
