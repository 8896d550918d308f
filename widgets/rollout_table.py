"""Rollout table: filter by run, prompt, correctness, reward range and training step (and, in a store
with agent trajectories, by number of turns, tool used and tool failures); page through the rows, newest first; select a row to open it in the token strip and its group in the
group view. The row of the rollout the page shows (``state.rollout_id``) is selected whenever it
is on the page shown, however it was opened.

What RL needs fits the table card without a horizontal scroll (~470 px with the sidebar open on a
1280 px screen): prompt, completion, *reward*, *adv.* (advantage), *ok* (✓ / ✗), *len* (tokens)
and *fork* (a branch's fork position, ``↳ 14``; blank for a sampled rollout, so branches differ
from their parents at a glance). In a store with agent trajectories a *turns* column adds each
row's turns, tool calls and failed calls (``3·2⚙·1✗``).

Correctness (the *ok* column and the correctness filter) is the rollout's own
(``rollouts.correct``: its task's check of the final answer, or an import's correctness field;
blank when there is no gold answer), never read from a reward version. The line above the rows
names the rule versions the page's rewards come from. A reward range or a sort by reward reads one
version (``queries.table.reward_source``): under "latest scoring", the newest that scored the
rows, and when the rows hold rewards of several versions a note above the table names them.

Paged in the store: the widget holds one page of rows (``PAGE_SIZE``), read with its filter
by ``queries.rollout_table_counted`` at the page's offset, with the filter's row count where that
read scored every row (else ``queries.rollout_table_count``, from the rollouts alone). A page
opens, refreshes and takes a click in the same time on a 5,000-rollout store as on a million."""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import pandas as pd
import panel as pn
import param
from bokeh.models.widgets.tables import NumberFormatter

from studio import queries
from studio.queries.lookups import train_steps
from studio.queries.mismatch import has_recomputed
from studio.queries.turns import has_trajectories, tools_used
from studio.store import StoreError

from . import mismatch_columns as mm
from .base.pickers import run_labels
from .base.state import StudioState
from .base.style import CSS, banner, esc
from .table_rows import COLUMNS, as_shown, versions_line

ALL_RUNS = "All runs"
ALL_STEPS = "all steps"
ANY_TOOL = "any tool"
TOOL_FAILURES = {"all": None, "some failed": True, "none failed": False}  # label -> RolloutFilter.tool_errors
PAGE_SIZE = 18  # rows per page: what the table's height shows without scrolling
HOLD_S = 30.0  # after a row click, rows arriving from elsewhere wait behind a button this long (see arrivals)
# header titles short enough for their columns; the fixed widths (px) leave the completion the rest of the card
TITLES = {"reward": "reward", "advantage": "adv.", "correct": "ok", "n_tokens": "len", "fork_pos": "fork"}
WIDTHS = {"prompt": 74, "turns": 62, "reward": 70, "advantage": 58, "correct": 38, "n_tokens": 44, "fork_pos": 50}
# the sort arrow sits in the header's right padding: a narrow one, so a short title is never cut; rows of 28 px,
# so a page's 18 rows show without a vertical scroll either
TABLE_CSS = (":host .tabulator { font-size: 13px; } :host .tabulator-col-title { font-size: 12px; }"
             " :host .tabulator-col-content { padding: 6px 4px !important; }"
             " :host .tabulator-col.tabulator-sortable .tabulator-col-title { padding-right: 12px !important; }"
             " :host .tabulator-col-sorter { right: 0 !important; }"
             " :host .tabulator-row { min-height: 28px !important; } :host .tabulator-cell { padding: 4px !important; }"
             " :host .tabulator-placeholder-contents { font-size: 13px; color: #495057; }"
             # a cut prompt or completion ends in an ellipsis (on the text's own box, which Panel wraps in
             # the cell), clear of the number beside it
             " :host .tabulator-cell > div { overflow: hidden; text-overflow: ellipsis; }"
             " :host .tabulator-cell[tabulator-field=completion] { padding-right: 10px !important; }"
             " :host .tabulator-cell[tabulator-field=turns] { font-size: 12px; }")


