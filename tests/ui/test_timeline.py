"""Timeline and run diff in real Chromium, on a store holding an imported multi-step run:
pick the run and a prompt, see the curves and a step's completions, open one in the token
strip; set the diff's sides and read the same numbers ``studio.queries.timeline.run_diff`` gives;
a mover opens its prompt's timeline; a row selected in the table moves the timeline to it."""
from __future__ import annotations

import os
import time

import numpy as np
import pandas as pd
import pytest

from sample_data import ROLLOUTS_DIR
from studio.queries import timeline as tl
from studio.queries.timeline import Side
from studio.store import Store
from studio.store.records import new_ids
from widgets.timeline_html import fmt_num, fmt_p
from widgets.timeline_panel import N_MOVERS, WHOLE_RUN

from .harness import Server, open_tab, strip_text, studio_page, text, wait_text

pytestmark = pytest.mark.ui

RUN_ID = "run_ui_timeline"
STEPS = 6
POOL = 24  # prompts the run trains on; each step samples PER_STEP of them
PER_STEP = 16
GROUP = 4
NO_TOKENS_STEP = 3  # an importer without log-probs: that step's completions have no tokens


def add_training_run(store: Store, seed: int = 0) -> None:
    """An imported GRPO-like run built from the sample rollouts: each step samples groups of
    ``GROUP`` of a prompt's stored completions, correct ones more likely as steps go on, with
    their reward rows and tokens copied (entropy shrinking step by step)."""
    rng = np.random.default_rng(seed)
    src = store.df("""SELECT ro.*, acc.value AS acc FROM rollouts ro
                      JOIN rewards acc ON acc.rollout_id = ro.rollout_id AND acc.component = 'accuracy'
                      ORDER BY ro.prompt_id, ro.sample_idx""")
    pool = sorted(src["prompt_id"].unique())[:POOL]
    by_prompt = {p: part for p, part in src.groupby("prompt_id")}
    picked, steps = [], []
    for step in range(1, STEPS + 1):
        for p in rng.choice(pool, PER_STEP, replace=False):
            part = by_prompt[p]
            w = 1.0 + 1.2 * (step - 1) * part["acc"].to_numpy()  # learning: right answers gain weight
            idx = rng.choice(len(part), GROUP, replace=False, p=w / w.sum())
            picked += part["rollout_id"].iloc[idx].tolist()
            steps += [step] * GROUP
    n = len(picked)
    ids = new_ids("r", n)
    gids = np.repeat(new_ids("g", n // GROUP), GROUP)
    old = src.set_index("rollout_id").loc[picked].reset_index()
    ro = old.drop(columns=["acc", "rollout_id"]).assign(
        rollout_id=ids, run_id=RUN_ID, train_step=steps, group_id=gids, sample_idx=np.tile(np.arange(GROUP), n // GROUP),
        policy_version=[f"{RUN_ID}@{s}" for s in steps])
    ro = ro.drop(columns=[c for c in ("train_advantage", "enriched_by") if c in ro.columns])
    m = pd.DataFrame({"old": picked, "rollout_id": ids, "step": steps})
    rw = store.df("SELECT * FROM rewards WHERE list_contains(?, rollout_id)", [list(set(picked))])
    rw = m.merge(rw.rename(columns={"rollout_id": "old"}), on="old").drop(columns=["old", "step"])
    tk = store.df("SELECT * FROM tokens WHERE list_contains(?, rollout_id)", [list(set(picked))])
    tk = m[m["step"] != NO_TOKENS_STEP].merge(tk.rename(columns={"rollout_id": "old"}), on="old")
    tk["entropy"] = tk["entropy"] * (1.25 - 0.12 * tk["step"])
    tk = tk.drop(columns=["old", "step"])
    runs = pd.DataFrame([{"run_id": RUN_ID, "kind": "import", "name": "imported GRPO run", "policy": "sample",
                          "task": "arithmetic", "created_at": pd.Timestamp.now(), "status": "done"}])
    store.write({"runs": runs, "rollouts": ro, "rewards": rw, "tokens": tk})


@pytest.fixture(scope="module")
def tl_server(tmp_path_factory):
    """A server on a store with the sample run and the imported run, and the diff that
    ``run_diff`` computes on that store (before the server takes the file)."""
    db = tmp_path_factory.mktemp("timeline") / "studio.duckdb"
    store = Store.open(db, seed_dir=ROLLOUTS_DIR)
    try:
        add_training_run(store)
        sample_run = store.scalar("SELECT run_id FROM runs WHERE kind = 'sample'")
        expected = tl.run_diff(store, Side(sample_run), Side(RUN_ID, STEPS))
        prompt_ids = tl.prompts_across_steps(store, RUN_ID)["prompt_id"].tolist()
    finally:
        store.close()
    s = Server(db)
    s.expected, s.prompt_ids = expected, prompt_ids
    yield s
    s.stop()


def select(page, css: str, label: str) -> None:
    page.locator(f"{css} select").select_option(label=label)


def options(page, css: str) -> list[str]:
    return page.locator(f"{css} select option").all_inner_texts()


def chosen(page, css: str) -> str:
    return page.locator(f"{css} select").input_value()


def wait_until(page, fn, timeout_s: float = 30, what: str = ""):
    deadline = time.time() + timeout_s
    while True:
        got = fn()
        if got or time.time() > deadline:
            assert got, what
            return got
        page.wait_for_timeout(200)


def wait_options(page, css: str, pred, timeout_s: float = 30) -> list[str]:
    wait_until(page, lambda: pred(options(page, css)), timeout_s, f"options of {css}: {options(page, css)}")
    return options(page, css)


def prompt_id_of(server, label: str) -> str:
    """The prompt id behind a label of the timeline's prompt picker (labels end with its last 5 characters)."""
    tail = label.rsplit(" · ", 1)[-1]
    return next(p for p in server.prompt_ids if p.endswith(tail))


# the height of every drawn figure's data frame on the page, as BokehJS laid it out (0: collapsed)
FRAME_HEIGHTS = """() => { const out = [], seen = new Set();
  const visit = v => { if (!v || seen.has(v)) return; seen.add(v);
    if (v.model && v.model.type === 'Figure' && v.frame) out.push(v.frame.bbox.height);
    for (const c of (v.child_views || [])) visit(c); };
  for (const v of Bokeh.index) visit(v);
  return out; }"""


def test_timeline_and_run_diff(browser, tl_server):
    with studio_page(browser, tl_server) as page:
        page.locator(".lower-tabs .bk-tab", has_text="Timeline & diff").click()
        runs = wait_options(page, ".timeline-run", lambda o: any("imported GRPO run" in x for x in o))
        assert len(runs) == 1 and f"{STEPS} steps" in runs[0]  # the sample run has no training steps
        prompts = wait_options(page, ".timeline-prompt", lambda o: len(o) > 3)
        # the list puts the prompts seen at most steps first; pick the second by hand
        select(page, ".timeline-prompt", prompts[1])
        pid = prompt_id_of(tl_server, prompts[1])
        n_steps = int(prompts[1].split(" · ")[1].split()[0])
        wait_text(page, page.locator(".timeline-info"), f"seen at {n_steps} steps", timeout_s=30)
        page.wait_for_selector(".timeline-plot canvas", timeout=30_000)
        # its three plots drawn at their size, also after the tab was left and opened again (the view
        # leaves the page meanwhile)
        for reopen in (False, True):
            if reopen:
                open_tab(page, "SQL")
                open_tab(page, "Timeline & diff")
            wait_until(page, lambda: len(page.evaluate(FRAME_HEIGHTS)) >= 3 and min(page.evaluate(FRAME_HEIGHTS)) > 100,
                       what="the timeline's plots drawn at their height")
        steps = wait_options(page, ".timeline-step", lambda o: len(o) == n_steps)
        # a step with tokens: its completions are listed, and one opens in the token strip
        step = next(s for s in reversed(steps) if s != f"step {NO_TOKENS_STEP}")
        select(page, ".timeline-step", step)
        listed = f'.timeline-step-list table.steps[data-prompt="{pid}"][data-step="{step.split()[-1]}"]'
        page.wait_for_selector(listed, timeout=30_000)
        rows = page.locator(f"{listed} tr.step-row")
        assert rows.count() == GROUP
        completion = rows.nth(1).locator("td.mono").inner_text()
        rows.nth(1).click()
        wait_until(page, lambda: strip_text(page) == completion, what="the token strip shows the completion")
        wait_until(page, lambda: page.locator(f"{listed} tr.step-row.selected").count() == 1,
                   what="the opened completion is marked")
        # an imported step without tokens: said so, nothing fails
        if f"step {NO_TOKENS_STEP}" in steps:
            select(page, ".timeline-step", f"step {NO_TOKENS_STEP}")
            wait_text(page, page.locator(".timeline-step-list"), "no tokens", timeout_s=30)
            assert "without tokens" in text(page.locator(".timeline-info"))

        # the diff: the sample run (whole) against the run's last step, as run_diff computes it
        sample_label = next(o for o in options(page, ".diff-a-run") if "imported" not in o)
        run_label = next(o for o in options(page, ".diff-b-run") if "imported" in o)
        select(page, ".diff-a-run", sample_label)
        wait_options(page, ".diff-a-step", lambda o: o == [WHOLE_RUN])
        select(page, ".diff-b-run", run_label)
        wait_options(page, ".diff-b-step", lambda o: len(o) == STEPS + 1)
        select(page, ".diff-b-step", f"step {STEPS}")
        d = tl_server.expected
        got = wait_text(page, page.locator(".diff-summary"), f"{d.shared:,} shared prompts", timeout_s=60)
        assert d.n > 5
        for needle in (f"Δ {fmt_num(d.mean_delta)}", f"[{fmt_num(d.ci_lo)}, {fmt_num(d.ci_hi)}]",
                       f"Wilcoxon p {fmt_p(d.p_wilcoxon)}", f"sign p {fmt_p(d.p_sign)}",
                       f"win / tie / loss {d.wins} / {d.ties} / {d.losses}",
                       f"accuracy {fmt_num(d.accuracy_a, '.3f')} → {fmt_num(d.accuracy_b, '.3f')}",
                       f"A only {d.only_a} · B only {d.only_b}"):
            assert needle in got, (needle, got)
        movers = page.locator(".diff-movers tr.mover")
        m = d.movers(N_MOVERS)
        assert len(m) > 0
        wait_until(page, lambda: movers.count() == len(m), what="the movers listed")
        shown = movers.evaluate_all("els => els.map(e => e.dataset.value)")
        assert shown == m["prompt_id"].tolist()  # rose most, then fell most, in run_diff's order
        page.wait_for_selector(".diff-scatter canvas", timeout=30_000)
        if os.environ.get("STUDIO_SHOTS"):
            page.locator(".timeline-panel").first.screenshot(path=os.path.join(os.environ["STUDIO_SHOTS"],
                                                                                "timeline-panel.png"))
        # a mover opens its prompt's timeline
        last = m.iloc[-1]
        movers.nth(len(m) - 1).click()
        wait_until(page, lambda: chosen(page, ".timeline-prompt").endswith(last.prompt_id[-5:]),
                   what="the mover's prompt picked in the timeline")
        wait_text(page, page.locator(".timeline-info .prompt-text"), last.prompt, timeout_s=30)

        # a row selected in the table (filtered to training step 2: the imported run's): the timeline
        # follows it to its prompt and step, and marks it in the step's list
        page.locator(".train-step select").select_option(label="step 2")
        wait_text(page, page.locator(".table-count"), f"{PER_STEP * GROUP} of", timeout_s=30)
        row = page.locator(".rollout-table .tabulator-row").nth(5)
        prompt = row.locator("[tabulator-field=prompt]").inner_text()
        row.click()
        wait_text(page, page.locator(".timeline-info .prompt-text"), prompt, timeout_s=30)
        page.wait_for_selector('.timeline-step-list table.steps[data-step="2"] tr.step-row.selected', timeout=30_000)
        assert chosen(page, ".timeline-step") == "step 2"
