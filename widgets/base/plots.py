"""HoloViews for the views' plots, offline: the backend, the shared plot options and colours,
whole-step ticks for training-step axes and a legend placed above the plot."""
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


# a legend above the plot, in a row: inside, it covers the points that matter
LEGEND_TOP = {"show_legend": True, "legend_position": "top", "legend_cols": 4,
              "legend_opts": {"label_text_font_size": "8.5pt", "padding": 2, "spacing": 6, "margin": 0,
                              "glyph_width": 16, "border_line_alpha": 0}}


def step_ticks() -> dict:
    """Plot options for an x axis of training steps: ticks on whole steps only (never 1.5).
    A new ticker per plot: a Bokeh model belongs to one document."""
    from bokeh.models import BasicTicker

    return {"xticks": BasicTicker(min_interval=1, num_minor_ticks=0)}
