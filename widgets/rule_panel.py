"""Reward rules: edit a rule, apply it to stored rollouts in the sandbox, see what changed.

Left: a Python editor (line numbers, highlighting; problems found by parsing are marked
at their line), the rule's name and note, the scope, Check / Apply / Cancel and a
progress bar. Right: any two versions side by side: reward distributions before and
after, the rollouts whose reward changed (with advantage sign flips flagged) and the
groups that became or stopped being all-equal. Clicking a rollout opens it in the token
strip. The rule code itself only ever runs in the sandbox's worker processes.
"""
from __future__ import annotations

import numpy as np
import panel as pn
import param

from sample_data import REWARD_MODEL_DIR
from studio.queries import lookups
from studio.rewards import reward_models, rules
from studio.rewards.sandbox import RuleSourceError, check_source
from studio.store import StoreError

from .base.clickable import ClickableHTML
from .base.jobs import Job
from .base.lazy import LazyView
from .base.plots import holoviews, plot_opts
from .base.state import StudioState
from .base.style import CSS, banner, esc

NO_RM = "none"

DIFF_CSS = """
table.diff { border-collapse:collapse; width:100%; font-size:12px; }
table.diff th { text-align:left; color:#868e96; font-weight:600; font-size:11px; padding:2px 6px; }
table.diff td { padding:2px 6px; border-top:1px solid #f1f3f5; white-space:nowrap; }
table.diff tr.diff-row { cursor:pointer; } table.diff tr.diff-row:hover { background:#edf2ff; }
td.mono { font-family:'DejaVu Sans Mono', monospace; white-space:pre; }
.flip { color:#c92a2a; font-weight:700; }
pre.errs { background:#fff5f5; border:1px solid #ffa8a8; color:#a61e4d; padding:6px 8px; border-radius:6px;
           font-size:12px; white-space:pre-wrap; }
"""
SCOPES = {"all rollouts": "all", "the table's filter": "filter"}
STARTING_RULES = (rules.DEFAULT_SOURCE, rules.FREE_TEXT_SOURCE)  # what the editor starts with, per task
LATEST = "latest scoring of each rollout"


def _signed(x: float) -> str:
    return "–" if x is None or x != x else f"{x:+.3f}"


def diff_html(d: rules.Diff, limit: int = 40) -> str:
    """Summary, changed rollouts (click opens one) and all-equal changes of a diff."""
    if d.rows.empty:
        return '<div class="empty">No rollout is scored by both versions yet.</div>'
    s = (f'<div class="meta-line diff-summary"><span><b>{len(d.rows):,}</b> rollouts scored by both</span>'
         f'<span><b>{len(d.changed):,}</b> changed reward</span>'
         f'<span><b class="bad">{len(d.sign_flips):,}</b> advantage changed sign</span>'
         f'<span><b>{len(d.became_all_equal)}</b> groups became all-equal, <b>{len(d.stopped_all_equal)}</b> '
         f'stopped being</span><span>mean reward {d.rows["reward_a"].mean():.3f} → {d.rows["reward_b"].mean():.3f}</span></div>')
    rows = []
    for r in d.changed.head(limit).itertuples(index=False):
        flip = '<span class="flip">sign flip</span>' if r.sign_flip else ""
        rows.append(f'<tr class="diff-row" data-click="open" data-value="{esc(r.rollout_id)}">'
                    f'<td class="mono">{esc(r.prompt)}</td><td class="mono">{esc(r.completion[:48])}</td>'
                    f'<td>{r.reward_a:.3f} → <b>{r.reward_b:.3f}</b></td><td>{_signed(r.delta)}</td>'
                    f'<td>{_signed(r.advantage_a)} → {_signed(r.advantage_b)}</td><td>{flip}</td></tr>')
    table = ('<table class="diff"><tr><th>prompt</th><th>completion</th><th>reward A → B</th><th>Δ</th>'
             '<th>advantage A → B</th><th></th></tr>' + "".join(rows) + "</table>") if rows else \
        '<div class="empty">No reward changed.</div>'
    more = f'<div class="meta-line">first {limit} of {len(d.changed):,} changed, largest change first</div>' \
        if len(d.changed) > limit else ""
    groups = ""
    if len(d.became_all_equal) or len(d.stopped_all_equal):
        items = [f'<li>became all-equal: {esc(g.prompt)} <span class="link" data-click="group" '
                 f'data-value="{esc(g.group_id)}">open group</span></li>' for g in d.became_all_equal.head(8).itertuples()]
        items += [f'<li>stopped being all-equal: {esc(g.prompt)} <span class="link" data-click="group" '
                  f'data-value="{esc(g.group_id)}">open group</span></li>' for g in d.stopped_all_equal.head(8).itertuples()]
        groups = f'<ul style="font-size:12px;margin:4px 0">{"".join(items)}</ul>'
    return s + groups + table + more


