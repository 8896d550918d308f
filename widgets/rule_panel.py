"""Reward rules: edit a rule, apply it to stored rollouts in the sandbox, see what changed.

Top: the Python editor (line numbers, highlighting; problems found by parsing are marked
at their line) as wide as a rule's lines need, with Check / Apply / Cancel and their result
right above it, and the rule's name, note, scope and reward-model inputs beside it (below it
when the page is too narrow for both). Below: any two versions compared: reward
distributions before and after, a summary whose counts pick what the list shows (changed
rewards, advantage sign flips, groups whose all-equal state changed, one component's
changes), and the list itself with identical changes folded into one counted line
(:mod:`studio.rewards.diff_views`) that opens onto its rollouts. Clicking a rollout opens
it in the token strip. The rule code itself only ever runs in the sandbox's worker processes.
"""
from __future__ import annotations

import time

import panel as pn
import param

from sample_data import REWARD_MODEL_DIR
from studio.queries import lookups
from studio.rewards import diff_views, reward_models, rules
from studio.rewards.sandbox import RuleSourceError
from studio.store import StoreError

from .base.clickable import ClickableHTML
from .base.jobs import Job
from .base.lazy import LazyView
from .base.state import StudioState
from .base.style import CSS, banner, esc
from .rule_diff import CHANGES_CSS, DIFF_CSS, changes_html, reward_hist, summary_html

NO_RM = "none"
ANY = "any component"

SCOPES = {"all rollouts": "all", "the table's filter": "filter"}
STARTING_RULES = (rules.DEFAULT_SOURCE, rules.FREE_TEXT_SOURCE)  # what the editor starts with, per task
LATEST = "latest scoring of each rollout"
SHOW_LABELS = {"changed": "changed", "sign flips": "flips", "all-equal changed": "all_equal", "all": "all"}
"""The diff list's views (:data:`studio.rewards.diff_views.SHOWS`) as the tab names them."""
FIELD = 270  # width of a setting beside the editor


def pair_labels(labels: dict[str, str], a: str | None, b: str | None, store) -> tuple[str | None, str | None]:
    """The labels (of ``labels``: label → version id) for versions ``a`` and ``b``; where one is
    None, :func:`studio.rewards.rules.default_pair`'s, and B's for A when no pair shares rollouts
    (the views then ask for two different versions)."""
    by_id = {v: lab for lab, v in labels.items()}
    la, lb = by_id.get(a), by_id.get(b)
    if la is None or lb is None:
        da, db = rules.default_pair(store)
        la, lb = la or by_id.get(da) or by_id.get(db), lb or by_id.get(db)
    return la, lb


def pick_two(labels: dict[str, str], store, where: str = "in the Reward rules tab") -> str:
    """The line a comparison shows when A and B are one version: why, and what to do (apply a
    rule ``where``)."""
    if len(set(labels.values())) < 2:
        text = (f"Only one reward version is stored, so there is nothing to compare it with yet: apply a rule "
                f"{where} (or score with a reward model), then compare the two.")
    elif rules.default_pair(store)[0] is None:
        text = (f"No two reward versions have scored the same rollouts yet: apply a rule {where} to the rollouts "
                "a version scored, then compare the two.")
    else:
        text = "A and B are the same version: pick two different versions to compare."
    return banner("info", text)


