"""The "Preference data" tab: build pairs by rule, review them one by one, export what was
accepted in TRL's formats.

Three columns. *Build*: a pair rule over a scope of rollouts (the table's filter, a run, or
everything) under one reward version, stored as pending pairs (``studio.curation.build``).
*Review*: the queue, pending first, one pair at a time: the prompt (and, for a step pair,
the prefix both share), chosen and rejected side by side with their token strips and reward
components, accept / reject / swap / note / previous / next, with single-key shortcuts and
a progress bar; a stale pair (a rollout deleted or re-scored since) is flagged. Rollouts
selected in the table or the group view become a hand-picked pair in two clicks. *Export*:
format, style and file type, written by ``studio.curation.writer.export_bytes`` (provenance in the
store and in the file's sidecar) and offered as a download.
"""
from __future__ import annotations

import io
from pathlib import PurePath

import pandas as pd
import panel as pn
import param

from studio import curation, queries
from studio.configs import settings_of
from studio.curation.formats import FORMATS, STYLES
from studio.curation.provenance import exports
from studio.curation.writer import FILETYPES, export_download
from studio.queries import lookups

from .base.clickable import KeyShortcuts
from .base.lazy import LazyView
from .base.pickers import run_choices
from .base.state import StudioState
from .base.style import CSS, DIVIDER_HTML, SCALES, banner, esc
from .token_strip import strip_html

REVIEW_CSS = """
.pair-grid { display:grid; grid-template-columns:1fr 1fr; gap:10px; }
.pair-side { border:1px solid #dee2e6; border-radius:8px; padding:6px 8px; background:#fff; min-width:0; }
.pair-side.chosen { border-top:3px solid #2b8a3e; }
.pair-side.rejected { border-top:3px solid #c92a2a; }
.pair-side h4 { margin:0 0 4px 0; font-size:12px; letter-spacing:.04em; text-transform:uppercase; }
.pair-side.chosen h4 { color:#2b8a3e; } .pair-side.rejected h4 { color:#c92a2a; }
.pair-prompt { font-family:'DejaVu Sans Mono', monospace; font-size:13px; margin:2px 0 6px 0; }
.pair-prefix { color:#868e96; background:#f1f3f5; border-radius:3px; padding:0 2px; }
.comps { border-collapse:collapse; font-size:12px; margin-top:6px; font-variant-numeric:tabular-nums; }
.comps td { padding:1px 8px 1px 0; } .comps td.v { text-align:right; } .comps tr.total td { font-weight:700; }
.status-pill { display:inline-block; padding:0 7px; border-radius:9px; font-size:11px; font-weight:600; }
.status-pill.pending { background:#fff3bf; color:#8d6e00; } .status-pill.accepted { background:#d3f9d8; color:#2b8a3e; }
.status-pill.rejected { background:#ffe3e3; color:#c92a2a; }
.keys { font-size:11px; color:#868e96; } .keys kbd { border:1px solid #ced4da; border-bottom-width:2px;
  border-radius:3px; padding:0 4px; font-size:10px; background:#f8f9fa; color:#495057; }
table.exports { border-collapse:collapse; font-size:12px; width:100%; table-layout:fixed; }
table.exports td, table.exports th { padding:2px 6px; text-align:left; border-top:1px solid #f1f3f5; white-space:nowrap;
                                     overflow:hidden; text-overflow:ellipsis; }
table.exports th.when { width:94px; } table.exports th.format { width:78px; } table.exports th.rows { width:42px; }
table.exports th { color:#868e96; font-size:11px; }
"""
KEYS = {"a": "accept", "r": "reject", "s": "swap", "j": "next", "k": "previous"}
WRAP_BUTTON = ".bk-btn { white-space:normal; overflow-wrap:anywhere; height:auto; text-align:left; }"


def components_html(comps: dict[str, float | None]) -> str:
    """A rollout's reward components under the pair's version, total last and bold."""
    if not comps:
        return '<div class="empty">no rewards under this version</div>'
    rows = [(k, v) for k, v in comps.items() if k != "total"] + ([("total", comps["total"])] if "total" in comps else [])
    return '<table class="comps">' + "".join(
        f'<tr class="{"total" if k == "total" else ""}"><td>{esc(k)}</td>'
        f'<td class="v">{"–" if v is None or v != v else f"{v:.3f}"}</td></tr>' for k, v in rows) + "</table>"


