"""Form widgets generated from a config dataclass (:mod:`studio.configs`): the served forms and
the command line read the same fields, so help, bounds, choices and defaults have one source."""
from __future__ import annotations

from typing import Any

import panel as pn
import param

from studio.configs import Setting, settings_of


def parameter(cls: type, name: str, **params: Any) -> param.Parameter:
    """A class-level ``param`` parameter bound to one setting of ``cls``: its default, bounds,
    choices and help (``doc``) are the setting's (a Panel viewer's form then uses ``from_param``)."""
    s = next(x for x in settings_of(cls) if x.name == name)
    kw = {"default": s.default, "doc": s.help, "allow_None": s.optional} | params
    if s.kind is bool:
        return param.Boolean(**kw)
    if s.choices is not None:
        return param.Selector(objects=list(s.choices), **kw)
    if s.kind in (int, float):
        bounds = tuple(None if b is None else s.kind(b) for b in s.bounds) if s.bounds else None
        return (param.Integer if s.kind is int else param.Number)(bounds=bounds, **kw)
    return param.String(**kw)


def widget_for(s: Setting, value: Any = None, *, label: str | None = None, **params: Any) -> pn.widgets.Widget:
    """The widget of one setting: a checkbox, a select of its choices, a bounded number input
    or a text input; its help is the widget's description (the ⓘ tooltip)."""
    value = s.default if value is None else value
    common = {"label": label or s.name.replace("_", " ").capitalize()} | params
    if s.kind is bool:  # a checkbox has no description tooltip: its help goes in the hover title
        return pn.widgets.Checkbox(value=bool(value), **common)
    common.setdefault("description", s.help or None)
    if s.choices is not None:
        return pn.widgets.Select(options=list(s.choices), value=value, **common)
    lo, hi = s.bounds or (None, None)
    if s.kind is int:
        return pn.widgets.IntInput(value=value, start=None if lo is None else int(lo),
                                   end=None if hi is None else int(hi), **common)
    if s.kind is float:
        if s.optional and value is None:
            return pn.widgets.TextInput(value="", placeholder="none", **common)
        return pn.widgets.FloatInput(value=value, start=lo, end=hi, **common)
    if s.kind is tuple:
        return pn.widgets.TextInput(value=", ".join(value or ()), **common)
    return pn.widgets.TextInput(value="" if value is None else str(value), **common)


def form_widgets(cls: type, values: Any = None, skip: tuple[str, ...] = (), labels: dict[str, str] | None = None,
                 **params: Any) -> dict[str, pn.widgets.Widget]:
    """One widget per setting of ``cls`` (in field order), set from ``values`` (an instance) or the defaults."""
    labels = labels or {}
    return {s.name: widget_for(s, getattr(values, s.name) if values is not None else None,
                               label=labels.get(s.name), **params)
            for s in settings_of(cls) if s.name not in skip}


def form_values(cls: type, widgets: dict[str, pn.widgets.Widget]) -> dict[str, Any]:
    """The values the widgets hold, typed as the settings declare (an empty optional number is None)."""
    out = {}
    for s in settings_of(cls):
        if s.name not in widgets:
            continue
        v = widgets[s.name].value
        if s.kind is tuple:
            v = tuple(x.strip() for x in str(v).split(",") if x.strip())
        elif s.kind is float and isinstance(v, str):
            v = float(v) if v.strip() else None
        elif s.kind is str and isinstance(v, str):
            v = v.strip()
        out[s.name] = v
    return out
