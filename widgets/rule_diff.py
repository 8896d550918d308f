"""A rule diff drawn: the summary line whose counts switch the list, the list of changes (identical
ones folded into counted lines, filtered to sign flips, all-equal changes or one component, each
opening onto its rollouts) and the histogram of rewards under both versions. The Reward rules tab
shows them; the Reward hacking and Advantages tabs share the tables' CSS."""
from __future__ import annotations

import numpy as np

from studio.rewards import diff_views, rules
from studio.signals.advantages import ESTIMATORS

from .base.plots import holoviews, plot_opts
from .base.style import esc

DIFF_CSS = """
table.diff { border-collapse:collapse; width:100%; font-size:12px; }
table.diff th { text-align:left; color:#868e96; font-weight:600; font-size:11px; padding:2px 6px; }
table.diff td { padding:2px 6px; border-top:1px solid #f1f3f5; white-space:nowrap; }
table.diff tr.diff-row { cursor:pointer; } table.diff tr.diff-row:hover { background:#edf2ff; }
table.diff.fit { table-layout:fixed; }
table.diff.fit td, table.diff.fit th { overflow:hidden; text-overflow:ellipsis; }
table.diff.fit td.mono { white-space:nowrap; }  /* one line per rollout, newlines and all */
td.mono { font-family:'DejaVu Sans Mono', monospace; white-space:pre; }
.flip { color:#c92a2a; font-weight:700; }
.banner.ok { background:#ebfbee; border:1px solid #8ce99a; color:#2b8a3e; }
pre.errs { background:#fff5f5; border:1px solid #ffa8a8; color:#a61e4d; padding:6px 8px; border-radius:6px;
           font-size:12px; white-space:pre-wrap; }
"""


CHANGES_CSS = """
.diff-summary .pick { cursor:pointer; border-bottom:1px dotted #868e96; }
.diff-summary .pick:hover { color:var(--accent); }
.changes { font-size:12px; }
.change-head, details.change > summary, .change.more {
  display:grid; grid-template-columns:64px 74px 150px 84px minmax(0, 1fr); gap:8px; padding:3px 6px; }
.change-head { color:#868e96; font-weight:600; font-size:11px; }
details.change, .change.more { border-top:1px solid #f1f3f5; }
details.change > summary { cursor:pointer; list-style:none; }
details.change > summary::-webkit-details-marker { display:none; }
details.change > summary:hover { background:#edf2ff; }
details.change > summary .n::before { content:"▸ "; color:#868e96; }
details.change[open] > summary .n::before { content:"▾ "; }
details.change > table { margin:0 0 6px 20px; width:calc(100% - 20px); }
.change.more { color:#868e96; }
.change.more span { grid-column:1 / -1; }
.ell { overflow:hidden; text-overflow:ellipsis; white-space:nowrap; }
ul.groups { font-size:12px; margin:4px 0; padding-left:18px; }
ul.groups li { overflow:hidden; text-overflow:ellipsis; white-space:nowrap; }
.section-title { font-weight:600; font-size:13px; color:#343a40; border-top:1px solid #dee2e6; padding-top:8px;
                 margin-top:8px; }
"""


def _signed(x: float) -> str:
    return "–" if x is None or x != x else f"{x:+.3f}"


def summary_html(d: rules.Diff) -> str:
    """The diff's counts; the ones that name a view of the list pick it when clicked."""
    if d.rows.empty:
        return '<div class="empty">No rollout is scored by both versions yet.</div>'
    est = ESTIMATORS[d.estimator].label if d.estimator in ESTIMATORS else d.estimator

    def pick(show: str, html: str) -> str:
        return f'<span class="pick" data-click="show" data-value="{show}" title="list them">{html}</span>'

    moved = len(d.became_all_equal) + len(d.stopped_all_equal)
    comps = diff_views.component_changes(d)
    parts = [f"{c.component} {c.changed:,}" + ("" if c.in_a and c.in_b else " (A only)" if c.in_a else " (B only)")
             for c in comps.itertuples()]
    return (f'<div class="meta-line diff-summary"><span><b>{len(d.rows):,}</b> rollouts scored by both</span>'
            + pick("changed", f"<b>{len(d.changed):,}</b> changed reward")
            + pick("flips", f'<b class="bad">{len(d.sign_flips):,}</b> advantage changed sign')
            + pick("all_equal", f"<b>{len(d.became_all_equal):,}</b> groups became all-equal, "
                                f"<b>{len(d.stopped_all_equal):,}</b> stopped being" if moved else
                   "<b>0</b> groups changed all-equal state")
            + f'<span>mean reward {d.rows["reward_a"].mean():.3f} → {d.rows["reward_b"].mean():.3f}</span>'
            + f'<span class="version">advantages: {esc(est)}</span></div>'
            + (f'<div class="meta-line components"><span>changed per component: {esc(" · ".join(parts))}</span></div>'
               if parts else ""))