class RolloutTable(pn.viewable.Viewer):
    """The filterable table of stored rollouts."""

    state = param.ClassSelector(class_=StudioState, doc="Shared studio state.")
    run = param.Selector(default=ALL_RUNS, objects=[ALL_RUNS], doc="Only rollouts of this run.")
    prompt_contains = param.String(default="", doc="Only prompts containing this text (case-insensitive).")
    correctness = param.Selector(default="all", objects=["all", "correct", "incorrect"],
                                 doc="Final-answer correctness of the rollout (its task's check; no reward version).")
    min_turns = param.Integer(default=1, bounds=(1, None),
                              doc="Agent trajectories of at least this many turns (a single answer is one).")
    tool = param.Selector(default=ANY_TOOL, objects=[ANY_TOOL], doc="Trajectories that called this tool.")
    tool_failures = param.Selector(default="all", objects=list(TOOL_FAILURES),
                                   doc="Trajectories with at least one failed tool call, or with none.")
    reward_range = param.Range(default=(0.0, 1.5), bounds=(0.0, 1.5),
                               doc="Total reward between these values, under one rule version (the note says which).")
    page = param.Integer(default=1, bounds=(1, None), doc="The page of rows shown (newest first).")
    min_abs_delta = param.Number(default=0.0, bounds=(0.0, None), step=0.1,
                                 doc="Rollouts whose largest |Δ| is at least this (0: no constraint).")
    rejected_only = param.Boolean(default=False, doc="Only rollouts the sidebar's sequence-level correction rejects.")

    def __init__(self, **params):
        super().__init__(**params)
        self._run_ids: dict[str, str] = {}
        self._steps: tuple[tuple, list[int]] | None = None  # (run id, refresh) -> its training steps
        self._table = pn.widgets.Tabulator(
            pd.DataFrame(columns=COLUMNS),  # filled by _refresh_choices below
            selectable=1, show_index=False, disabled=True,
            sizing_mode="stretch_width", height=560, layout="fit_columns",
            hidden_columns=["rollout_id", "group_id", "turns", *mm.MM_COLUMNS], titles={**TITLES, **mm.MM_TITLES},
            widths={**WIDTHS, **mm.MM_WIDTHS},
            formatters={"reward": NumberFormatter(format="0.000"), "advantage": NumberFormatter(format="+0.000"),
                        "correct": {"type": "tickCross", "allowEmpty": True}, **mm.MM_FORMATTERS},
            # no cell tooltips: Tabulator writes a tooltip's text as HTML, and a completion is model output
            # (tests/ui/test_app.py's hostile rows); a row's whole text is one click away, in the token strip
            configuration={"placeholder": "no rollouts match", "rowHeight": 28, "columnDefaults": {"minWidth": 30},
                           # the page sorted in the browser as the store sorts every row: by the number of turns
                           "columns": [{"field": "turns", "sorter": "alphanum"}, *mm.MM_SORT_CONFIG]},
            stylesheets=[TABLE_CSS], header_align="left", css_classes=["rollout-table"],
        )
        self._count = pn.pane.HTML("", margin=(0, 10), css_classes=["table-count"])
        # rows from elsewhere held while a person clicks through the page (see arrivals): this shows them
        self._show_new = pn.widgets.Button(name="", color="primary", height=30, margin=(2, 10), visible=False,
                                           css_classes=["show-new-rows"])
        self._show_new.on_click(lambda _: self._load_page(held=False))
        self._clicked_at = float("-inf")  # when a row was last clicked (time.monotonic)
        self._arriving = False  # a refresh for rows from elsewhere is under way
        self._shown_rows = 0  # the filter's row count when the rows shown were read
        self._note = pn.pane.HTML("", margin=(0, 10), css_classes=["table-versions"], visible=False,
                                  stylesheets=[CSS])
        self._newer = pn.widgets.Button(name="‹ newer", color="light", width=80, height=30,
                                        css_classes=["page-newer"], disabled=True)
        self._older = pn.widgets.Button(name="older ›", color="light", width=80, height=30,
                                        css_classes=["page-older"], disabled=True)
        self._page_input = pn.widgets.IntInput.from_param(self.param.page, name="", width=80, height=30,
                                                         margin=(5, 4), css_classes=["page-number"])
        self._pages = pn.pane.HTML("", margin=(10, 4), css_classes=["page-count"])
        self._newer.on_click(lambda _: self._turn(-1))
        self._older.on_click(lambda _: self._turn(+1))
        self._pager = pn.Row(pn.layout.HSpacer(), self._newer, self._page_input, self._pages, self._older,
                             sizing_mode="stretch_width", css_classes=["table-pager"])
        # the training steps of the picked run (hidden when it has none), by label ("step 3") -> step (None: all)
        self._step_of: dict[str, int | None] = {ALL_STEPS: None}
        self._step_pick = pn.widgets.Select(name="Training step", options=[ALL_STEPS], value=ALL_STEPS,
                                            sizing_mode="stretch_width", css_classes=["train-step"], visible=False)
        self._step_pick.param.watch(self._on_step_pick, "value")
        self._n_rows = self._total = 0  # rows under the filter (over all pages), rollouts in the store
        self._counted: tuple | None = None  # what they were counted for: filter, scoring and refresh (_counts_key)
        self._sort: tuple[str, bool] | None = None  # (column, descending); None: newest first
        self._slider = pn.widgets.EditableRangeSlider.from_param(self.param.reward_range, name="Reward",
                                                                 step=0.05, sizing_mode="stretch_width")
        # shown only when the store holds agent trajectories (as is the table's turns column)
        self._trajectory_filters = pn.Column(
            pn.widgets.IntInput.from_param(self.param.min_turns, name="Turns (at least)", sizing_mode="stretch_width"),
            pn.widgets.Select.from_param(self.param.tool, name="Tool used", sizing_mode="stretch_width"),
            pn.widgets.RadioButtonGroup.from_param(self.param.tool_failures, name="Tool failures", color="light",
                                                   sizing_mode="stretch_width"),
            visible=False, sizing_mode="stretch_width", margin=0, css_classes=["trajectory-filters"])
        # shown only when the store holds recomputed log-probs (as is the sidebar's Mismatch card)
        self._mismatch_filters = pn.Row(
            pn.widgets.FloatInput.from_param(self.param.min_abs_delta, name="max |Δ| at least", width=130,
                                             css_classes=["mm-min-delta"]),
            pn.widgets.Checkbox.from_param(self.param.rejected_only, name="rejected only", margin=(28, 10, 0, 10),
                                           css_classes=["mm-rejected-only"]),
            visible=False, sizing_mode="stretch_width", margin=0, css_classes=["mismatch-filters"])
        self._table.param.watch(self._on_select, "selection")
        self._table.param.watch(self._on_sort, "sorters")  # a header click: the store sorts every row, not the page
        self.controls = pn.Column(
            pn.widgets.Select.from_param(self.param.run, name="Run", sizing_mode="stretch_width"),
            pn.widgets.TextInput.from_param(self.param.prompt_contains, name="Prompt contains",
                                            placeholder="e.g. 48-7", sizing_mode="stretch_width"),
            pn.widgets.RadioButtonGroup.from_param(self.param.correctness, name="Correctness",
                                                   color="light", sizing_mode="stretch_width"),
            self._slider,
            self._step_pick,
            self._trajectory_filters,
            self._mismatch_filters,
            pn.widgets.TextInput.from_param(self.state.param.branches_of, name="Branches of rollout",
                                            placeholder="rollout id (set from the fork panel)",
                                            sizing_mode="stretch_width", css_classes=["branches-of"]),
            sizing_mode="stretch_width",
        )
        self._layout = pn.Column(self._count, self._show_new, self._note, self._table, self._pager,
                                 sizing_mode="stretch_width")
        self._updating_choices = False
        self._selecting = False  # the table's selection is being set here, not clicked
        self.state.add_preloader(self._preload)
        self._refresh_choices()

    @param.depends("state.refresh", "state.channel", watch=True)  # the channel: the mismatch columns or not
    def _refresh_choices(self) -> None:
        """Update run choices and reward bounds from the store, then load the table once
        (the filter changes made here do not each trigger a reload)."""
        self._updating_choices = True
        try:
            self._update_choices()
        finally:
            self._updating_choices = False
        self._reload()

    def _preload(self, rollout_id: str, group_id: str, found: dict, fresh: bool) -> None:
        """After new rows (on a thread: see StudioState.stored): the run choices, reward bounds,
        the table's rows under its filter and the store's count."""
        if not fresh:
            return
        st = self.state
        found[("run_labels",)] = self._run_labels()
        found[("reward_bounds",)] = queries.reward_bounds(st.store)
        run_id = self._run_ids.get(self.run)
        found[("train_steps", run_id)] = train_steps(st.store, run_id)
        found[("trajectories",)] = self._trajectories()
        f = self.current_filter()
        key = self._rows_key(f, self.page)
        found[key] = rows, n_rows = self._read(key)
        found[("page_groups",)] = list(dict.fromkeys(rows["group_id"]))  # for the group view's picker
        ckey = self._counts_key(f, st.refresh + 1)  # as it will be once the rows are shown
        found[ckey] = self._read_counts(ckey, n_rows)

    def _has_recomputed(self) -> bool:
        return bool(self.state.preloaded(("has_recomputed",), lambda: has_recomputed(self.state.store)))

    def _mismatch_shown(self) -> bool:
        """Whether the mismatch columns stand in for reward, advantage, ok, length and fork (mismatch_columns)."""
        return self.state.channel == "mismatch" and self._has_recomputed()

    def _rows_key(self, f: queries.RolloutFilter, page: int) -> tuple:
        return ("rollout_table", f, self.state.rule_version or None, self.state.credit(), page, self._sort,
                self._mismatch_shown())

    def _read(self, key: tuple) -> tuple[pd.DataFrame, int | None]:
        """Page ``page`` of the rows under filter ``f``, in the order ``sort``, and how many rows the
        filter keeps where the page's read counted them (``queries.rollout_table_counted``); with the
        mismatch columns when shown."""
        _, f, rule_version, cr, page, sort, mismatch = key
        rows, n_rows = queries.rollout_table_counted(self.state.store, replace(f, limit=PAGE_SIZE), rule_version, cr,
                                                     offset=(page - 1) * PAGE_SIZE, sort=sort)
        shown = as_shown(rows)
        if mismatch:
            shown = mm.with_mismatch_columns(self.state.store, shown, f.mismatch_source, f.correction)
        return shown, n_rows

    def _counts_key(self, f: queries.RolloutFilter, refresh: int) -> tuple:
        return ("table_counts", f, self.state.rule_version or None, self.state.credit(), refresh)

    def _read_counts(self, key: tuple, n_rows: int | None = None) -> tuple[int, int]:
        """How many rows filter ``f`` keeps (``n_rows`` when the page's read counted them: under a
        reward filter a count of its own would score the scope again), and how many rollouts the
        store has: once per filter, scoring and refresh, not per page."""
        _, f, rule_version, cr, _ = key
        if n_rows is None:
            n_rows = queries.rollout_table_count(self.state.store, f, rule_version, cr)
        return n_rows, queries.rollout_count(self.state.store)

    def _run_labels(self) -> dict[str, str]:
        """Label -> run id of every run, as the run picker lists them (the run labels preloaded under ``("run_labels",)``)."""
        return run_labels(queries.runs(self.state.store))

    def _trajectories(self) -> tuple[bool, list[str]]:
        """Whether the store holds agent trajectories, and the tools they called."""
        store = self.state.store
        return (True, tools_used(store)) if has_trajectories(store) else (False, [])

    def _update_choices(self) -> None:
        st = self.state
        any_trajectory, tools = st.preloaded(("trajectories",), self._trajectories)
        if [ANY_TOOL, *tools] != self.param.tool.objects:
            self.param.tool.objects = [ANY_TOOL, *tools]
        if self.tool not in self.param.tool.objects:
            self.tool = ANY_TOOL
        self._trajectory_filters.visible = any_trajectory
        self._mismatch_filters.visible = self._has_recomputed()
        hidden = ["rollout_id", "group_id"] + ([] if any_trajectory else ["turns"]) + (
            mm.REPLACED + ["turns"] if self._mismatch_shown() else mm.MM_COLUMNS)
        if hidden != self._table.hidden_columns:
            self._table.hidden_columns = hidden
        current = self._run_ids.get(self.run)
        labels = st.preloaded(("run_labels",), self._run_labels)
        if labels != self._run_ids:  # the same runs: the picker's options are not sent again
            self._run_ids = labels
            self.param.run.objects = [ALL_RUNS, *labels]
        # the picked run stays picked when its count (in its label) grows: a tailed or running import
        self.run = next((k for k, v in self._run_ids.items() if v == current), ALL_RUNS)
        lo, hi = st.preloaded(("reward_bounds",), lambda: queries.reward_bounds(st.store))
        lo, hi = min(lo, 0.0), max(hi, lo + 0.1)
        at_bounds = tuple(self.reward_range) == tuple(self.param.reward_range.bounds)
        # the widget's own limits first: it checks a new value against them (a rule can make
        # rewards negative, below the old lower bound)
        self._slider.param.update(fixed_start=lo, fixed_end=hi, start=lo, end=hi)
        self.param.reward_range.bounds = (lo, hi)
        if at_bounds or not (lo <= self.reward_range[0] <= self.reward_range[1] <= hi):
            self.reward_range = (lo, hi)

    def _steps_of(self, run_id: str | None) -> list[int]:
        """The training steps of ``run_id`` (of every run: None), read once per run and refresh."""
        key = (run_id, self.state.refresh)
        if self._steps is None or self._steps[0] != key:
            self._steps = key, self.state.preloaded(("train_steps", run_id), lambda: train_steps(self.state.store, run_id))
        return self._steps[1]

    def _sync_steps(self) -> None:
        """Offer the picked run's training steps, the state's step picked; hidden when the run has
        none and no step is picked (a step the run lacks stays offered while picked: its rows are none)."""
        steps = self._steps_of(self._run_ids.get(self.run))
        step = self.state.train_step
        if step is not None and step not in steps:
            steps = sorted([*steps, step])
        self._step_of = {ALL_STEPS: None, **{f"step {s}": s for s in steps}}
        options, picked = list(self._step_of), ALL_STEPS if step is None else f"step {step}"
        self._updating_choices = True
        try:
            with pn.io.hold():
                if options != self._step_pick.options:
                    self._step_pick.options = options
                self._step_pick.param.update(value=picked, visible=len(options) > 1)
        finally:
            self._updating_choices = False

    def _on_step_pick(self, event) -> None:
        step = self._step_of.get(event.new)
        if not self._updating_choices and step != self.state.train_step:
            self.state.train_step = step

    def current_filter(self) -> queries.RolloutFilter:
        lo, hi = self.reward_range
        blo, bhi = self.param.reward_range.bounds
        return queries.RolloutFilter(
            run_id=self._run_ids.get(self.run),
            prompt_contains=self.prompt_contains or None,
            correct={"all": None, "correct": True, "incorrect": False}[self.correctness],
            reward_min=None if lo <= blo else lo, reward_max=None if hi >= bhi else hi,
            branches_of=self.state.branches_of.strip() or None,
            train_step=self.state.train_step,
            min_turns=self.min_turns if self.min_turns > 1 else None,
            tool=None if self.tool == ANY_TOOL else self.tool,
            tool_errors=TOOL_FAILURES[self.tool_failures],
            mismatch_source=self.state.mismatch_source, correction=mm.sequence_correction(self.state.correction()),
            min_max_abs_delta=self.min_abs_delta or None, rejected_only=self.rejected_only,
        )

    @param.depends("state.jump_run", watch=True)
    def _jump(self) -> None:
        """Show the run a view asked for (e.g. a point on a mini-run curve)."""
        label = next((k for k, v in self._run_ids.items() if v == self.state.jump_run), None)
        if label is None:
            self._refresh_choices()
            label = next((k for k, v in self._run_ids.items() if v == self.state.jump_run), None)
        if label is not None:
            self.run = label

    @param.depends("run", "prompt_contains", "correctness", "min_turns", "tool", "tool_failures", "reward_range",
                   "state.branches_of", "state.estimator",
                   "state.kl_beta", "state.reference", "state.gae_gamma", "state.gae_lam", "state.value_source",
                   "state.train_step", "min_abs_delta", "rejected_only", "state.mismatch_source", "state.mm_method",
                   "state.mm_cap", "state.mm_low", "state.mm_threshold", watch=True)
    def _reload(self) -> None:
        """The filter or the scoring changed (or new rows came): show the filter's rows, from its
        first page when the filter itself changed."""
        if self._updating_choices:
            return
        self._sync_steps()
        f = self.current_filter()
        changed = f != self.state.table_filter
        if changed:  # param calls an equal new filter a change: views would redraw for nothing
            self.state.table_filter = f
        if changed and self.page != 1:
            self.page = 1  # loads it (_load_page)
        else:
            self._load_page()

    def _on_sort(self, event) -> None:
        """Sort every row under the filter by the clicked column (the browser sorts only the page it
        has, the same way, so the two agree), from the first page."""
        by = next((s for s in event.new or [] if s.get("field") in queries.TABLE_SORTS), None)
        sort = None if by is None else (by["field"], by.get("dir") == "desc")
        if sort == self._sort:
            return
        self._sort = sort
        if self.page != 1:
            self.page = 1
        else:
            self._load_page()

    def _turn(self, step: int) -> None:
        self.page = min(max(1, self.page + step), self._n_pages())

    def _n_pages(self) -> int:
        return max(1, -(-self._n_rows // PAGE_SIZE))

    @contextmanager
    def arrivals(self):
        """Rows stored elsewhere (another process, a watched folder) are being picked up. While a
        person clicks through the page (a row clicked in the last ``HOLD_S`` seconds) the rows shown
        stay where they are, the counts say how many came, and a button shows them: rows that
        moved under the pointer would open another rollout than the one aimed at."""
        self._arriving = True
        try:
            yield
        finally:
            self._arriving = False

    @param.depends("page", watch=True)
    def _load_page(self, held: bool = True) -> None:
        """Read and show the current page (the row of the shown rollout stays selected); rows from
        elsewhere wait behind the *show* button while a person clicks through the page (``held``)."""
        st = self.state
        f = st.table_filter
        key, ckey = self._rows_key(f, self.page), self._counts_key(f, st.refresh)
        try:
            df, n_rows = st.preloaded(key, lambda: self._read(key))
            if ckey != self._counted:
                self._n_rows, self._total = st.preloaded(ckey, lambda: self._read_counts(ckey, n_rows))
                self._counted = ckey
        except StoreError as exc:  # e.g. the query hit its time limit: say so, keep the page
            self._count.object = banner("error", str(exc))
            return
        if self.page > self._n_pages():  # rows went (a narrower scoring): the last page there is
            self.page = self._n_pages()
            return
        shown = self._table.value
        if (held and self._arriving and time.monotonic() - self._clicked_at < HOLD_S and len(shown)
                and df["rollout_id"].tolist() != shown["rollout_id"].tolist()):
            new = self._n_rows - self._shown_rows
            self._show_new.param.update(visible=True, name=f"{new:,} new rollout{'s' * (new != 1)} · show"
                                        if new > 0 else "rows changed · show")
            self._show_counts(shown)
            return
        self._show_new.visible = False
        self._shown_rows = self._n_rows
        self._selecting = True
        try:
            # the rows first, then the selection: Panel carries a held selection over to new rows by
            # reading the old rows at its positions, so a selection set together with the rows was read
            # against the old ones (an IndexError when they were fewer: a filter that had emptied the table)
            self._table.value = df
        finally:
            self._selecting = False
        self._select_shown(new_rows=True)
        groups = list(dict.fromkeys(df["group_id"]))
        if groups != self.state.page_groups:
            self.state.page_groups = groups
        self._show_counts(df)

    def _show_counts(self, df: pd.DataFrame) -> None:
        """The line above the rows (how many match, which rows are shown, whose rewards) and the pager."""
        n_pages = self._n_pages()
        self._newer.disabled, self._older.disabled = self.page <= 1, self.page >= n_pages
        self._pages.object = (f'<span style="font-size:13px;color:#495057">of {n_pages:,} '
                              f'page{"s" if n_pages > 1 else ""}</span>')
        self._pager.visible = self._n_rows > 0  # an empty table says so itself ("no rollouts match")
        first = (self.page - 1) * PAGE_SIZE
        parts = [f"<b>{self._n_rows:,}</b> of {self._total:,} rollouts match"]
        if len(df):
            parts.append(f"rows <b>{first + 1:,}–{first + len(df):,}</b> shown")
            parts.append(f'<span class="reward-versions">{esc(versions_line(df.attrs.get("versions", ())))}</span>')
        self._count.object = f'<span style="font-size:12px;color:#495057">{" · ".join(parts)}</span>'
        note = df.attrs.get("versions_note")
        self._note.param.update(object=banner("warn", note) if note else "", visible=bool(note))

    @param.depends("state.rollout_id", watch=True)
    def _select_shown(self, new_rows: bool = False) -> None:
        """Select the row of the rollout the page shows when it is on the page shown, else none.

        ``new_rows``: the rows were just replaced. When the shown rollout is not among them, Panel has
        already emptied the selection here, but the browser still holds its old one over the new rows
        (a row at the old position counts as selected there, and the first click on it was lost: a
        filter that dropped the shown row, then a click on a row, opened nothing); a selection made and
        cleared brings the browser's in line."""
        df = self._table.value
        rid = self.state.rollout_id
        rows = [int(i) for i in np.flatnonzero(df["rollout_id"].to_numpy() == rid)[:1]] if rid else []
        resync = new_rows and not rows and len(df) > 0
        if rows == self._table.selection and not resync:
            return
        self._selecting = True
        try:
            if resync:
                self._table.selection = [0]
            self._table.selection = rows
        finally:
            self._selecting = False

    def _on_select(self, event) -> None:
        """A row clicked: open its rollout (the last click wins, even back to the shown row). A click
        that selects no row shown (the shown row clicked off, a row of rows since replaced) leaves
        the rollout shown, and its row selected."""
        if self._selecting:
            return
        self._clicked_at = time.monotonic()
        if not event.new or event.new[0] >= len(self._table.value):
            self._select_shown()
            return
        row = self._table.value.iloc[event.new[0]]
        self.state.select(row["rollout_id"], row["group_id"])

    def __panel__(self):
        return self._layout