def reward_hist(d: rules.Diff):
    """Reward distributions under A and B, overlaid."""
    hv = holoviews()
    lo = float(min(d.rows["reward_a"].min(), d.rows["reward_b"].min()))
    hi = float(max(d.rows["reward_a"].max(), d.rows["reward_b"].max()))
    hi = hi if hi > lo else lo + 1.0
    edges = np.linspace(lo, hi, 25)
    ca, _ = np.histogram(d.rows["reward_a"], edges)
    cb, _ = np.histogram(d.rows["reward_b"], edges)
    a = hv.Histogram((edges, ca), kdims=["reward"], vdims=["rollouts"], label="A").opts(alpha=0.45, color="#868e96")
    b = hv.Histogram((edges, cb), kdims=["reward"], vdims=["rollouts"], label="B").opts(alpha=0.55, color="#3b5bdb")
    return (a * b).opts(**plot_opts(title="Reward distribution, A (grey) and B (blue)", height=230, legend_position="top_right"))


class RulePanel(LazyView):
    """Edit, apply and compare reward rule versions."""

    state = param.ClassSelector(class_=StudioState, doc="Shared studio state.")
    rule_name = param.String(default="my-rule", doc="Name of the rule (the version id is name@hash).")
    note = param.String(default="", doc="Why this version: kept with it in the store.")
    scope = param.Selector(default="all rollouts", objects=list(SCOPES), doc="Which rollouts to re-score.")
    version_a = param.Selector(default=None, objects=[], allow_None=True, doc="Diff: before.")
    version_b = param.Selector(default=None, objects=[], allow_None=True, doc="Diff: after.")
    rm_folder = param.String(default=str(REWARD_MODEL_DIR), doc="A transformers sequence-classification folder.")
    rm_source = param.Selector(default=NO_RM, objects=[NO_RM], doc="The reward-model version the rule reads as ctx['rm'].")

    def __init__(self, can_run: bool = True, **params):
        super().__init__(**params)
        self._can_run = can_run
        self._job = Job(on_running=self._applying)  # a rule applied in the sandbox, cancellable
        self._rm_job = Job(on_running=lambda on: setattr(self._rm_go, "disabled", on))  # a reward-model scoring
        self.editor = pn.widgets.CodeEditor(value=rules.default_source(self.scope_task()), language="python",
                                            theme="chrome",
                                            sizing_mode="stretch_width", height=340, css_classes=["rule-editor"],
                                            disabled=not can_run)
        self._check = pn.widgets.Button(name="Check", color="light", width=80, css_classes=["rule-check"])
        self._apply = pn.widgets.Button(name="Apply", color="primary", width=90, css_classes=["rule-apply"],
                                        disabled=not can_run)
        self._stop = pn.widgets.Button(name="Cancel", color="light", width=80, disabled=True,
                                       css_classes=["rule-cancel"])
        self._progress = pn.indicators.Progress(value=0, max=1, visible=False, sizing_mode="stretch_width",
                                                bar_color="primary", height=14)
        self._status = pn.pane.HTML("", stylesheets=[CSS, DIFF_CSS], sizing_mode="stretch_width",
                                    css_classes=["rule-status"])
        self._check.on_click(self._on_check)
        if can_run:  # browse-only sessions get no callback that could run rule code
            self._apply.on_click(self._on_apply)
            self._stop.on_click(lambda e: self._job.cancel())
        self._rm_go = pn.widgets.Button(name="Score with reward model", color="light", width=190,
                                        css_classes=["rm-button"], disabled=not can_run)
        if can_run:
            self._rm_go.on_click(self._on_rm)
        self.on_retrain = None  # set by the app: (version id) -> None, opens the mini-run form with it
        self._retrain = pn.widgets.Button(name="Retrain with this rule", color="light", width=190,
                                          disabled=not can_run, css_classes=["retrain-button"],
                                          description="start a mini-run whose reward is Version B")
        if can_run:
            self._retrain.on_click(lambda e: self.on_retrain(self._labels[self.version_b])
                                   if self.on_retrain and self.version_b in self._labels else None)
        self._load = pn.widgets.Select(name="Load a stored version into the editor", options=[], width=330)
        self._load.param.watch(self._on_load, "value")
        self._hist = pn.pane.HoloViews(None, sizing_mode="stretch_width", height=240)
        self._diff = ClickableHTML(object="", stylesheets=[CSS, DIFF_CSS], sizing_mode="stretch_width",
                                   css_classes=["rule-diff"])
        self._diff.on_click(self._on_click)
        left = pn.Column(
            pn.Row(pn.widgets.TextInput.from_param(self.param.rule_name, name="Rule name", width=170,
                                                   css_classes=["rule-name"]),
                   pn.widgets.TextInput.from_param(self.param.note, name="Note", width=270, css_classes=["rule-note"])),
            pn.Row(pn.widgets.Select.from_param(self.param.scope, name="Re-score", width=170),
                   pn.widgets.Select.from_param(self.param.rm_source, name="Rule reads ctx['rm'] from", width=270,
                                                css_classes=["rm-source"])),
            pn.Row(pn.widgets.TextInput.from_param(self.param.rm_folder, name="Reward model folder", width=260,
                                                   css_classes=["rm-folder"]),
                   pn.Column(pn.Spacer(height=18), self._rm_go)),
            self._load, self.editor,
            pn.Row(self._check, self._apply, self._stop), self._progress, self._status,
            styles={"flex": "1 1 50%"}, sizing_mode="stretch_width")
        right = pn.Column(
            pn.Row(pn.widgets.Select.from_param(self.param.version_a, name="Version A (before)", width=250,
                                                css_classes=["version-a"]),
                   pn.widgets.Select.from_param(self.param.version_b, name="Version B (after)", width=250,
                                                css_classes=["version-b"]),
                   pn.Column(pn.Spacer(height=18), self._retrain)),
            self._hist, self._diff, styles={"flex": "1 1 50%"}, sizing_mode="stretch_width")
        self._layout = pn.Row(left, right, sizing_mode="stretch_width")
        self._refresh_versions()

    # -- the starting rule ------------------------------------------------------------------

    def scope_task(self) -> str:
        """The task of the shown scope: the table's run under "the table's filter", else the task
        most of the store's rollouts are of (arithmetic for an empty store)."""
        st = self.state
        run = st.table_filter.run_id if SCOPES[self.scope] == "filter" else None
        try:
            return lookups.scope_task(st.store, run) or "arithmetic"
        except StoreError:
            return "arithmetic"

    @param.depends("scope", "state.table_filter", watch=True)
    def _starting_rule(self) -> None:
        """An editor still holding a starting rule follows the scope's task (``default_source``);
        an edited rule is never replaced."""
        start = rules.default_source(self.scope_task())
        if self.editor.value != start and self.editor.value in STARTING_RULES:
            self.editor.value = start

    # -- versions -------------------------------------------------------------------------

    @param.depends("state.refresh", watch=True)
    def _refresh_versions(self) -> None:
        vs = rules.versions(self.state.store)
        self._labels = {f"{v.rule_version_id} · {v.rollouts} scored" + (f" · {v.note}" if v.note else ""):
                        v.rule_version_id for v in vs.itertuples()}
        labels = list(self._labels)
        a, b = self.version_a, self.version_b
        with param.parameterized.batch_call_watchers(self):
            self.param.version_a.objects = labels
            self.param.version_b.objects = labels
            if a not in labels:
                self.version_a = labels[1] if len(labels) > 1 else (labels[0] if labels else None)
            if b not in labels:
                self.version_b = labels[0] if labels else None
        self._load.options = ["", *labels]
        rms = [v for v in self._labels.values() if v.startswith("rm-")]
        self.param.rm_source.objects = [NO_RM, *rms]
        if self.rm_source not in self.param.rm_source.objects:
            self.rm_source = NO_RM
        self._render()

    def _on_load(self, event) -> None:
        vid = self._labels.get(event.new)
        if vid:
            src = rules.source_of(self.state.store, vid)
            if src and "def reward" in src:
                self.editor.value = src
                self.rule_name = vid.split("@")[0]
                self._status.object = banner("info", f"loaded {vid}: edit and apply to make a new version")
            else:
                self._status.object = banner("warn", f"{vid} is a built-in rule stored as a description; "
                                                     "its editable source is the default shown at start")

    # -- check and apply ------------------------------------------------------------------

    def _show_problems(self, problems) -> None:
        self.editor.annotations = [{"row": p.line - 1, "column": p.column, "text": p.message, "type": "error"}
                                   for p in problems]
        self._status.object = "".join(banner("error", str(p)) for p in problems)

    def _on_check(self, event=None) -> bool:
        problems = check_source(self.editor.value or "")
        if problems:
            self._show_problems(problems)
            return False
        self.editor.annotations = []
        self._status.object = banner("info", "the rule parses and defines reward(); Apply runs it in the sandbox")
        return True

    def _applying(self, on: bool) -> None:
        """A rule's apply starts (``on``) or ends: buttons and progress bar follow."""
        self._apply.disabled, self._stop.disabled = on or not self._can_run, not on
        if on:
            self._progress.value = 0
        self._progress.visible = on

    async def _on_apply(self, event=None) -> None:
        if not self._can_run or self._job.running or not self._on_check():
            return
        st = self.state
        with self._job.claim() as cancel:

            def progress(done: int, total: int) -> None:
                self._progress.max, self._progress.value = max(1, total), done

            scope = st.table_filter if SCOPES[self.scope] == "filter" else None
            try:
                res = await rules.apply_rule(st.store, self.editor.value, self.rule_name, self.note, scope=scope,
                                             on_progress=progress, cancel=cancel,
                                             sources={"rm": self.rm_source} if self.rm_source != NO_RM else None)
            except RuleSourceError as exc:
                self._show_problems(exc.problems)
                return
            except StoreError as exc:
                self._status.object = banner("error", str(exc))
                return
        if res.status in ("done", "unchanged"):
            msg = (f"{res.rule_version_id}: {res.scored:,} rollouts scored in {res.seconds:.1f} s"
                   if res.status == "done" else f"{res.rule_version_id}: {res.message}")
            errs = ""
            if res.failed:
                msg += f"; the rule failed on {res.failed:,} (their reward is empty, with the error)"
                errs = "<pre class='errs'>" + esc("\n\n".join(f"{rid}:\n{m}" for rid, m in res.errors)) + "</pre>"
            self._status.object = banner("warn" if res.failed else "info", msg) + errs
            before = self.version_b
            st.refresh += 1  # re-reads versions; B becomes the new version, A what B was
            new = next((lab for lab, v in self._labels.items() if v == res.rule_version_id), None)
            with param.parameterized.batch_call_watchers(self):
                if before and before != new:
                    self.version_a = before
                self.version_b = new
            self._render()
        else:
            self._status.object = banner("error" if res.status == "failed" else "warn", res.message or res.status)

    async def _on_rm(self, event=None) -> None:
        """Score the scope with the reward model: a version of its own (rm-<folder>@<hash>)."""
        if not self._can_run:
            return
        with self._rm_job.claim():
            self._status.object = banner("info", f"scoring with the reward model in {self.rm_folder}…")
            scope = self.state.table_filter if SCOPES[self.scope] == "filter" else None
            try:
                res = await reward_models.score_with_reward_model(self.state.store, self.rm_folder, scope=scope)
            except Exception as exc:  # a missing folder, an unloadable model, a dead worker: say which
                self._status.object = banner("error", f"could not score with the reward model: {exc}")
                return
        self._status.object = banner("info", f"{res.rule_version_id}: " + (
            f"{res.scored:,} rollouts scored in {res.seconds:.1f} s" if res.status == "done" else (res.message or "")))
        self.state.refresh += 1
        self.rm_source = res.rule_version_id

    # -- diff -----------------------------------------------------------------------------

    @param.depends("version_a", "version_b", watch=True)
    def _render(self) -> None:
        if self._defer():  # a hidden tab: drawn when it is opened
            return
        a, b = self._labels.get(self.version_a), self._labels.get(self.version_b)
        if a and a == b:
            self._diff.object, self._hist.object = '<div class="empty">Pick two different versions to compare.</div>', None
            return
        if not a or not b:
            self._diff.object, self._hist.object = '<div class="empty">Apply a rule to compare versions.</div>', None
            return
        try:
            d = rules.diff(self.state.store, a, b)
        except StoreError as exc:
            self._diff.object = banner("error", str(exc))
            return
        self._diff.object = diff_html(d)
        self._hist.object = reward_hist(d) if len(d.rows) else None

    def _on_click(self, kind: str, value: str) -> None:
        if kind == "open" and value:
            self.state.open_rollout(value)
        elif kind == "group" and value:
            self.state.group_id = value

    def __panel__(self):
        return self._layout


def version_picker(state: StudioState) -> pn.widgets.Select:
    """Sidebar select: which rule version's rewards every view shows."""
    sel = pn.widgets.Select(name="Rewards shown from", options=[LATEST], value=LATEST, sizing_mode="stretch_width",
                            css_classes=["version-shown"])
    ids: dict[str, str] = {}
    versions = state.fresh_read(("rule_versions",), lambda: rules.versions(state.store))

    def refresh(*_):
        ids.clear()
        ids.update({f"{v.rule_version_id} ({v.rollouts})": v.rule_version_id for v in versions().itertuples()})
        current = sel.value
        sel.options = [LATEST, *ids]
        if current not in sel.options:
            sel.value = LATEST

    def pick(event):
        vid = ids.get(event.new, "")
        if vid != state.rule_version:
            state.rule_version = vid
            state.refresh += 1

    refresh()
    sel.param.watch(pick, "value")
    state.param.watch(refresh, "refresh")
    return sel