class RulePanel(LazyView):
    """Edit, apply and compare reward rule versions."""

    state = param.ClassSelector(class_=StudioState, doc="Shared studio state.")
    rule_name = param.String(default="my-rule", doc="Name of the rule (the version id is name@hash).")
    note = param.String(default="", doc="Why this version: kept with it in the store.")
    scope = param.Selector(default="all rollouts", objects=list(SCOPES), doc="Which rollouts to re-score.")
    version_a = param.Selector(default=None, objects=[], allow_None=True, doc="Diff: before.")
    version_b = param.Selector(default=None, objects=[], allow_None=True, doc="Diff: after.")
    diff_show = param.Selector(default="changed", objects=SHOW_LABELS,
                               doc="Which rollouts the diff lists: changed reward, advantage sign flips, those of "
                                   "groups whose all-equal state changed, or all.")
    diff_component = param.Selector(default=ANY, objects=[ANY],
                                    doc="The diff lists only rollouts whose value of this reward component changed.")
    rm_folder = param.String(default=str(REWARD_MODEL_DIR), doc="A transformers sequence-classification folder.")
    rm_source = param.Selector(default=NO_RM, objects=[NO_RM], doc="The reward-model version the rule reads as ctx['rm'].")

    def __init__(self, can_run: bool = True, **params):
        super().__init__(**params)
        self._can_run = can_run
        self._labels: dict[str, str] = {}  # version label → version id
        self._d: rules.Diff | None = None  # the diff shown
        self._job = Job(on_running=self._applying)  # a rule applied in the sandbox, cancellable
        self._rm_job = Job(on_running=lambda on: setattr(self._rm_go, "disabled", on))  # a reward-model scoring
        self.editor = pn.widgets.CodeEditor(value=rules.default_source(self.scope_task()), language="python",
                                            theme="chrome", sizing_mode="stretch_width", height=340,
                                            css_classes=["rule-editor"], disabled=not can_run)
        self._check = pn.widgets.Button(name="Check", color="light", width=80, css_classes=["rule-check"])
        self._apply = pn.widgets.Button(name="Apply", color="primary", width=90, css_classes=["rule-apply"],
                                        disabled=not can_run)
        self._stop = pn.widgets.Button(name="Cancel", color="light", width=80, disabled=True,
                                       css_classes=["rule-cancel"])
        self._progress = pn.indicators.Progress(value=0, max=1, visible=False, width=220, bar_color="primary",
                                                height=14, margin=(14, 10))
        self._status = pn.pane.HTML("", stylesheets=[CSS, DIFF_CSS], sizing_mode="stretch_width",
                                    css_classes=["rule-status"])
        self._check.on_click(self._on_check)
        if can_run:  # browse-only sessions get no callback that could run rule code
            self._apply.on_click(self._on_apply)
            self._stop.on_click(lambda e: self._job.cancel())
        self._rm_go = pn.widgets.Button(name="Score with reward model", color="light", width=FIELD - 10,
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
        self._load = pn.widgets.Select(name="Load a stored version into the editor", options=[], width=FIELD)
        self._load.param.watch(self._on_load, "value")
        self._hist = pn.pane.HoloViews(None, sizing_mode="stretch_width", height=230)
        self._summary = ClickableHTML(object="", stylesheets=[CSS, CHANGES_CSS], sizing_mode="stretch_width",
                                      css_classes=["diff-head"])
        self._summary.on_click(self._on_click)
        self._diff = ClickableHTML(object="", stylesheets=[CSS, DIFF_CSS, CHANGES_CSS], sizing_mode="stretch_width",
                                   css_classes=["rule-diff"])
        self._diff.on_click(self._on_click)

        # the editor takes the width a rule's lines need (about 90 characters); the settings sit
        # beside it when the page has room for both, else below it, flowing across the width
        editor = pn.Column(pn.Row(self._check, self._apply, self._stop, self._progress), self._status, self.editor,
                           sizing_mode="stretch_width", styles={"flex": "1 1 720px", "min-width": "0"})
        settings = pn.FlexBox(
            pn.widgets.TextInput.from_param(self.param.rule_name, name="Rule name", width=FIELD,
                                            css_classes=["rule-name"]),
            pn.widgets.TextInput.from_param(self.param.note, name="Note", width=FIELD, css_classes=["rule-note"]),
            pn.widgets.Select.from_param(self.param.scope, name="Re-score", width=FIELD),
            self._load,
            pn.widgets.Select.from_param(self.param.rm_source, name="Rule reads ctx['rm'] from", width=FIELD,
                                         css_classes=["rm-source"]),
            pn.Column(pn.widgets.TextInput.from_param(self.param.rm_folder, name="Reward model folder", width=FIELD,
                                                      css_classes=["rm-folder"]), self._rm_go, width=FIELD + 10),
            flex_wrap="wrap", align_content="flex-start", styles={"flex": "1 1 290px", "min-width": "0"})
        pickers = pn.FlexBox(
            pn.widgets.Select.from_param(self.param.version_a, name="Version A (before)", width=320,
                                         css_classes=["version-a"]),
            pn.widgets.Select.from_param(self.param.version_b, name="Version B (after)", width=320,
                                         css_classes=["version-b"]),
            pn.Column(pn.Spacer(height=18), self._retrain), flex_wrap="wrap", sizing_mode="stretch_width")
        self._filters = pn.FlexBox(
            pn.widgets.RadioButtonGroup.from_param(self.param.diff_show, name="", button_type="light",
                                                   css_classes=["diff-show"]),
            pn.widgets.Select.from_param(self.param.diff_component, name="", width=200, css_classes=["diff-component"]),
            flex_wrap="wrap")
        views = pn.Column(self._summary, self._filters, styles={"flex": "1 1 420px", "min-width": "0"},
                          sizing_mode="stretch_width")
        self._hist_box = pn.Column(self._hist, styles={"flex": "1 1 380px", "min-width": "0"},
                                   sizing_mode="stretch_width")
        self._layout = pn.Column(
            pn.FlexBox(editor, settings, flex_wrap="wrap", sizing_mode="stretch_width"),
            pn.pane.HTML('<div class="section-title">Compare two versions</div>', stylesheets=[CHANGES_CSS],
                         sizing_mode="stretch_width"),
            pickers,
            pn.FlexBox(self._hist_box, views, flex_wrap="wrap", sizing_mode="stretch_width"),
            self._diff, sizing_mode="stretch_width")
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
        """Re-read the versions; A and B stay the versions they were (their labels carry counts that
        change), and open on :func:`studio.rewards.rules.default_pair` when they are not set."""
        picked = self._labels.get(self.version_a), self._labels.get(self.version_b)
        vs = rules.versions(self.state.store)
        self._labels = {f"{v.rule_version_id} · {v.rollouts} scored" + (f" · {v.note}" if v.note else ""):
                        v.rule_version_id for v in vs.itertuples()}
        labels = list(self._labels)
        a, b = pair_labels(self._labels, *picked, self.state.store)
        with param.parameterized.batch_call_watchers(self):
            self.param.version_a.objects = labels
            self.param.version_b.objects = labels
            self.version_a, self.version_b = a, b
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

    def _show_problems(self, problems, when: str = "") -> None:
        self.editor.annotations = [{"row": p.line - 1, "column": p.column, "text": p.message, "type": "error"}
                                   for p in problems]
        n = len(problems)
        self._status.object = (banner("error", f"✗ Check{when}: {n} problem{'s' * (n != 1)}, marked in the editor's "
                                               "margin") + "".join(banner("error", str(p)) for p in problems))

    def _on_check(self, event=None) -> bool:
        """Parse the rule (it never runs here) and say what was found; the time shows a repeated
        check did run."""
        when = f" at {time.strftime('%H:%M:%S')}"
        problems = rules.source_problems(self.editor.value or "")
        if problems:
            self._show_problems(problems, when)
            return False
        self.editor.annotations = []
        self._status.object = banner("ok", f"✓ Check{when}: no problems. The rule parses and defines reward(); "
                                           f"Apply runs it on {self.scope} in the sandbox.")
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
            self._status.object = banner("warn" if res.failed else "info", msg + "; compared below") + errs
            before = self._labels.get(self.version_b)
            st.refresh += 1  # re-reads versions; B becomes the new version, A what B was
            by_id = {v: lab for lab, v in self._labels.items()}
            with param.parameterized.batch_call_watchers(self):
                if before and before != res.rule_version_id:
                    self.version_a = by_id.get(before)
                self.version_b = by_id.get(res.rule_version_id)
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

    @param.depends("version_a", "version_b", "state.estimator", "state.kl_beta", "state.reference",
                   "state.gae_gamma", "state.gae_lam", "state.value_source", watch=True)
    def _render(self) -> None:
        if self._defer():  # a hidden tab: drawn when it is opened
            return
        a, b = self._labels.get(self.version_a), self._labels.get(self.version_b)
        self._d = None
        self._filters.visible = self._hist_box.visible = False  # shown again with a diff to draw
        if not a or not b or a == b:
            self._summary.object = pick_two(self._labels, self.state.store, "above") if a else '<div class="empty">No rule version yet.</div>'
            self._diff.object, self._hist.object = "", None
            return
        try:
            self._d = rules.diff(self.state.store, a, b, credit=self.state.credit())
        except StoreError as exc:
            self._summary.object, self._diff.object, self._hist.object = banner("error", str(exc)), "", None
            return
        comps = diff_views.component_changes(self._d)["component"].tolist()
        with param.parameterized.batch_call_watchers(self):
            self.param.diff_component.objects = [ANY, *comps]
            if self.diff_component not in comps:
                self.diff_component = ANY
        self._summary.object = summary_html(self._d)
        self._hist.object = reward_hist(self._d) if len(self._d.rows) else None
        self._filters.visible = self._hist_box.visible = bool(len(self._d.rows))
        self._draw()

    @param.depends("diff_show", "diff_component", watch=True)
    def _draw(self) -> None:
        """The list of changes for the view and component picked (the diff is not read again)."""
        if self._d is None:
            return
        component = None if self.diff_component == ANY else self.diff_component
        self._diff.object = changes_html(self._d, self.diff_show, component)

    def _on_click(self, kind: str, value: str) -> None:
        if kind == "open" and value:
            self.state.open_rollout(value)
        elif kind == "group" and value:
            self.state.group_id = value
        elif kind == "show" and value in diff_views.SHOWS:
            self.diff_show = value

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
