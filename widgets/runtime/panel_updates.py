"""Cheaper property updates for every Panel component of the process.

Panel's ``Reactive._update_properties`` (panel 1.9) asks the component's design for all of its
parameters on every update, to prepend the design's stylesheets when ``stylesheets`` is among
the changes, and uses the answer for nothing else. Asking is not cheap: the design re-resolves
its theme files (a ``param.Filename`` lookup on disk each) and rebuilds its modifiers, ~0.15 ms
a component, a dozen components a click; with twenty people browsing one server that was 7% of
the server's Python time. :func:`install` makes updates without ``stylesheets`` skip the
question: what reaches the browser is the same.

An HTML pane of a served page is first drawn with some of the design's stylesheets; the first
time its text changes, Panel sends it all of them (as new ``ImportedStyleSheet`` models), and
Bokeh, seeing new models in a property, walks every model of the page (~500) to recompute its
model graph. Three panes change on a rollout click, so each person's first click walked the
page three times; with twenty people starting to browse together that was a third of the
server's Python time. :func:`prime_stylesheets` gives a built page's HTML panes their full
stylesheets at once, in one walk, as the page opens.

A component added to a page after it opened can also point a stylesheet at Panel's CDN: Panel
moves them to the server's copy as it makes a component's model, except where a component makes
its model itself (``pn.layout.Divider``); the page's first models are moved as the page is sent.
:func:`added_to_page` does both for what a callback adds.
"""
from __future__ import annotations

from collections.abc import Iterable

from bokeh.document import Document
from panel.io.resources import patch_model_css
from panel.pane.markup import HTMLBasePane
from panel.reactive import Reactive
from panel.viewable import Viewable

_PANEL_UPDATE = Reactive._update_properties


def _update_properties(self, *events, doc):
    if any(e.name == "stylesheets" for e in events):  # the design's stylesheets go first: Panel's own path
        return _PANEL_UPDATE(self, *events, doc=doc)
    return self._process_param_change({e.name: e.new for e in events})


def install() -> None:
    """Use :func:`_update_properties` for every component (idempotent)."""
    Reactive._update_properties = _update_properties


def prime_stylesheets(roots: Iterable[Viewable], doc: Document) -> None:
    """Give every HTML pane under ``roots`` in ``doc`` the stylesheets its first update would
    send (one recompute of the page's models for all of them)."""
    with doc.models.freeze():
        for root in roots:
            for pane in root.select(HTMLBasePane) if isinstance(root, Viewable) else ():
                for model, _parent in list(pane._models.values()):
                    if model.document is doc:
                        sheets = pane._get_properties(doc).get("stylesheets")
                        if sheets is not None:
                            model.stylesheets = sheets


def added_to_page(root: Viewable, doc: Document) -> None:
    """Give the models just made for ``root`` in ``doc`` (held, not sent yet) the stylesheets of
    the page's own: on this server, not Panel's CDN (the studio requests nothing from the network),
    and complete (:func:`prime_stylesheets`)."""
    dist_url = doc._template_variables.get("dist_url")
    if dist_url:
        for model, _parent in list(root._models.values()):
            if model.document is doc:
                patch_model_css(model, dist_url=dist_url)
    prime_stylesheets([root], doc)
