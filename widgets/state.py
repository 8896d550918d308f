"""The state every view of one browser session shares: store, selection, channel, filters.

Views depend on these parameters; changing one (selecting a row, picking a channel,
finishing a Generate) re-renders exactly the views that show it.

A click on a rollout in a served page reads first, then shows (:meth:`StudioState.select`):
each view registers a *preloader* that does its store reads for the new selection on a
thread, and its redraw then finds them (:meth:`StudioState.preloaded`). The event loop, which
serves every open page of the process, meanwhile answers other sessions: DuckDB lets go of
the GIL while it reads.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import panel as pn
import param

from studio import queries
from studio.queries import RolloutFilter, lookups
from studio.signals.advantages import ESTIMATORS, Credit
from studio.signals.forks import DEFAULT_Q, SCOPES, ForkRule
from studio.signals.steps import AGGREGATES, SEGMENTERS, Segmenter
from studio.store import Store
from widgets import page_gc
from widgets.style import CHANNELS

# The threads every session's selections read on. Four: a click's reads spend most of their time in
# DuckDB, without the GIL, so with two, twenty pages' clicks queued for a thread while a core sat idle
# (benchmarks/bench_load.py, N=20: p95 1.0-1.1 s with two, 0.67-0.79 s with four and one watchdog wake-up
# per deadline, not per read).
_PRELOAD = ThreadPoolExecutor(max_workers=4, thread_name_prefix="studio-preload")


class StudioState(param.Parameterized):
    store = param.ClassSelector(class_=Store, doc="The store this session reads and writes.")
    policy_path = param.String(default="", doc="Policy folder used by Generate.")
    rollout_id = param.String(default="", doc="The rollout shown in the token strip.")
    group_id = param.String(default="", doc="The group shown in the group view.")
    channel = param.Selector(default="entropy", objects=CHANNELS, doc="What colours the tokens.")
    refresh = param.Integer(default=0, doc="Bumped when new rollouts are stored, so views reload.")
    rule_version = param.String(default="", doc="Rule version whose rewards the views show ('' = each "
                                                  "rollout's most recent scoring).")
    fork_pos = param.Integer(default=-1, doc="The token of the shown rollout picked for branching (-1: none).")
    fork_mode = param.Selector(default="top share", objects=["top share", "absolute"],
                               doc="Forks are the top share of tokens by entropy, or tokens above a fixed entropy.")
    fork_q = param.Number(default=DEFAULT_Q, bounds=(0.01, 1.0), step=0.01,
                          doc="Share of tokens (by entropy) that are forks: TRL's top_entropy_quantile.")
    fork_abs = param.Number(default=0.5, bounds=(0.0, 10.0), step=0.05, doc="Absolute fork threshold, nats.")
    fork_scope = param.Selector(default="run", objects=list(SCOPES),
                                doc="Whose token entropies set the quantile: the rollout's run, its training "
                                    "step, or the rollouts the table's filter keeps.")
    branches_of = param.String(default="", doc="The table shows only branches (at any depth) of this rollout.")
    train_step = param.Integer(default=-1, doc="The table shows only this training step's rollouts (-1: all).")
    jump_run = param.String(default="", doc="Set to a run id to make the table show that run.")
    table_filter = param.ClassSelector(class_=RolloutFilter, default=RolloutFilter(),
                                       doc="The table's current filter (the 'filter' fork scope reads it).")
    page_groups = param.List(default=[], item_type=str,
                             doc="The groups of the rows on the table's page (the group view's picker offers them).")

    estimator = param.Selector(default="grpo", objects=list(ESTIMATORS),
                               doc="Advantage estimator every view shows (studio.signals.advantages.ESTIMATORS).")
    kl_beta = param.Number(default=0.05, bounds=(0.0, 10.0), step=0.01, doc="β of the KL penalty and implicit PRM.")
    reference = param.String(default="", doc="Reference policy version (stored teacher-forced log-probs).")
    gae_gamma = param.Number(default=1.0, bounds=(0.0, 1.0), step=0.01, doc="GAE discount γ.")
    gae_lam = param.Number(default=1.0, bounds=(0.0, 1.0), step=0.01, doc="GAE λ.")
    value_source = param.String(default="", doc="Critic whose per-token values GAE reads (stored in token_scores).")
    segmenter = param.Selector(default="task", objects=list(SEGMENTERS), doc="How completions split into steps.")
    step_pattern = param.String(default=";", doc="Delimiter, regex or tag name for the step segmentation.")
    step_source = param.String(default="", doc="Step rewards shown under the tokens ('' = none).")
    step_agg = param.Selector(default="min", objects=list(AGGREGATES), doc="Step rewards → outcome.")
    gate_tau = param.Number(default=1.0, bounds=(-10.0, 10.0), step=0.05,
                            doc="Gated accumulation: step rewards count only when the outcome ≥ τ.")

    def __init__(self, **params):
        super().__init__(**params)
        self._preloaders: list[Callable[[str, str, dict, bool], None]] = []
        self._preloaded: dict[Hashable, Any] = {}
        self._selecting: object | None = None

    def add_preloader(self, fn: Callable[[str, str, dict, bool], None]) -> None:
        """Register ``fn(rollout_id, group_id, found, fresh)``: it puts into ``found`` what its view
        will read when that rollout and group are shown (``fresh``: after new rows were stored, when
        every view reads again), under the keys the view asks :meth:`preloaded` for. It runs on a
        thread: store reads and pure computation only, no widget changes."""
        self._preloaders.append(fn)

    def fresh_read(self, key: Hashable, read: Callable[[], Any]) -> Callable[[], Any]:
        """A store read a view redraws from whenever new rows are stored (a picker's options, a count):
        after :meth:`stored` it has run on the preload thread, with the others, so the returned function
        gives what it read there; elsewhere (a first draw, a notebook) that function reads at once."""
        def preload(rollout_id: str, group_id: str, found: dict, fresh: bool) -> None:
            if fresh:
                found[key] = read()
        self.add_preloader(preload)
        return lambda: self.preloaded(key, read)

    def preloaded(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """What a preloader read under ``key`` for the update being shown, else ``compute()``."""
        return self._preloaded[key] if key in self._preloaded else compute()

    def select(self, rollout_id: str, group_id: str) -> None:
        """Show ``rollout_id`` and its group ``group_id`` (a click in the rollout table). In a
        served page the views' reads run on a thread first and the views then redraw from them, in
        one message; a later click replaces one still reading. Elsewhere (a notebook, a test), at once."""
        doc = pn.state.curdoc
        if doc is None or doc.session_context is None:
            with pn.io.hold():
                self.param.update(rollout_id=rollout_id, group_id=group_id)
            return
        self._selecting = ticket = object()
        page_gc.clicked()
        pn.state.execute(partial(self._apply, {"rollout_id": rollout_id, "group_id": group_id}, ticket))

    async def stored(self, **changes) -> None:
        """New rows are stored: bump ``refresh`` (with ``changes``, e.g. the group to show), every
        view's reads first run on a thread, then every view redraws, in one message."""
        await self._apply({"refresh": None, **changes}, None)

    async def _apply(self, changes: dict, ticket: object | None) -> None:
        rollout_id, group_id = changes.get("rollout_id", self.rollout_id), changes.get("group_id", self.group_id)
        fresh = "refresh" in changes
        found: dict[Hashable, Any] = {}

        def read() -> None:
            for preload in list(self._preloaders):
                try:
                    preload(rollout_id, group_id, found, fresh)
                except Exception:  # noqa: BLE001 - the view reads again as it redraws and shows the error in place
                    pass
        await asyncio.get_running_loop().run_in_executor(_PRELOAD, read)
        if ticket is not None and self._selecting is not ticket:  # a later click: its reads are under way
            return
        if fresh:
            changes["refresh"] = self.refresh + 1
        self._preloaded = found
        try:
            with pn.io.hold():  # every view's update reaches the page as one message
                self.param.update(**changes)
        finally:
            self._preloaded = {}

    def credit(self) -> Credit:
        return Credit(estimator=self.estimator, beta=float(self.kl_beta), reference=self.reference or None,
                      gamma=float(self.gae_gamma), lam=float(self.gae_lam), values=self.value_source or None)

    def segmentation(self) -> Segmenter:
        return Segmenter(self.segmenter, self.step_pattern)

    def fork_rule(self) -> ForkRule:
        return ForkRule(q=float(self.fork_q), absolute=float(self.fork_abs) if self.fork_mode == "absolute" else None,
                        scope=self.fork_scope)

    def open_rollout(self, rollout_id: str, pos: int | None = None) -> bool:
        """Show ``rollout_id`` in the token strip and its group in the group view (and pick
        token ``pos`` when given). False when the rollout is not in the store."""
        gid = lookups.group_of(self.store, rollout_id)
        if gid is None:
            return False
        self.param.update(rollout_id=rollout_id, group_id=gid)
        if pos is not None:
            self.fork_pos = pos
        return True


def run_choices(store: Store) -> dict[str, str]:
    """Label -> run id of every run with rollouts, as the run pickers show them (the id
    suffix keeps two runs with the same name apart)."""
    runs = queries.runs(store)
    return run_labels(runs[runs["rollouts"] > 0])


def run_labels(runs) -> dict[str, str]:
    """Label -> run id of each row of ``queries.runs`` (the id suffix keeps two runs with the same
    name and size apart)."""
    return {f"{name} ({n}) · {rid[-6:]}": rid for name, n, rid in zip(runs["name"], runs["rollouts"], runs["run_id"])}
