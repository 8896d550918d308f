"""A failure in a served page's callback shows on that page, in words, and is logged once.

Panel hands an exception raised by a callback of a served page (a widget changed, a button
clicked, a callback scheduled) to ``pn.config.exception_handler``; without one it raises it
again, Bokeh logs the traceback, and the page shows nothing: the view that failed stays as it
was, stale, beside views that moved on. :func:`install` makes :func:`report` that handler and
puts a hidden :class:`ErrorBanner` at the top of the page's main area (a template's areas are
drawn once: the banner is there from the start). :func:`report` logs the traceback once (logger
``rollout_studio.page``) and shows ``"<type>: <message>"`` in the page's banner, red, with a
*dismiss* button. Work a view starts on the event loop (``widgets.base.jobs.start``) reports its
failures here too.

Outside a served page (a notebook, a script, a test) an exception is raised as Panel raises it.
"""
from __future__ import annotations

import html
import logging
import weakref

import panel as pn
import param
from bokeh.document import Document

log = logging.getLogger("rollout_studio.page")
_REPORTED = "_rollout_studio_reported"  # set on an exception once it is logged
_BANNERS: weakref.WeakKeyDictionary[Document, ErrorBanner] = weakref.WeakKeyDictionary()
# the red of the studio's error banners (widgets.base.style): this module draws for every page, below the panels
STYLE = "padding:6px 10px;border-radius:6px;font-size:13px;background:#fff5f5;border:1px solid #ffa8a8;color:#a61e4d"


class ErrorBanner(pn.viewable.Viewer):
    """A page's error banner: the last failure's message, hidden until there is one, hidden again by *dismiss*."""

    message = param.String(default="", doc="What failed, in words ('' hides the banner).")

    def __init__(self, **params):
        super().__init__(**params)
        self._text = pn.pane.HTML("", sizing_mode="stretch_width", margin=(0, 6))
        dismiss = pn.widgets.Button(name="dismiss", color="light", width=80, height=30, margin=(4, 6),
                                    css_classes=["dismiss-error"])
        dismiss.on_click(lambda _: setattr(self, "message", ""))
        self._layout = pn.Row(self._text, dismiss, visible=False, sizing_mode="stretch_width",
                              css_classes=["page-error"], margin=(6, 6))
        self._show()

    @param.depends("message", watch=True)
    def _show(self) -> None:
        self._text.object = f'<div style="{STYLE}">{html.escape(self.message)}</div>' if self.message else ""
        self._layout.visible = bool(self.message)

    def __panel__(self):
        return self._layout


def install(page: pn.template.BaseTemplate) -> None:
    """Report every served page's callback failures with :func:`report` (process-wide), and give
    ``page`` (this session's) its banner, hidden until a failure."""
    pn.config.exception_handler = report
    doc = pn.state.curdoc
    if doc is not None and doc.session_context is not None:
        _BANNERS[doc] = shown = ErrorBanner()
        page.main.insert(0, shown)


def report(exc: BaseException, doc: Document | None = None) -> None:
    """Log ``exc`` (once, with its traceback) and show it on ``doc``'s page (default: the current
    one). Outside a served page, raise it."""
    doc = doc or pn.state.curdoc
    if doc is None or doc.session_context is None:
        raise exc
    if not getattr(exc, _REPORTED, False):
        log.error("a callback of a served page failed", exc_info=exc)
        try:
            setattr(exc, _REPORTED, True)
        except AttributeError:  # an exception type without attributes: logged again if seen again
            pass
    shown = _BANNERS.get(doc)
    if shown is not None:  # else a page without one: the log says it
        shown.message = (f"Something on this page failed and was not updated: {type(exc).__name__}: {exc}. "
                         "The server log has the details.")