def _rollout_rows(rows, ids: list[str]) -> str:
    return "".join(
        f'<tr class="diff-row" data-click="open" data-value="{esc(r.rollout_id)}">'
        f'<td class="mono" title="{esc(r.prompt)}">{esc(r.prompt)}</td>'
        f'<td class="mono" title="{esc(r.completion)}">{esc(r.completion)}</td>'
        f'<td>{_signed(r.advantage_a)} → {_signed(r.advantage_b)}</td>'
        f'<td>{"<span class=flip>sign flip</span>" if r.sign_flip else ""}</td></tr>'
        for r in rows.loc[ids].reset_index().itertuples(index=False))


LISTED = {"changed": "changed reward", "flips": "advantage changed sign", "all_equal": "all-equal state changed",
          "all": "all scored"}  # what the rollouts of each view are, in the list's count line


EMPTY = {"changed": "No reward changed.", "flips": "No rollout's advantage changed sign.",
         "all_equal": "No group became or stopped being all-equal.", "all": "No rollout is scored by both versions."}


def changes_html(d: rules.Diff, show: str = "changed", component: str | None = None, limit: int = 30,
                 per_line: int = 10, open_under: int = 12) -> str:
    """The rollouts of view ``show`` (and ``component``), identical changes folded into one
    counted line (``data-n``: its count; the lines' counts add up to the rollouts listed) that
    opens onto its first ``per_line`` rollouts; every line starts open when there are at most
    ``open_under`` rollouts."""
    if d.rows.empty:
        return ""
    rows = diff_views.pick(d, show, component)
    what = LISTED[show] + (f" · component {component}" if component else "")
    groups = ""
    if show == "all_equal":
        items = [f'<li>{label}: <span class="link" data-click="group" data-value="{esc(g.group_id)}">open group'
                 f'</span> {esc(g.prompt)}</li>' for frame, label in [(d.became_all_equal, "became all-equal"),
                                                                     (d.stopped_all_equal, "stopped being all-equal")]
                 for g in frame.head(10).itertuples()]
        groups = f'<ul class="groups">{"".join(items)}</ul>'
    if rows.empty:
        return groups + f'<div class="empty">{esc(EMPTY[show])}</div>'
    lines = diff_views.collapse(rows)
    by_id = rows.set_index("rollout_id")
    head = (f'<div class="meta-line changes-count"><span><b>{len(rows):,}</b> rollouts ({esc(what)}) in '
            f'<b>{len(lines):,}</b> distinct changes, the most common first; open one for its rollouts</span></div>')
    opened = " open" if len(rows) <= open_under else ""
    out = []
    for ln in lines.head(limit).itertuples():
        first = by_id.loc[ln.rollout_ids[0]]
        more = (f'<div class="meta-line">first {per_line} of {ln.n:,}</div>' if ln.n > per_line else "")
        out.append(
            f'<details class="change" data-n="{ln.n}"{opened}><summary><span class="n">×{ln.n:,}</span>'
            f'<span>{_signed(ln.delta)}</span><span>{ln.reward_a:.3f} → <b>{ln.reward_b:.3f}</b></span>'
            f'<span class="flip">{f"{ln.flips:,} flipped" if ln.flips else ""}</span>'
            f'<span class="ell mono" title="{esc(first.prompt)}">{esc(first.prompt)}</span></summary>'
            f'<table class="diff fit"><colgroup><col style="width:38%"><col style="width:34%"><col style="width:17%">'
            f'<col style="width:11%"></colgroup><tr><th>prompt</th><th>completion</th><th>advantage A → B</th><th></th>'
            f'</tr>{_rollout_rows(by_id, ln.rollout_ids[:per_line])}</table>{more}</details>')
    rest = lines.iloc[limit:]
    if len(rest):
        out.append(f'<div class="change more" data-n="{int(rest["n"].sum())}"><span>… and {len(rest):,} more '
                   f'distinct changes over {int(rest["n"].sum()):,} rollouts (pick a component or a view to '
                   f'narrow the list)</span></div>')
    return (groups + head + '<div class="changes"><div class="change-head"><span>rollouts</span><span>Δ reward</span>'
            '<span>reward A → B</span><span>sign flips</span><span>prompt (the first)</span></div>'
            + "".join(out) + "</div>")


def reward_hist(d: rules.Diff):
    """Reward distributions under A and B, overlaid."""
    hv = holoviews()
    lo = float(min(d.rows["reward_a"].min(), d.rows["reward_b"].min()))
    hi = float(max(d.rows["reward_a"].max(), d.rows["reward_b"].max()))
    hi = hi if hi > lo else lo + 1.0
    edges = np.linspace(lo, hi, 25)
    ca, _ = np.histogram(d.rows["reward_a"], edges)
    cb, _ = np.histogram(d.rows["reward_b"], edges)
    a = hv.Histogram((edges, ca), kdims=["reward"], vdims=["rollouts"], label="A").opts(alpha=0.45, color="#868e96")
    b = hv.Histogram((edges, cb), kdims=["reward"], vdims=["rollouts"], label="B").opts(alpha=0.55, color="#3b5bdb")
    return (a * b).opts(**plot_opts(title="Reward distribution, A (grey) and B (blue)", height=220,
                                    legend_position="top_right"))
