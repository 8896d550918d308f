"""Views in a tab that draw only while on screen: a store change marks them stale, and
opening the tab draws them once (so a page build or a Generate never pays for hidden tabs)."""
from __future__ import annotations

import panel as pn
import param


class LazyView(pn.viewable.Viewer):
    """Base of a tab view; subclasses start ``_render`` with ``if self._defer(): return``."""

    shown = param.Boolean(default=True, doc="Whether the view is on screen; while hidden, updates wait.")

    def __init__(self, **params):
        self._stale = True  # nothing drawn yet: the first time it is shown, it draws
        super().__init__(**params)

    def _defer(self) -> bool:
        """True (and remember to draw later) while the view is hidden."""
        self._stale = not self.shown
        return self._stale

    @param.depends("shown", watch=True)
    def _on_shown(self) -> None:
        if self.shown and self._stale:
            self._render()

    def _render(self) -> None:
        raise NotImplementedError
