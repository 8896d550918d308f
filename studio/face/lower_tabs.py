"""The page's lower tabs: the views of :data:`studio.face.tabs.TABS`, each built when its tab is
first opened (a page costs the first tab, not eleven), then kept; a lazy view draws only while
its tab is open. (Not Panel's dynamic tabs: those re-create a tab's models on every switch.)
"""
from __future__ import annotations

import panel as pn

from studio.face.tabs import TABS, index


class LowerTabs:
    """The lower tabs of one served page (``panel`` is what the page lays out)."""

    def __init__(self, state, can_run: bool = True):
        self.state, self.can_run = state, can_run
        self.miniruns, self.imports = index("Mini-runs"), index("Import & enrich")
        for tab in TABS:  # their modules load with the page, not on a tab's first click
            tab.view_class()
        # lazy views are made hidden; ``view`` draws one as its tab first opens, ``_on_tab`` hides
        # the others (a hidden view waits, stale, until it is shown again)
        self.built: dict[int, pn.viewable.Viewable] = {0: self._build(0)}
        self.panel = pn.Tabs(*[(tab.title, self.built[i] if i in self.built
                                else pn.Column(sizing_mode="stretch_width", min_height=200))
                               for i, tab in enumerate(TABS)],
                             sizing_mode="stretch_width", css_classes=["lower-tabs"], margin=(6, 6))
        self.panel.param.watch(self._on_tab, "active")

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
        """Tab ``i``'s view, built, drawn and put in its tab on first use."""
        if i not in self.built:
            # drawn before its models exist, so they are made with what it shows: a change sent right
            # behind them would reach widgets the browser has not built yet (BokehJS builds views
            # asynchronously) and fail there
            v = self._build(i, shown=True)
            with pn.io.hold(freeze=True):  # its models reach the page in one message
                self.built[i] = v
                self.panel[i] = (TABS[i].title, v)
        return self.built[i]

    def _on_tab(self, event) -> None:
        self.view(event.new)
        for i, v in self.built.items():
            if "shown" in v.param:
                v.shown = i == event.new
        if event.new == self.imports:
            self.built[self.imports].fill()

    def stored(self) -> None:
        """New rollouts were stored: the open Import tab re-reads its folders (lazy views redraw themselves)."""
        if self.panel.active == self.imports:
            self.built[self.imports].fill()
