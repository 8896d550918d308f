"""The studio's lower tabs, declared once: the served page builds its tabs from :data:`TABS`
and ``Studio.view(name)`` looks its views up here, so a tab exists in both or in neither.

Each :class:`Tab` names its view (a ``widgets`` module and class), says who may use it and
whether it draws lazily. A tab is seen by everyone; a tab whose view can run code
(``runs_code``) is built with ``can_run``, so a browse-only user gets it without the buttons
that would start a model, a rule or a mini-run. A ``lazy`` view (``widgets.base.lazy.LazyView``)
is made hidden and draws when first shown; the page shows it when its tab opens, the API at once.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # Panel is imported only when a view is built
    import panel as pn


@dataclass(frozen=True)
class Tab:
    """One lower tab of the page."""

    title: str
    """The tab's label on the page; lower-cased, its name for ``Studio.view``."""
    module: str
    """The ``widgets`` module that holds its view."""
    view: str
    """The view's class in that module (called with ``state=`` and the options below)."""
    runs_code: bool = False
    """Its view has actions that run code (a model, a rule, a mini-run): built with ``can_run``."""
    lazy: bool = True
    """Its view draws only while shown (made hidden, drawn when its tab first opens)."""
    in_api: bool = True
    """``Studio.view`` offers it (the group view has its own method, ``Studio.group_view``)."""

    @property
    def name(self) -> str:
        """The tab's name for ``Studio.view``: its title, lower-cased."""
        return self.title.lower()

    def view_class(self) -> type:
        """The view's class (its module imported on first use)."""
        return getattr(importlib.import_module(f"widgets.{self.module}"), self.view)

    def build(self, state, can_run: bool = True, shown: bool = False) -> pn.viewable.Viewable:
        """The tab's view on ``state``: a lazy one hidden, unless ``shown`` (then drawn now)."""
        cls = self.view_class()
        kwargs = {"can_run": can_run} if self.runs_code else {}
        if not self.lazy:
            return cls(state=state, **kwargs)
        view = cls(state=state, shown=False, **kwargs)
        if shown:
            view.shown = True  # drawn now, as a tab is when it is opened
        return view


TABS: tuple[Tab, ...] = (
    Tab("Group view", "group_view", "GroupView", lazy=False, in_api=False),
    Tab("Entropy landscape", "entropy_view", "EntropyLandscape"),
    Tab("Compare policies", "entropy_view", "PolicyCompare", runs_code=True),
    Tab("Mismatch", "mismatch_panel", "MismatchPanel", runs_code=True),
    Tab("Reward rules", "rule_panel", "RulePanel", runs_code=True),
    Tab("Reward hacking", "hacking_view", "HackingView"),
    Tab("Advantages & steps", "credit_panel", "CreditView", runs_code=True),
    Tab("Mini-runs", "minirun_panel", "MiniRunPanel", runs_code=True),
    Tab("Preference data", "curation_panel", "CurationPanel"),
    Tab("Timeline & diff", "timeline_panel", "TimelinePanel"),
    Tab("Import & enrich", "import_panel", "ImportPanel", runs_code=True, lazy=False),
    Tab("SQL", "sql_console", "SQLConsole", lazy=False),
)

# tab name -> tab: the tabs ``Studio.view`` offers (the page's own, by name)
VIEWS: dict[str, Tab] = {tab.name: tab for tab in TABS if tab.in_api}


def index(title: str) -> int:
    """The position of the tab titled ``title`` in :data:`TABS`."""
    return next(i for i, t in enumerate(TABS) if t.title == title)
