"""One way to declare a setting: a config dataclass's fields carry their help, bounds and choices,
and the command line and the served forms are generated from them.

A config is a plain dataclass whose fields are made with :func:`setting` (as TRL's configs put
``metadata={"help": …}`` on each field)::

    @dataclass
    class GenerateConfig:
        group_size: int = setting(8, "completions per prompt (one GRPO group)", 1, 64)

:func:`problems` checks an instance against its bounds and choices, :func:`add_arguments` /
:func:`from_arguments` make and read the command-line options (``studio.face.cli``), and
``widgets.forms`` makes the form widgets from :func:`settings_of`. This module imports nothing of
the studio: every layer may use it.
"""
from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any


def setting(default: Any, help: str, lo: float | None = None, hi: float | None = None,  # noqa: A002
            choices: tuple | None = None, *, flag: str | None = None, label: str | None = None) -> Any:
    """A dataclass field with its help line, bounds (inclusive; None: unbounded) and choices.

    ``flag`` names the command-line option when it is not ``--<field-name>``; ``label`` names the
    setting in messages when its field name does not read well there. Mutable defaults
    (lists, dicts) are not settings; tuples are.
    """
    meta = {"help": help, "bounds": (lo, hi) if lo is not None or hi is not None else None,
            "choices": tuple(choices) if choices else None, "flag": flag, "label": label}
    return dataclasses.field(default=default, metadata=meta)


@dataclass(frozen=True)
class Setting:
    """One field of a config as the command line and the forms see it."""

    name: str
    kind: type  # bool, int, float, str or tuple (a tuple of strings)
    optional: bool  # None is a value (``float | None``)
    default: Any
    help: str
    bounds: tuple[float | None, float | None] | None
    choices: tuple | None
    flag: str
    label: str  # how messages name it

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not allowed here (``"group size must be 1-64, got 0"``), or None.

        >>> Setting("group_size", int, False, 8, "", (1, 64), None, "--group-size", "group size").problem(0)
        'group size must be 1-64, got 0'
        """
        if value is None:
            return None if self.optional else f"{self.label} is required"
        if self.kind is float and isinstance(value, float) and value != value:
            return f"{self.label} must be a number, got nan"
        if self.choices is not None and value not in self.choices:
            return f"{self.label} must be one of {', '.join(map(str, self.choices))}, got {value!r}"
        if self.bounds is not None and self.kind in (int, float):
            lo, hi = self.bounds
            if lo is not None and hi is not None and not lo <= value <= hi:
                return f"{self.label} must be {_num(lo)}-{_num(hi)}, got {value}"
            if lo is not None and hi is None and value < lo:
                return f"{self.label} must be at least {_num(lo)}, got {value}"
            if hi is not None and lo is None and value > hi:
                return f"{self.label} must be at most {_num(hi)}, got {value}"
        return None


def _num(x: float | None) -> str:
    """A bound as a person writes it: 64, 0.01, 1e-07."""
    if x is None:
        return "…"
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def _kind(tp: Any) -> tuple[type, bool]:
    """``(base type, optional)`` of an annotation such as ``int``, ``float | None``, ``tuple[str, ...]``."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        return _kind(rest[0])[0], len(rest) < len(args)
    if typing.get_origin(tp) is tuple or tp is tuple:
        return tuple, False
    return (tp if isinstance(tp, type) else str), False


def settings_of(cls: type) -> list[Setting]:
    """The settings of a config dataclass, in field order (fields made without :func:`setting`
    get an empty help line)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        kind, optional = _kind(hints[f.name])
        meta = f.metadata
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        out.append(Setting(f.name, kind, optional, default, meta.get("help", ""), meta.get("bounds"),
                           meta.get("choices"), meta.get("flag") or "--" + f.name.replace("_", "-"),
                           meta.get("label") or f.name.replace("_", " ")))
    return out


def problems(config: Any) -> list[str]:
    """Every setting of ``config`` outside its bounds or choices, as one line each."""
    return [p for s in settings_of(type(config)) if (p := s.problem(getattr(config, s.name))) is not None]


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_arguments(ap: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type,
                  skip: tuple[str, ...] = ()) -> None:
    """One option per setting of ``cls`` (``dest`` is the field name), with its help, choices,
    bounds and default in the help text."""
    for s in settings_of(cls):
        if s.name in skip:
            continue
        extra = f" [{_num(s.bounds[0])}, {_num(s.bounds[1])}]" if s.bounds else ""
        help_ = f"{s.help}{extra}; default {s.default!r}" if s.help else None
        if s.kind is bool:  # --overlap, --overlap false (as a value), or --no-overlap
            ap.add_argument(s.flag, dest=s.name, type=_parse_bool, nargs="?", const=True, default=s.default,
                            metavar="true|false", help=help_)
            ap.add_argument("--no-" + s.flag[2:], dest=s.name, action="store_false", help=argparse.SUPPRESS)
        elif s.kind is tuple:
            ap.add_argument(s.flag, dest=s.name, action="append", default=None, help=help_)
        else:
            ap.add_argument(s.flag, dest=s.name, type=s.kind, default=s.default, choices=s.choices, help=help_)


def from_arguments(cls: type, args: argparse.Namespace, **overrides: Any) -> Any:
    """An instance of ``cls`` from parsed options (as :func:`add_arguments` made them)."""
    values = {}
    for s in settings_of(cls):
        if hasattr(args, s.name):
            v = getattr(args, s.name)
            values[s.name] = tuple(v) if s.kind is tuple and v is not None else (s.default if v is None else v)
    return cls(**(values | overrides))
