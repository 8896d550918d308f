"""The page's lower tabs: the views of :data:`studio.face.tabs.TABS`, each built when its tab is
first opened (a page costs the first tab, not eleven), then kept; a lazy view draws only while
its tab is open.

Only the open tab's view is in the page. Each tab holds a column of its own, never replaced: the
open tab's holds its view, the others are empty. Leaving a tab takes its view's models out of the
browser's document; opening it again sends them anew, drawn as the view stands. A tab opened for
the first time (or whose view took over ``SLOW_S`` to open the last time) shows a "loading <tab>…"
line at once, and its view a moment later.

Why not keep every view opened in the page: Panel's tabs only make the other tabs invisible, and
Bokeh lays out, measures and repaints every view in the page on each change, each step forcing
the browser to recompute the styles of the whole document, which grows with every tab opened:
opened one after another, the tenth tab took 20-40 s (``benchmarks/bench_tabs.py``). Opening a tab
changes only columns' children, never the tabs' list (which makes BokehJS rebuild every tab).
"""
from __future__ import annotations

import time

import panel as pn

from studio.face.tabs import TABS, index
from widgets.runtime import panel_updates

SLOW_S = 0.5  # a tab whose view took longer than this to open shows a "loading" line first

# The tab headers wrap onto a second row rather than run past the page's right edge (where Bokeh's
# header clips them: a tab there cannot be clicked); as pills, so that a wrapped row reads as one bar.
HEADER_CSS = """
:host(.bk-above) .bk-header { overflow: visible; padding-bottom: 4px; }
:host(.bk-above) .bk-headers-wrapper { flex: 1 1 auto; min-width: 0; flex-wrap: wrap; overflow: visible; gap: 4px; }
:host(.bk-above) .bk-header .bk-tab { border: 1px solid transparent; border-radius: 6px; margin: 0;
                                      padding: 4px 12px; font-size: 14px; }
:host(.bk-above) .bk-header .bk-tab:hover { border-color: #dee2e6; }
:host(.bk-above) .bk-header .bk-tab.bk-active { background-color: #eef2ff; border-color: #c7d2fe; color: #1e3a8a; }
"""


class LowerTabs:
    """The lower tabs of one served page (``panel`` is what the page lays out)."""

    def __init__(self, state, can_run: bool = True):
        self.state, self.can_run = state, can_run
        self.miniruns, self.imports = index("Mini-runs"), index("Import & enrich")
        for tab in TABS:  # their modules load with the page, not on a tab's first click
            tab.view_class()
        # lazy views are made hidden; ``view`` draws one as its tab first opens, ``_open`` hides
        # the others (a hidden view waits, stale, until it is shown again)
        self.built: dict[int, pn.viewable.Viewable] = {0: self._build(0)}
        self.holders = [pn.Column(*([self.built[0]] if i == 0 else []), sizing_mode="stretch_width", margin=0)
                        for i in range(len(TABS))]
        self.panel = pn.Tabs(*[(tab.title, holder) for tab, holder in zip(TABS, self.holders)],
                             sizing_mode="stretch_width", css_classes=["lower-tabs"], margin=(6, 6),
                             stylesheets=[HEADER_CSS])
        self.panel.param.watch(self._on_tab, "active")
        self.slow: set[int] = set()  # tabs whose last opening took over SLOW_S: they say "loading" first

    def _build(self, i: int, shown: bool = False) -> pn.viewable.Viewable:
        v = TABS[i].build(self.state, can_run=self.can_run, shown=shown)
        if TABS[i].title == "Reward rules":
            v.on_retrain = self.retrain
        return v

    def retrain(self, version: str) -> None:
        """*Retrain with this rule*: the mini-run form, with the rule picked."""
        self.view(self.miniruns).use_rule(version)
        self.panel.active = self.miniruns

    def view(self, i: int) -> pn.viewable.Viewable:
        """Tab ``i``'s view, built and drawn on first use (in the page while its tab is open)."""
        if i not in self.built:
            self.built[i] = self._build(i, shown=True)
        return self.built[i]

    def _on_tab(self, event) -> None:
        if event.new in self.built and event.new not in self.slow:
            self._open(event.new)
            return
        with pn.io.hold():  # the old view leaves the page as the line saying what is coming enters it
            for i, holder in enumerate(self.holders):
                holder.objects = [_loading(TABS[i].title)] if i == event.new else []
        # the line reaches the page before the view is built, on the next tick
        pn.state.execute(lambda: self._open(event.new), schedule=True)

    def _open(self, i: int) -> None:
        """Put tab ``i``'s view in the page, and take the others out."""
        if self.panel.active != i:  # another tab was opened meanwhile
            return
        t0 = time.perf_counter()
        v = self.view(i)
        for j, w in self.built.items():  # the view draws (if stale) before its models exist, so they
            if "shown" in w.param:       # are made with what it shows: a change sent right behind them
                w.shown = j == i         # would reach widgets BokehJS has not built yet, and fail there
        with pn.io.hold(freeze=True):  # its models reach the page in one message
            for j, holder in enumerate(self.holders):
                holder.objects = [v] if j == i else []
            doc = pn.state.curdoc
            if doc is not None and doc.session_context is not None:
                panel_updates.added_to_page(self.holders[i], doc)
        if i == self.imports:
            v.fill()
        if time.perf_counter() - t0 > SLOW_S:
            self.slow.add(i)
        else:
            self.slow.discard(i)

    def stored(self) -> None:
        """New rollouts were stored: the open Import tab re-reads its folders (lazy views redraw themselves)."""
        if self.panel.active == self.imports:
            self.built[self.imports].fill()


def _loading(title: str) -> pn.pane.HTML:
    """What a tab shows while its view is built (a second or more)."""
    from widgets.base.style import CSS, esc

    return pn.pane.HTML(f'<div class="empty tab-loading">loading {esc(title)}…</div>', stylesheets=[CSS],
                        sizing_mode="stretch_width", min_height=120)
