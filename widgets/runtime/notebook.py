"""Panel in a notebook with no network: every stylesheet inline, on the first render and after.

``pn.extension(inline=True)`` inlines Panel's, Bokeh's and Tabulator's JavaScript and the
stylesheets of a component's first render. Panel 1.9 does not keep that up afterwards: a
pane updated from Python (an HTML pane whose text changes when a channel is picked) is sent
with its stylesheets as links to ``cdn.holoviz.org``, which a notebook offline cannot load
(seen in JupyterLab: three requests to the CDN on the first click). :func:`setup` therefore
also rewrites, in every update a notebook sends, each stylesheet link into Panel's CDN as a
``data:`` URL of the same file from the installed Panel: the same CSS, no request.
"""
from __future__ import annotations

import base64
import functools

_ready = False


@functools.lru_cache(maxsize=64)
def _data_url(url: str) -> str | None:
    """The ``data:`` URL of a file of Panel's CDN, read from the installed Panel; None when
    the URL is not Panel's CDN or the file is not installed."""
    from panel.io.resources import CDN_DIST, DIST_DIR

    if not url.startswith(CDN_DIST):
        return None
    path = DIST_DIR / url[len(CDN_DIST):].split("?")[0]
    if not path.is_file():
        return None
    return "data:text/css;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def inline_cdn_stylesheets(doc) -> int:
    """Point every stylesheet of ``doc`` that links into Panel's CDN at its inline copy;
    returns how many were rewritten."""
    from bokeh.models import ImportedStyleSheet

    n = 0
    for model in list(doc.models):
        if isinstance(model, ImportedStyleSheet):
            local = _data_url(model.url)
            if local is not None:
                model.url = local
                n += 1
    return n


def _offline_updates() -> None:
    """Wrap the function Panel's notebook updates serialise with (``panel.io.notebook.diff``)."""
    import panel.io.notebook as nb

    if getattr(nb.diff, "_studio_offline", False):
        return
    original = nb.diff

    @functools.wraps(original)
    def diff(doc, binary=True, events=None):
        inline_cdn_stylesheets(doc)
        return original(doc, binary=binary, events=events)

    diff._studio_offline = True
    nb.diff = diff


def setup() -> None:
    """``pn.extension`` with the studio's extensions, every resource inline (once per process)."""
    global _ready
    if _ready:
        return
    import panel as pn

    pn.config.inline = True
    # Panel's native design: the Bootstrap design inlines 1.5 MB of CSS into every output
    pn.extension("tabulator", "codeeditor", notifications=False, inline=True)
    _offline_updates()
    _ready = True
