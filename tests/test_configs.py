"""One mechanism turns a config dataclass into command-line options and form widgets."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest

from studio.configs import add_arguments, from_arguments, problems, setting, settings_of
from widgets.forms import form_values, form_widgets


@dataclass
class Demo:
    n: int = setting(8, "completions per prompt", 1, 64)
    temperature: float = setting(1.0, "sampling temperature", 0.0, 5.0)
    margin: float | None = setting(None, "minimum reward gap (none: any)", 0.0, None)
    estimator: str = setting("grpo", "advantage estimator", choices=("grpo", "rloo"))
    overlap: bool = setting(True, "sample while training")
    rewards: tuple[str, ...] = setting((), "reward columns", flag="--reward")


def test_settings_read_types_bounds_choices_and_flags():
    s = {x.name: x for x in settings_of(Demo)}
    assert (s["n"].kind, s["n"].bounds) == (int, (1, 64))
    assert (s["margin"].kind, s["margin"].optional) == (float, True)
    assert s["estimator"].choices == ("grpo", "rloo") and s["overlap"].kind is bool
    assert s["rewards"].kind is tuple and s["rewards"].flag == "--reward"


def test_problems_name_every_bad_setting():
    assert problems(Demo()) == []
    assert problems(Demo(margin=float("nan"))) == ["margin must be a number, got nan"]
    bad = problems(Demo(n=0, temperature=9.0, estimator="ppo", margin=-1.0))
    assert bad == ["n must be 1-64, got 0", "temperature must be 0-5, got 9.0",
                   "margin must be at least 0, got -1.0", "estimator must be one of grpo, rloo, got 'ppo'"]


def test_command_line_round_trip():
    ap = argparse.ArgumentParser()
    add_arguments(ap, Demo)
    assert from_arguments(Demo, ap.parse_args(["--overlap", "false"])).overlap is False  # a value, as before
    assert from_arguments(Demo, ap.parse_args(["--overlap"])).overlap is True
    args = ap.parse_args(["--n", "4", "--no-overlap", "--estimator", "rloo", "--reward", "a", "--reward", "b",
                          "--margin", "0.5"])
    assert from_arguments(Demo, args) == Demo(n=4, overlap=False, estimator="rloo", rewards=("a", "b"), margin=0.5)
    assert from_arguments(Demo, ap.parse_args([])) == Demo()
    with pytest.raises(SystemExit):
        ap.parse_args(["--estimator", "ppo"])  # choices are enforced by the parser too


def test_form_widgets_round_trip():
    import panel as pn

    w = form_widgets(Demo, Demo(n=3, rewards=("x",)))
    assert isinstance(w["n"], pn.widgets.IntInput) and (w["n"].start, w["n"].end, w["n"].value) == (1, 64, 3)
    assert isinstance(w["estimator"], pn.widgets.Select) and isinstance(w["overlap"], pn.widgets.Checkbox)
    assert w["temperature"].description == "sampling temperature"
    w["margin"].value = "0.25"
    assert Demo(**form_values(Demo, w)) == Demo(n=3, rewards=("x",), margin=0.25)
