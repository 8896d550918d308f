"""The plots of the "Timeline & diff" tab: a prompt's reward, entropy and length over the
training steps (with a step marker that moves without a redraw), and the run diff's scatter of
per-prompt mean reward, A against B."""
from __future__ import annotations

import pandas as pd

from studio.queries import timeline as tl

from .base.plots import BAD_COLOR, ENTROPY_COLOR, LEGEND_TOP, OK_COLOR, holoviews, plot_opts, step_ticks
from .base.style import ACCENT

MAX_SCATTER = 5000  # points drawn in the diff scatter (a seeded sample past it; movers always drawn)
LENGTH_COLOR = "#495057"
STEP_COLOR = "#1f2937"
TIE_COLOR = "#adb5bd"
PLOT_H, SCATTER_H = 270, 400


def step_line(step: int | None, spans: dict | None):
    """A dotted line at ``step``. Its Bokeh ``Span`` is kept in ``spans`` when the plot is
    built, so a later step moves the line (``span.location``) without redrawing the plots."""
    hv = holoviews()

    def grab(plot, element):
        if spans is not None:
            span = plot.handles["glyph"]
            spans[id(span)] = span
    return hv.VLine(step if step is not None else 0).opts(
        color=STEP_COLOR, line_dash="dotted", line_width=1.5, alpha=1 if step is not None else 0, hooks=[grab])


X = ("train_step", "training step")
WITH_TOKENS = ("with_tokens", "completions with tokens")


def reward_plot(df: pd.DataFrame, step: int | None = None, spans: dict | None = None):
    """Mean reward with the min–max band of the step's completions, the accuracy share and
    the all-equal steps (hollow red), over the training steps."""
    hv = holoviews()
    hover = [("reward_min", "lowest reward"), ("reward_max", "highest reward"), ("accuracy", "accuracy share"),
             ("n", "completions")]
    eq = df[df["all_equal"].eq(True)]  # an object column: True, False or None (unscored)
    flat = [hv.Scatter(eq, X, [("reward_mean", "reward")], label="all equal").opts(
        fill_color="white", line_color=BAD_COLOR, marker="circle", size=9, line_width=1.5)] if len(eq) else []
    return hv.Overlay([
        hv.Area(df, X, [("reward_min", "reward"), ("reward_max", "reward max")], label="min–max").opts(
            color=ACCENT, alpha=0.13, line_alpha=0),
        hv.Curve(df, X, [("reward_mean", "reward"), *hover], label="mean").opts(color=ACCENT, line_width=2.2),
        hv.Scatter(df, X, [("reward_mean", "reward"), *hover]).opts(color=ACCENT, size=5, tools=["hover"]),
        hv.Curve(df, X, [("accuracy", "reward")], label="accuracy").opts(color=OK_COLOR, line_width=1.8,
                                                                         line_dash="dashed"),
        *flat, step_line(step, spans)]).opts(
        **plot_opts(title="Reward over steps", ylabel="reward · accuracy share", xlabel="training step", height=PLOT_H,
                padding=(0.03, 0.08), **LEGEND_TOP, **step_ticks()))


def entropy_plot(df: pd.DataFrame, step: int | None = None, spans: dict | None = None):
    """Mean token entropy over all tokens of each step's completions; a step without tokens
    is a gap (NaN), not a zero."""
    hv = holoviews()
    none = df["entropy"].isna().all()
    return hv.Overlay([
        hv.Curve(df, X, [("entropy", "nats"), WITH_TOKENS]).opts(color=ENTROPY_COLOR, line_width=2),
        hv.Scatter(df, X, [("entropy", "nats"), WITH_TOKENS]).opts(color=ENTROPY_COLOR, size=5, tools=["hover"]),
        step_line(step, spans)]).opts(
        **plot_opts(title="Token entropy: none stored" if none else "Mean token entropy",
                ylabel="nats", xlabel="training step", height=PLOT_H, padding=(0.03, 0.08), **step_ticks()))


def length_plot(df: pd.DataFrame, step: int | None = None, spans: dict | None = None):
    """Mean completion length (tokens) over the training steps."""
    hv = holoviews()
    return hv.Overlay([
        hv.Curve(df, X, [("length", "tokens")]).opts(color=LENGTH_COLOR, line_width=2),
        hv.Scatter(df, X, [("length", "tokens")]).opts(color=LENGTH_COLOR, size=5, tools=["hover"]),
        step_line(step, spans)]).opts(
        **plot_opts(title="Mean completion length", ylabel="tokens", xlabel="training step", height=PLOT_H,
                padding=(0.03, 0.08), **step_ticks()))


def scatter_points(d: tl.RunDiff, movers: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The shared prompts the scatter draws (a seeded sample past ``MAX_SCATTER``, the
    movers always in it) and the note saying so."""
    df = d.per_prompt.dropna(subset=["reward_a", "reward_b"])
    if len(df) <= MAX_SCATTER:
        return df, ""
    keep = set(movers["prompt_id"])
    rest = df[~df["prompt_id"].isin(keep)].sample(MAX_SCATTER - len(keep), random_state=0)
    return pd.concat([df[df["prompt_id"].isin(keep)], rest]), f" ({MAX_SCATTER:,} of {len(df):,} shown)"


def diff_scatter(df: pd.DataFrame, note: str = ""):
    """Per-prompt mean reward, A against B, with the diagonal; coloured by who is higher."""
    hv = holoviews()
    lo = float(min(df["reward_a"].min(), df["reward_b"].min())) if len(df) else 0.0
    hi = float(max(df["reward_a"].max(), df["reward_b"].max())) if len(df) else 1.0
    pad = (hi - lo) * 0.05 or 0.05
    vd = [("reward_b", "B"), "prompt", ("delta", "Δ")]
    x = ("reward_a", "mean reward, A")
    layers = [hv.Curve([(lo - pad, lo - pad), (hi + pad, hi + pad)], x, ("reward_b", "B"), label="B = A").opts(
        color="#868e96", line_dash="dashed", line_width=1)]
    for name, sel, color in (("B higher", df["delta"] > tl.EQUAL_TOL, ACCENT),
                             ("A higher", df["delta"] < -tl.EQUAL_TOL, BAD_COLOR),
                             ("equal", df["delta"].abs() <= tl.EQUAL_TOL, TIE_COLOR)):
        if sel.any():
            layers.append(hv.Scatter(df[sel], x, vd, label=name).opts(color=color, size=6, alpha=0.55,
                                                                      tools=["hover"]))
    return hv.Overlay(layers).opts(**plot_opts(
        title=f"Mean reward per shared prompt{note}", xlabel="mean reward, A", ylabel="mean reward, B",
        height=SCATTER_H, xlim=(lo - pad, hi + pad), ylim=(lo - pad, hi + pad), **LEGEND_TOP))
