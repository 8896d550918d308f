"""Cheaper property updates for every Panel component of the process.

Panel's ``Reactive._update_properties`` (panel 1.9) asks the component's design for all of its
parameters on every update, to prepend the design's stylesheets when ``stylesheets`` is among
the changes, and uses the answer for nothing else. Asking is not cheap: the design re-resolves
its theme files (a ``param.Filename`` lookup on disk each) and rebuilds its modifiers, ~0.15 ms
a component, a dozen components a click; with twenty people browsing one server that was 7% of
the server's Python time. :func:`install` makes updates without ``stylesheets`` skip the
question: what reaches the browser is the same.
"""
from __future__ import annotations

from panel.reactive import Reactive

_PANEL_UPDATE = Reactive._update_properties


def _update_properties(self, *events, doc):
    if any(e.name == "stylesheets" for e in events):  # the design's stylesheets go first: Panel's own path
        return _PANEL_UPDATE(self, *events, doc=doc)
    return self._process_param_change({e.name: e.new for e in events})


def install() -> None:
    """Use :func:`_update_properties` for every component (idempotent)."""
    Reactive._update_properties = _update_properties