class CurationPanel(LazyView):
    """Build, review and export preference pairs."""

    state = param.ClassSelector(class_=StudioState, doc="Shared studio state.")
    position = param.Integer(default=0, bounds=(0, None), doc="Index of the shown pair in the queue.")
    show = param.Selector(default="pending first", objects=["pending first", "pending", "accepted", "rejected"],
                          doc="Which pairs the queue walks through.")

    def __init__(self, **params):
        super().__init__(**params)
        self._queue = pd.DataFrame()
        self._picked: dict[str, str] = {}
        # -- build
        self._rule = pn.widgets.Select(name="pair rule", options=list(curation.RULES), value="best_vs_worst", width=200,
                                       css_classes=["pair-rule"], description=_doc("name"))
        self._level = pn.widgets.Select(name="level", options=list(curation.LEVELS), value="completion", width=110,
                                        css_classes=["pair-level"], description=_doc("level"))
        self._scope = pn.widgets.Select(name="rollouts", width=320, css_classes=["pair-scope"])
        self._version = pn.widgets.Select(name="reward version", width=320, css_classes=["pair-version"])
        self._margin = pn.widgets.FloatInput(name="min margin", value=None, start=0, width=95, placeholder="any",
                                             css_classes=["pair-margin"], description=_doc("min_margin"))
        self._length = pn.widgets.FloatInput(name="length match", value=None, start=0, end=1, step=0.05, width=95,
                                             placeholder="off", css_classes=["pair-length"],
                                             description=_doc("length_match"))
        self._cap = pn.widgets.IntInput(name="per-prompt cap", value=None, start=1, width=105, placeholder="none",
                                        css_classes=["pair-cap"], description=_doc("per_prompt_cap"))
        self._within = pn.widgets.Select(name="within", options=["group", "prompt"], value="group", width=100,
                                         description=_doc("within"))
        self._dedupe = pn.widgets.Checkbox(name="dedupe identical completions", value=True, css_classes=["pair-dedupe"])
        self._build = pn.widgets.Button(name="Build pairs", color="primary", width=120, css_classes=["build-pairs"])
        self._build.on_click(self._on_build)
        self._build_msg = pn.pane.HTML("", stylesheets=[CSS], sizing_mode="stretch_width", css_classes=["build-message"])
        # -- hand-pick
        self._pick_info = pn.pane.HTML("", stylesheets=[CSS, REVIEW_CSS], sizing_mode="stretch_width",
                                       css_classes=["pick-info"])
        self._pick_chosen = pn.widgets.Button(name="selected → chosen", width=150, css_classes=["pick-chosen"])
        self._pick_rejected = pn.widgets.Button(name="selected → rejected", width=150, css_classes=["pick-rejected"])
        self._pick_add = pn.widgets.Button(name="Add this pair", color="success", width=120, disabled=True,
                                           css_classes=["pick-add"])
        self._pick_chosen.on_click(lambda e: self._pick("chosen"))
        self._pick_rejected.on_click(lambda e: self._pick("rejected"))
        self._pick_add.on_click(self._on_hand_pick)
        # -- review
        self._progress = pn.indicators.Progress(value=0, max=100, bar_color="success", height=12,
                                                sizing_mode="stretch_width", css_classes=["review-progress"])
        self._counts = pn.pane.HTML("", stylesheets=[CSS, REVIEW_CSS], sizing_mode="stretch_width",
                                    css_classes=["review-counts"])
        self._card = pn.pane.HTML("", stylesheets=[CSS, REVIEW_CSS], sizing_mode="stretch_width",
                                  css_classes=["pair-card"])
        self._note = pn.widgets.TextInput(name="", placeholder="note on this pair (Enter saves)", min_width=200,
                                          sizing_mode="stretch_width", css_classes=["pair-note"])
        self._note.param.watch(self._on_note, "enter_pressed")
        buttons = {}
        for key, (label, kind) in {"a": ("Accept", "success"), "r": ("Reject", "danger"), "s": ("Swap", "default"),
                                   "k": ("← Prev", "light"), "j": ("Next →", "light")}.items():
            b = pn.widgets.Button(name=label, color=kind, width=80 if key in "jk" else 84,
                                  css_classes=[f"review-{KEYS[key]}"])
            b.on_click(lambda e, k=key: self._on_key(k))
            buttons[key] = b
        self._buttons = buttons
        self._keys = KeyShortcuts(keys="".join(KEYS), stylesheets=[REVIEW_CSS], css_classes=["review-keys"],
                                  hint='<span class="keys"><kbd>a</kbd> accept · <kbd>r</kbd> reject · <kbd>s</kbd> '
                                       'swap · <kbd>j</kbd>/<kbd>→</kbd> next · <kbd>k</kbd>/<kbd>←</kbd> previous; '
                                       'the note box saves on Enter</span>')
        self._keys.on_key(self._on_key)
        # -- export
        self._format = pn.widgets.Select(name="format", options=list(FORMATS), value="preference", width=110,
                                         css_classes=["export-format"])
        self._style = pn.widgets.Select(name="style", options=list(STYLES), value="standard", width=120,
                                        css_classes=["export-style"])
        self._filetype = pn.widgets.Select(name="file", options=list(FILETYPES), value="jsonl", width=90,
                                           css_classes=["export-filetype"])
        self._kinds = pn.widgets.Select(name="pairs", options={"every kind": "", "completion pairs": "completion",
                                                               "step pairs (fork siblings)": "step",
                                                               "turn pairs (trajectories)": "turn"},
                                        value="", width=190, css_classes=["export-kinds"],
                                        description="which accepted pairs to export; conversational, a turn pair's "
                                                    "shared turns end the prompt (tool calls and tool messages kept)")
        self._skip_stale = pn.widgets.Checkbox(name="leave stale pairs out", value=False, css_classes=["export-skip"])
        self._export = pn.widgets.Button(name="Export accepted", color="primary", width=150,
                                         css_classes=["export-button"])
        self._export.on_click(self._on_export)
        # a long file name wraps inside its button rather than running out of it
        self._download = pn.widgets.FileDownload(file=io.BytesIO(b""), filename="nothing.jsonl", visible=False,
                                                 color="success", width=330, css_classes=["export-download"],
                                                 stylesheets=[WRAP_BUTTON])
        self._download_prov = pn.widgets.FileDownload(file=io.BytesIO(b""), filename="provenance.json", visible=False,
                                                      color="light", width=330, css_classes=["export-provenance"],
                                                      stylesheets=[WRAP_BUTTON])
        self._export_msg = pn.pane.HTML("", stylesheets=[CSS], sizing_mode="stretch_width",
                                        css_classes=["export-message"])
        self._exports = pn.pane.HTML("", stylesheets=[CSS, REVIEW_CSS], sizing_mode="stretch_width",
                                     css_classes=["export-list"])

        head = lambda t: pn.pane.HTML(f'<div class="meta-line"><b>{esc(t)}</b></div>', stylesheets=[CSS])  # noqa: E731
        build = pn.Column(
            head("build pairs"), pn.Row(self._rule, self._level), self._scope, self._version,
            pn.Row(self._margin, self._length, self._cap), pn.Row(self._within, pn.Column(pn.Spacer(height=22),
                                                                                         self._dedupe)),
            self._build, self._build_msg,
            pn.pane.HTML(DIVIDER_HTML, sizing_mode="stretch_width"), head("hand-pick from the table or the group view"), self._pick_info,
            pn.Row(self._pick_chosen, self._pick_rejected), self._pick_add,
            pn.pane.HTML(DIVIDER_HTML, sizing_mode="stretch_width"), head("export accepted pairs"), pn.Row(self._format, self._style, self._filetype),
            self._kinds, self._skip_stale, self._export, self._download, self._download_prov, self._export_msg, self._exports,
            width=350, css_classes=["curation-build"])
        review = pn.Column(
            pn.Row(pn.widgets.Select.from_param(self.param.show, name="queue", width=150, css_classes=["review-show"]),
                   pn.Column(pn.Spacer(height=18), self._counts), sizing_mode="stretch_width"),
            self._progress,
            pn.FlexBox(buttons["a"], buttons["r"], buttons["s"], buttons["k"], buttons["j"],
                       pn.Row(self._note, styles={"flex": "1 1 220px", "min-width": "0"}, margin=0),
                       flex_wrap="wrap", align_items="center", sizing_mode="stretch_width"),
            self._keys, self._card, sizing_mode="stretch_width", css_classes=["curation-review"])
        self._layout = pn.Row(build, review, sizing_mode="stretch_width", css_classes=["curation-panel"])
        self._sync_choices()
        self.state.param.watch(lambda e: self._render_pick(), ["rollout_id"])
        self._render_pick()

    # -- choices from the store -----------------------------------------------------------
    @param.depends("state.refresh", watch=True)
    def _sync_choices(self) -> None:
        if self._defer():  # a hidden tab: its pickers fill when it is opened (page builds stay cheap)
            return
        store = self.state.store
        scopes = {"rollouts the table's filter keeps": "filter", "every rollout": "all"}
        scopes |= {f"run: {label}": f"run:{rid}" for label, rid in run_choices(store).items()}
        self._scope.options = scopes
        if self._scope.value not in scopes.values():
            self._scope.value = "all"
        opts = {"default (the task's rule)": ""} | {v: v for v in lookups.rule_version_ids(store)}
        self._version.options = opts
        if self._version.value not in opts.values():
            self._version.value = ""
        self._draw_queue()

    # -- build ----------------------------------------------------------------------------
    def rule(self) -> curation.PairRule:
        return curation.PairRule(name=self._rule.value, level=self._level.value, min_margin=self._margin.value,
                              length_match=self._length.value, per_prompt_cap=self._cap.value,
                              dedupe=bool(self._dedupe.value), within=self._within.value)

    def _on_build(self, event=None) -> None:
        scope, runs = None, None
        if self._scope.value == "filter":
            scope = self.state.table_filter
        elif str(self._scope.value).startswith("run:"):
            runs = [self._scope.value[4:]]
        try:
            res = curation.build_pairs(self.state.store, self.rule(), scope=scope, run_ids=runs,
                                    rule_version_id=self._version.value or None)
        except curation.CurationError as exc:
            self._build_msg.object = banner("error", str(exc))
            return
        self._build_msg.object = banner("info" if res.added else "warn", res.message)
        self.param.update(show="pending first", position=0)
        self._render()

    # -- hand-pick --------------------------------------------------------------------------
    def _pick(self, side: str) -> None:
        if self.state.rollout_id:
            self._picked[side] = self.state.rollout_id
        self._render_pick()

    def _render_pick(self) -> None:
        sel = self.state.rollout_id
        parts = [f'<span>selected: <b>{esc(sel[-8:]) if sel else "none (click a row or a card)"}</b></span>']
        for side in ("chosen", "rejected"):
            rid = self._picked.get(side)
            parts.append(f'<span>{side}: <b class="picked-{side}">{esc(rid[-8:]) if rid else "–"}</b></span>')
        self._pick_info.object = f'<div class="meta-line">{"".join(parts)}</div>'
        self._pick_add.disabled = not (self._picked.get("chosen") and self._picked.get("rejected"))

    def _on_hand_pick(self, event=None) -> None:
        try:
            pid = curation.hand_pick(self.state.store, self._picked["chosen"], self._picked["rejected"],
                                  reviewer=_user())
        except (curation.CurationError, KeyError) as exc:
            self._build_msg.object = banner("error", str(exc))
            return
        self._picked.clear()
        self._render_pick()
        self._build_msg.object = banner("info", f"hand-picked pair {pid[-8:]} stored as accepted")
        self._render()

    # -- review -----------------------------------------------------------------------------
    def _status_filter(self) -> str | None:
        return None if self.show == "pending first" else self.show

    def _current(self) -> dict | None:
        if self._queue.empty or self.position >= len(self._queue):
            return None
        return self._queue.iloc[self.position].to_dict()

    def _on_key(self, key: str) -> None:
        if not self.shown:
            return
        store, pair = self.state.store, self._current()
        if key == "j":
            self.position = min(self.position + 1, max(0, len(self._queue) - 1))
            return
        if key == "k":
            self.position = max(0, self.position - 1)
            return
        if pair is None:
            return
        try:
            if key == "a":
                curation.accept(store, [pair["pair_id"]], reviewer=_user())
            elif key == "r":
                curation.reject(store, [pair["pair_id"]], reviewer=_user())
            elif key == "s":
                curation.swap(store, [pair["pair_id"]], reviewer=_user())
            self._reload(advance=key in "ar")
        except Exception as exc:  # a query timeout, a store error: say so, keep the page
            self._card.object = banner("error", f"could not record that: {type(exc).__name__}: {exc}")

    def _on_note(self, event=None) -> None:
        pair = self._current()
        if pair is None:
            return
        curation.set_note(self.state.store, pair["pair_id"], self._note.value, reviewer=_user())
        self._reload(advance=False)

    def _reload(self, advance: bool) -> None:
        """Re-read the queue after a decision; with ``advance``, show the next undecided pair."""
        pos = self.position
        self._queue = curation.queue(self.state.store, status=self._status_filter(), limit=100_000)
        if advance and self.show == "pending first":
            pending = [i for i, s in enumerate(self._queue["status"]) if s == "pending"]
            pos = pending[0] if pending else pos
        self.param.update(position=min(pos, max(0, len(self._queue) - 1)))
        self._draw()

    @param.depends("show", watch=True)
    def _on_show(self) -> None:
        self.position = 0
        self._render()

    @param.depends("position", watch=True)
    def _on_position(self) -> None:
        if self.shown:
            self._draw()

    def _render(self) -> None:
        if self._defer():
            return
        self._sync_choices()

    def _draw_queue(self) -> None:
        self._queue = curation.queue(self.state.store, status=self._status_filter(), limit=100_000)
        self.param.update(position=min(self.position, max(0, len(self._queue) - 1)))
        self._draw()
        self._render_exports()

    def _draw(self) -> None:
        prog = curation.progress(self.state.store)
        total = prog["total"]
        self._progress.value = int(100 * prog["reviewed"] / total) if total else 0
        stale = f'<span><b>{prog["stale"]}</b> stale</span>' if prog["stale"] else ""
        self._counts.object = (f'<div class="meta-line"><span><b class="reviewed">{prog["reviewed"]}</b> of '
                               f'<b>{total}</b> reviewed</span><span><b class="n-accepted">{prog["accepted"]}</b> '
                               f'accepted</span><span><b>{prog["rejected"]}</b> rejected</span><span><b '
                               f'class="n-pending">{prog["pending"]}</b> pending</span>{stale}</div>')
        pair = self._current()
        for b in self._buttons.values():
            b.disabled = pair is None
        if pair is None:
            self._card.object = ('<div class="empty">No pairs here yet: build some with a rule on the left, or '
                                 'hand-pick two rollouts of one prompt.</div>')
            self._note.value = ""
            return
        self._note.value = _s(pair["note"])
        self._card.object = self._pair_html(pair)

    def _pair_html(self, pair: dict) -> str:
        st = self.state
        toks = queries.tokens_of(st.store, [pair["chosen_rollout_id"], pair["rejected_rollout_id"]])
        k = int(pair["prefix_tokens"]) if pair["kind"] != "completion" and pd.notna(pair["prefix_tokens"]) else 0
        channel = st.channel if st.channel in ("logprob", "entropy") else "entropy"
        sides = []
        for side in ("chosen", "rejected"):
            rid = pair[f"{side}_rollout_id"]
            t = toks.get(rid)
            strip = ('<div class="empty">this rollout is no longer in the store</div>' if t is None
                     else strip_html(t[t["pos"] >= k].reset_index(drop=True), channel, compact=True))
            reward = pair[f"{side}_reward"]
            sides.append(
                f'<div class="pair-side {side}" data-rollout="{esc(rid)}"><h4>{side} · reward '
                f'{"–" if reward is None or reward != reward else f"{reward:.3f}"}</h4>{strip}'
                f'{components_html(pair[f"{side}_components"])}</div>')
        prefix = (f'<span class="pair-prefix" title="the prefix both continuations share">{esc(pair["prefix"])}</span>'
                  if pair["kind"] != "completion" and _s(pair["prefix"]) else "")
        stale = banner("warn", f"stale: {_s(pair['stale_detail']) or 'a rollout was deleted or re-scored'}; it is "
                               "refused by exports: build the rule again (a re-scored pair takes the new rewards), reject it, or tick 'leave stale pairs out'") if _s(pair.get("stale")) else ""
        margin = pair["margin"]
        meta = (f'<div class="meta-line"><span>pair <b>{self.position + 1}</b> / {len(self._queue)}</span>'
                f'<span class="status-pill {esc(pair["status"])}">{esc(pair["status"])}</span>'
                f'<span>{esc(pair["kind"])} pair · {esc(pair["rule"])}'
                f'{" (swapped)" if pair["swapped"] else ""}</span>'
                f'<span>margin <b>{"–" if margin is None or margin != margin else f"{margin:+.3f}"}</b></span>'
                f'<span>version {esc(pair["rule_version_id"] or "–")}</span>'
                + (f'<span>reviewer {esc(_s(pair["reviewer"]))}</span>' if _s(pair["reviewer"]) else "")
                + (f'<span>note: <i>{esc(_s(pair["note"]))}</i></span>' if _s(pair["note"]) else "") + "</div>")
        legend = SCALES[channel].legend_html(compact=True)
        return (f'{meta}{stale}<div class="pair-prompt">{esc(pair["prompt"])}{prefix}</div>'
                f'<div class="pair-grid">{"".join(sides)}</div>{legend}')

    # -- export -------------------------------------------------------------------------------
    def _on_export(self, event=None) -> None:
        try:
            kinds = [self._kinds.value] if self._kinds.value else None
            name, data, prov, sidecar = export_download(self.state.store, self._format.value, self._filetype.value,
                                                        self._style.value, skip_stale=bool(self._skip_stale.value),
                                                        kinds=kinds)
        except curation.CurationError as exc:
            self._download.visible = self._download_prov.visible = False
            self._export_msg.object = banner("error", str(exc))
            return
        except Exception as exc:  # a disk or store error: say which, keep the page
            self._download.visible = self._download_prov.visible = False
            self._export_msg.object = banner("error", f"export failed: {type(exc).__name__}: {exc}")
            return
        self._download.param.update(file=io.BytesIO(data), filename=name, label=f"Download {name}", visible=True)
        if not name.endswith(".zip"):  # the zip of a datasets folder holds it already
            self._download_prov.param.update(file=io.BytesIO(sidecar), filename=f"{name}.provenance.json",
                                             label="Download its provenance (.json)", visible=True)
        else:
            self._download_prov.visible = False
        rows = prov["rows"]
        self._export_msg.object = banner("info", f"{rows} rows of {self._format.value} ({self._style.value}) ready: "
                                                 f"{len(data):,} bytes, provenance recorded in the store"
                                                 + (" and inside the zip" if name.endswith(".zip") else ""))
        self._render_exports()

    def _render_exports(self) -> None:
        df = exports(self.state.store).head(5)
        if df.empty:
            self._exports.object = ""
            return
        rows = "".join(f'<tr><td>{esc(str(r.created_at)[5:16])}</td><td>{esc(r.format)}</td><td>{int(r.n_rows)}</td>'
                       f'<td title="{esc(r.path)}">{esc(_file_name(str(r.path)))}</td></tr>' for r in df.itertuples())
        self._exports.object = ('<table class="exports"><tr><th class="when">when</th><th class="format">format</th>'
                                '<th class="rows">rows</th><th title="its whole path on hover">file</th></tr>'
                                f'{rows}</table>')

    def __panel__(self):
        return self._layout


def _doc(field: str) -> str:
    """A ``PairRule`` field's help (shown as the widget's hover help)."""
    return {s.name: s.help for s in settings_of(curation.PairRule)}.get(field, "")


def _file_name(path: str) -> str:
    """An export's file as the list shows it: its name (a browser download is marked ↓)."""
    if path.startswith("download:"):
        return "↓ " + path.removeprefix("download:")
    return PurePath(path).name


def _s(x) -> str:
    """A text cell as a string ('' for None and NaN)."""
    return x if isinstance(x, str) else ""


def _user() -> str | None:
    return pn.state.user or None


