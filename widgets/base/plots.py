"""HoloViews for the views' plots, offline: the backend, the shared plot options and colours."""
from __future__ import annotations

ENTROPY_COLOR = "#f76707"
THRESHOLD_COLOR = "#1f2937"
OK_COLOR, BAD_COLOR = "#37b24d", "#e03131"


def holoviews():
    """HoloViews with its Bokeh backend registered. Not ``hv.extension``: inside a served
    session that switches Panel to CDN resources for stylesheets (a request the offline
    studio must never make)."""
    import holoviews as hv
    import holoviews.plotting.bokeh  # noqa: F401  (registers the backend)

    hv.Store.set_current_backend("bokeh")
    return hv


def plot_opts(**kw) -> dict:
    """The options every plot of the studio starts from (``kw`` overrides them)."""
    base = dict(height=210, responsive=True, toolbar=None, default_tools=["hover"], fontsize={"title": 11, "labels": 10,
                                                                                              "xticks": 9, "yticks": 9})
    base.update(kw)
    return base
