"""The API's argument checks: a wrong type or value is a :class:`StudioAPIError` naming the
argument, never a TypeError or a DuckDB conversion error from deep inside a query."""
from __future__ import annotations

import numbers
import os
from typing import Any

import numpy as np

from studio.errors import StudioError
from widgets.base.style import CHANNELS  # one list of colour channels: the legend's


class StudioAPIError(StudioError, ValueError):
    """An API call was given something it cannot use; the message says what and why."""


def check_channel(channel: str) -> None:
    if not isinstance(channel, str) or channel not in CHANNELS:
        raise StudioAPIError(f"unknown channel {channel!r}; one of {', '.join(CHANNELS)}")


INT64 = 2**63 - 1


def short(value: Any) -> str:
    r = repr(value)
    return r if len(r) <= 80 else r[:77] + "..."


def arg_text(name: str, value: Any, optional: bool = True) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise StudioAPIError(f"{name} must be a string{' or None' if optional else ''}, got "
                             f"{type(value).__name__} {short(value)}")
    return value


def arg_texts(name: str, value: Any) -> list[str]:
    """One string, or an iterable of strings, as a list."""
    if isinstance(value, str):
        return [value]
    try:
        items = None if isinstance(value, (bytes, bytearray)) else list(value)
    except TypeError:
        items = None
    if items is None or not all(isinstance(x, str) for x in items):
        raise StudioAPIError(f"{name} must be a string or a list of strings, got {short(value)}")
    return items


def arg_path(name: str, value: Any, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, (str, os.PathLike)) or "\x00" in str(value):
        raise StudioAPIError(f"{name} must be a path (a string or pathlib.Path without NUL characters), got "
                             f"{type(value).__name__} {short(value)}")


def arg_whole(name: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise StudioAPIError(f"{name} must be a whole number, got {type(value).__name__} {short(value)}")
    if not lo <= value <= hi:
        raise StudioAPIError(f"{name} must be between {lo} and {hi}, got {value}")
    return int(value)


def arg_number(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or value != value:
        raise StudioAPIError(f"{name} must be a number or None, got {short(value)}")
    return float(value)


def arg_typed(name: str, value: Any, annotation: str) -> None:
    """``value`` against a dataclass field's annotation (``str``, ``bool``, ``int | None``, ``float``...)."""
    if value is None and "None" in annotation:
        return
    if annotation.startswith("str"):
        arg_text(name, value, optional=False)
    elif annotation.startswith("bool"):
        if not isinstance(value, (bool, np.bool_)):
            raise StudioAPIError(f"{name} must be True or False, got {short(value)}")
    elif annotation.startswith("int"):
        arg_whole(name, value, -INT64, INT64)
    elif annotation.startswith("float"):
        arg_number(name, value)
    elif annotation.startswith("Iterable[str]"):
        arg_texts(name, value)
