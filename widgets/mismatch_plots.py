"""What the Mismatch tab draws, from the frames ``studio.queries.mismatch`` returns: plots of Δ
(histogram, by position, by entropy, by token frequency, per training step), and the HTML of
the worst tokens in context, the share each preset would clip / mask / reject, and the two
engines compared with the known causes the data shows.

Pure functions of frames (no store, no session), so they are tested without a page. One colour
means one thing in every plot of the tab: Δ's own red for mean |Δ|, purple for the k3 estimate,
grey for the p99 tail; kept / clipped / masked / rejected keep their colours in the shares table.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .base.plots import LEGEND_TOP, holoviews, plot_opts, step_ticks
from .base.style import SCALES, esc
from .token_text import VISIBLE_WS, num, token_display

DELTA_COLOR = SCALES["mismatch"].stops[-1]  # mean |Δ|: the mismatch scale's own red
K3_COLOR = "#7048e8"  # the k3 KL estimate
P99_COLOR = "#868e96"  # the tail: 99th percentile of |Δ|
STATE_COLORS = {"kept": "#ced4da", "clipped": "#f59f00", "masked": "#e03131", "rejected": "#862e9c"}

MISMATCH_CSS = """
table.mm { border-collapse:collapse; width:100%; font-size:12px; }
table.mm th { text-align:left; color:#868e96; font-weight:600; font-size:11px; padding:2px 6px; }
table.mm td { padding:2px 6px; border-top:1px solid #f1f3f5; }
table.mm tr.mm-row, table.mm tr.mm-step { cursor:pointer; }
table.mm tr.mm-row:hover, table.mm tr.mm-step:hover { background:#edf2ff; }
table.mm tr.own { background:#edf2ff; font-weight:600; }
td.ctx { font-family:'DejaVu Sans Mono', monospace; color:#868e96; white-space:pre; overflow:hidden;
         text-overflow:ellipsis; max-width:260px; }
td.ctx b { color:#212529; background:#fff3bf; padding:0 2px; border-radius:2px; }
span.bar { display:inline-block; height:9px; vertical-align:middle; }
div.cause { border-left:3px solid #e03131; padding:2px 8px; margin:4px 0; font-size:12.5px; }
div.cause .fix { color:#495057; }
"""


def _no_plot(message: str):
    """An empty plot whose title says why (a pane keeps its size; nothing looks broken)."""
    hv = holoviews()
    return hv.Curve([]).opts(**plot_opts(title=message, xaxis=None, yaxis=None))


def histogram(hist: pd.DataFrame):
    """Δ's histogram (columns ``lo``, ``hi``, ``tokens``) on a log count axis, 0 marked."""
    hv = holoviews()
    if hist.empty:
        return _no_plot("No Δ in this scope")
    edges = np.append(hist["lo"].to_numpy(float), float(hist["hi"].iloc[-1]))
    counts = np.where(hist["tokens"].to_numpy(float) > 0, hist["tokens"].to_numpy(float), np.nan)
    top = float(np.nanmax(counts)) if np.isfinite(counts).any() else 1.0
    plot = hv.Histogram((edges, counts), kdims=["Δ = log π_train − log π_behaviour"], vdims=["tokens"]).opts(
        **plot_opts(color=DELTA_COLOR, line_color="white", logy=True, ylim=(0.5, top * 2),
                    title="Δ, nats (log count)"))
    return plot * hv.VLine(0.0).opts(color="#1f2937", line_dash="dotted", line_width=1)


def by_position(df: pd.DataFrame):
    """Mean |Δ| by token position (columns ``pos``, ``mean_abs_delta``, ``tokens``)."""
    if df.empty:
        return _no_plot("Mean |Δ| by position: no Δ")
    hv = holoviews()
    return hv.Curve(df, "pos", ["mean_abs_delta", "tokens"]).opts(
        **plot_opts(color=DELTA_COLOR, line_width=2, title="Mean |Δ| by token position", xlabel="position",
                    ylabel="nats"))


def _bars(df: pd.DataFrame, key: str, title: str, xlabel: str):
    if df.empty:
        return _no_plot(f"{title}: no Δ")
    hv = holoviews()
    frame = df.assign(**{key: df[key].astype(str)})
    return hv.Bars(frame, (key, xlabel), ["mean_abs_delta", "tokens"]).opts(
        **plot_opts(color=DELTA_COLOR, title=title, ylabel="mean |Δ|, nats", xrotation=30, yformatter="%.3g"))


def by_entropy(df: pd.DataFrame):
    """Mean |Δ| by the token's entropy (columns ``entropy`` (a bin label), ``mean_abs_delta``, ``tokens``):
    the forking tokens, where the policy was unsure, carry most of the mismatch."""
    return _bars(df, "entropy", "Mean |Δ| by entropy (forking tokens)", "entropy decile (upper edge), nats")


def by_frequency(df: pd.DataFrame):
    """Mean |Δ| by how often the token occurs in the scope (columns ``frequency`` (a bin label),
    ``mean_abs_delta``, ``tokens``)."""
    return _bars(df, "frequency", "Mean |Δ| by token frequency", "occurrences of the token in the scope")


def drift(df: pd.DataFrame):
    """Mean |Δ|, k3 and p99 |Δ| per training step (columns ``step``, ``mean_abs_delta``, ``k3``, ``p99``),
    with a legend above the plot."""
    if df.empty:
        return _no_plot("No training steps in this scope")
    hv = holoviews()
    lines = [(hv.Curve(df, "step", (col, "nats"), label=label).opts(color=color, line_width=2)
              * hv.Scatter(df, "step", (col, "nats"), label=label).opts(color=color, size=6))
             for col, label, color in (("mean_abs_delta", "mean |Δ|", DELTA_COLOR), ("k3", "k3 (KL estimate)", K3_COLOR),
                                       ("p99", "p99 |Δ|", P99_COLOR))]
    return hv.Overlay(lines).opts(**plot_opts(title="Mismatch per training step (drift)", xlabel="training step",
                                              ylabel="nats", **LEGEND_TOP, **step_ticks()))


def delta_chip(v: float) -> str:
    """Δ as a badge in the mismatch channel's colours, to the thousandth of a nat (Δ is often small)."""
    if v is None or v != v:
        return '<span class="chip" style="background:#f1f3f5">–</span>'
    bg, fg = SCALES["mismatch"].colors(v)
    return f'<span class="chip" style="background:{bg};color:{fg}">{float(v):+.3f}</span>'


def small(v: float) -> str:
    """A value that may be far below 0.001 (a k3 estimate), to two significant digits."""
    return "–" if v is None or v != v else f"{float(v):.2g}"


def distinct_worst(df: pd.DataFrame) -> pd.DataFrame:
    """One row per token in its context: a group's rollouts share their first tokens, so the same token at
    the same place with the same Δ would otherwise fill the list; ``rollouts`` counts how many have it."""
    if df.empty:
        return df.assign(rollouts=pd.Series(dtype=int))
    df = df.reset_index(drop=True)
    key = ["pos", "token_text", "before", df["delta"].round(4).rename("d4")]
    groups = df.groupby(key, sort=False, dropna=False)
    out = df.loc[groups.head(1).index].copy()
    out["rollouts"] = groups["rollout_id"].transform("size").loc[out.index].to_numpy()
    return out


def _context(text: object, keep: int, tail: bool) -> str:
    s = text if isinstance(text, str) else ""
    s = s[-keep:] if tail else s[:keep]
    return esc(s.translate(VISIBLE_WS))


def worst_html(df: pd.DataFrame, title: str = "Worst tokens") -> str:
    """The worst tokens by |Δ| in context (columns ``rollout_id``, ``pos``, ``token_text``, ``delta``,
    ``logprob``, ``train_logprob``, ``before``, ``after``), one row per token in its context
    (:func:`distinct_worst`); a click opens the first rollout with it at that token."""
    if df.empty:
        return f'<div class="empty">{esc(title)}: no Δ in this scope.</div>'
    rows = []
    for r in distinct_worst(df).itertuples(index=False):
        tok = esc(token_display(r.token_text)[0].translate(VISIBLE_WS))
        rows.append(f'<tr class="mm-row" data-click="token" data-value="{esc(r.rollout_id)}:{int(r.pos)}" '
                    f'title="open {esc(r.rollout_id)} at token {int(r.pos)}">'
                    f'<td class="ctx">…{_context(r.before, 14, True)}<b>{tok}</b>{_context(r.after, 10, False)}…</td>'
                    f'<td>{int(r.pos)}</td><td>{int(r.rollouts)}</td><td>{delta_chip(r.delta)}</td>'
                    f'<td>{num(np.exp(r.logprob))}</td><td>{num(np.exp(r.train_logprob))}</td></tr>')
    return (f'<div class="meta-line"><b>{esc(title)}</b> (by |Δ|; click one to open it in the token strip)</div>'
            '<table class="mm worst"><tr><th>token in context</th><th>pos</th><th>rollouts</th><th>Δ</th><th>p behaviour</th>'
            '<th>p train</th></tr>' + "".join(rows) + "</table>")


def _share_cell(v: float, state: str) -> str:
    if not np.isfinite(v):
        return "<td>–</td>"
    return (f'<td><span class="bar" style="width:{max(v, 0.0) * 60:.1f}px; background:{STATE_COLORS[state]}"></span> '
            f'{v:.1%}</td>')


def shares_html(df: pd.DataFrame, own: str) -> str:
    """Per correction (column ``preset``; ``own`` names the sidebar's, highlighted) the share of tokens
    ``clipped`` and ``masked`` and of sequences ``rejected`` (NaN: the method does not do that)."""
    if df.empty:
        return '<div class="empty">No Δ in this scope: no correction to weigh.</div>'
    legend = " ".join(f'<span><span class="bar" style="width:10px; background:{STATE_COLORS[s]}"></span> {s}</span>'
                      for s in ("clipped", "masked", "rejected"))
    rows = "".join(f'<tr class="{"own" if r.preset == own else ""}"><td>{esc(r.preset)}</td>'
                   + _share_cell(float(r.clipped), "clipped") + _share_cell(float(r.masked), "masked")
                   + _share_cell(float(r.rejected), "rejected") + "</tr>" for r in df.itertuples(index=False))
    return (f'<div class="meta-line"><b>What each correction would do here</b>{legend}</div>'
            '<table class="mm shares"><tr><th>correction</th><th>tokens clipped</th><th>tokens masked</th>'
            '<th>sequences rejected</th></tr>' + rows + "</table>")


def steps_html(df: pd.DataFrame, picked: int | None) -> str:
    """The steps of the drift as a clickable list (a click lists that step's worst tokens)."""
    if df.empty:
        return ""
    rows = "".join(f'<tr class="mm-step{" own" if picked == int(r.step) else ""}" data-click="step" '
                   f'data-value="{int(r.step)}"><td>step {int(r.step)}</td><td>{num(r.mean_abs_delta)}</td>'
                   f'<td>{small(r.k3)}</td><td>{num(r.p99)}</td><td>{int(r.tokens):,}</td></tr>'
                   for r in df.itertuples(index=False))
    return ('<table class="mm steps"><tr><th>step (click: its worst tokens)</th><th>mean |Δ|</th><th>k3</th>'
            '<th>p99 |Δ|</th><th>tokens</th></tr>' + rows + "</table>")


def engines_html(engines: pd.DataFrame, causes: list) -> str:
    """The engine pairs of the scope (columns ``engine``, ``train_engine``, ``rollouts``, ``tokens``,
    ``mean_delta``, ``mean_abs_delta``) and the known causes the data shows (``signals.mismatch.Cause``:
    name, evidence, fix)."""
    if engines.empty:
        return ""
    rows = "".join(f'<tr><td class="mono">{esc(r.engine if isinstance(r.engine, str) else "unknown")}</td>'
                   f'<td class="mono">{esc(r.train_engine if isinstance(r.train_engine, str) else "unknown")}</td>'
                   f'<td>{int(r.rollouts):,}</td><td>{int(r.tokens):,}</td><td>{delta_chip(r.mean_delta)}</td>'
                   f'<td>{num(r.mean_abs_delta)}</td></tr>' for r in engines.itertuples(index=False))
    found = ("".join(f'<div class="cause"><b>{esc(c.name)}</b>: {esc(c.evidence)}<div class="fix">What to do: '
                     f'{esc(c.fix)}</div></div>' for c in causes)
             or '<div class="meta-line"><span>No known cause shows in this data (no constant offset, no '
                'first-token outlier, no tool tokens with Δ, the same weights on both sides).</span></div>')
    return ('<div class="meta-line"><b>Engines compared on the same rollouts</b></div>'
            '<table class="mm engines"><tr><th>behaviour engine (sampled, logprob)</th>'
            '<th>recomputing engine (train_logprob)</th><th>rollouts</th><th>tokens</th><th>mean Δ</th>'
            '<th>mean |Δ|</th></tr>' + rows + "</table>" + found)
