"""The sidebar's Mismatch card: which recomputed log-probs Δ is taken against (the stored train
log-prob, or a rescoring kept in token_scores), and the correction the strip marks and the table
judges sequences by: a preset as a framework ships it (picking one sets the fields) or a method with
its cap C, band and threshold set by hand. Shown only where the store has recomputed log-probs."""
from __future__ import annotations

import panel as pn

from studio.queries import mismatch as mismatch_reads
from studio.signals.mismatch import METHODS, PRESETS, Correction

from .base.state import StudioState
from .base.style import CARD_CSS, CSS, esc

STORED = "stored train log-prob"
CUSTOM = "custom (the fields below)"


def preset_named(correction: Correction, current: str = "") -> str:
    """The preset that is exactly ``correction``: ``current`` while it still is (two frameworks may ship
    the same correction), else the first that is ("" if none is)."""
    if PRESETS.get(current) == correction:
        return current
    return next((name for name, c in PRESETS.items() if c == correction), "")


def mismatch_controls(state: StudioState) -> pn.Column:
    """Widgets bound to the session's mismatch source and correction (``state.mismatch_source``,
    ``mm_*``); the sources follow the store."""
    source = pn.widgets.Select(name="Recomputed log-probs (Δ against)", sizing_mode="stretch_width",
                               css_classes=["mm-source"])
    preset = pn.widgets.Select(name="Correction preset", options=[CUSTOM, *PRESETS], sizing_mode="stretch_width",
                               css_classes=["mm-preset"])
    method = pn.widgets.Select.from_param(state.param.mm_method, name="Method", sizing_mode="stretch_width",
                                          css_classes=["mm-method"])
    cap = pn.widgets.FloatInput.from_param(state.param.mm_cap, name="Cap C", width=84, css_classes=["mm-cap"])
    low = pn.widgets.FloatInput.from_param(state.param.mm_low, name="Band low", width=84, css_classes=["mm-low"])
    thr = pn.widgets.FloatInput.from_param(state.param.mm_threshold, name="Threshold", width=84,
                                           css_classes=["mm-threshold"])
    marks = pn.widgets.Checkbox.from_param(state.param.mm_marks, name="Mark corrections on every channel",
                                           css_classes=["mm-marks"])
    formula = pn.pane.HTML("", stylesheets=[CSS], sizing_mode="stretch_width", margin=(0, 10),
                           css_classes=["mm-formula"])
    sources = state.fresh_read(("mismatch_sources",), lambda: mismatch_reads.sources(state.store))

    def sync_sources(*_):
        opts = {STORED: "", **{s: s for s in sources()}}
        source.options = opts
        source.value = state.mismatch_source if state.mismatch_source in opts.values() else ""

    def show(*_):  # the formula of the method, and the preset the fields are (custom once edited)
        c, problem = state.correction(), state.correction_problem()
        formula.object = (f'<div class="legend"><span class="lg-help">{esc(c.describe())}: '
                          f'{esc(METHODS.get(c.method, ""))}</span></div>' +
                          (f'<div class="banner error">{esc(problem)}; {esc(c.describe())} stays in use</div>'
                           if problem else ""))
        name = preset_named(c, state.mm_preset)
        state.mm_preset = name
        preset.value = name or CUSTOM

    def pick(event):
        if event.new == CUSTOM or event.new not in PRESETS:
            return
        c = PRESETS[event.new]
        state.param.update(mm_method=c.method, mm_cap=c.cap, mm_low=c.low, mm_threshold=c.threshold,
                           mm_preset=event.new)

    sync_sources()
    show()
    state.param.watch(sync_sources, ["refresh"])
    state.param.watch(show, ["mm_method", "mm_cap", "mm_low", "mm_threshold"])
    source.param.watch(lambda e: setattr(state, "mismatch_source", e.new or ""), "value")
    preset.param.watch(pick, "value")
    return pn.Column(source, preset, method, pn.Row(cap, low, thr, sizing_mode="stretch_width"), formula, marks,
                     sizing_mode="stretch_width", margin=0)


def mismatch_card(state: StudioState, **card) -> pn.Card:
    """The sidebar card around :func:`mismatch_controls`, visible only while the store has recomputed
    log-probs (``card``: the sidebar's card options)."""
    has = state.fresh_read(("has_recomputed",), lambda: mismatch_reads.has_recomputed(state.store))
    box = pn.Card(mismatch_controls(state), title="Mismatch", collapsed=True, css_classes=["mismatch-card"],
                  **{"stylesheets": [CARD_CSS], **card})

    def sync(*_):
        box.visible = bool(has())

    sync()
    state.param.watch(sync, ["refresh"])
    return box
