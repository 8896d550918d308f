"""The HTML of the "Timeline & diff" tab: the run diff's summary line and movers, and one
step's completions (clickable rows), with the tab's stylesheet and number formats."""
from __future__ import annotations

import pandas as pd

from studio.queries import timeline as tl

from .base.style import SCALES, banner, chip, esc

TL_CSS = """
.tl-head { font-size:11px; font-weight:700; letter-spacing:.06em; color:#6b7280; text-transform:uppercase;
           margin:2px 0 0 0; }
table.tl { border-collapse:collapse; width:100%; font-size:12px; font-variant-numeric:tabular-nums;
           table-layout:fixed; }
table.tl th { text-align:left; color:#868e96; font-weight:600; font-size:11px; padding:2px 6px; }
table.tl td { padding:2px 6px; border-top:1px solid #f1f3f5; white-space:nowrap; overflow:hidden;
              text-overflow:ellipsis; }
table.tl tr.pick { cursor:pointer; } table.tl tr.pick:hover { background:#edf2ff; }
table.tl tr.selected td { background:#e7f5ff; }
table.tl td.mono { font-family:'DejaVu Sans Mono', monospace; font-size:11.5px; }
table.tl td.num { text-align:right; }
.movers { display:flex; flex-direction:column; gap:8px; }
.up { color:#1864ab; font-weight:700; } .down { color:#c92a2a; font-weight:700; }
.prompt-text { font-family:'DejaVu Sans Mono', monospace; font-size:12.5px; white-space:pre-wrap;
               background:#f8f9fa; border:1px solid #e9ecef; border-radius:6px; padding:4px 8px;
               max-height:4.6em; overflow:auto; }
.stat { white-space:nowrap; }
"""


def no_timeline_text(steps: int, config: dict | None, search: str = "") -> str:
    """Why a run with ``steps`` training steps has no prompt sampled at 2+ of them. For a
    mini-run (its settings in ``config``) with the numbers: a pool is drawn a pass at a time,
    so no prompt comes back before steps × prompts per step pass the pool's size."""
    if search:
        return f"No prompt of this run containing {search!r} was sampled at 2+ steps."
    n, per = (config or {}).get("n_prompts"), (config or {}).get("prompts_per_step")
    if not n or not per:
        return "No prompt of this run was sampled at 2+ steps: each step drew different prompts."
    drawn = steps * per
    return (f"No prompt of this run was sampled at 2+ steps: its {steps} steps drew {drawn:,} prompts from a pool "
            f"of {n:,} (n_prompts), a pass at a time, so none has come back yet. A mini-run whose steps × prompts "
            f"per step pass its pool's size (the defaults: 50 × 8 over 128) gives every prompt a timeline.")


def fmt_p(p: float) -> str:
    """A p-value as the summary prints it."""
    if p is None or pd.isna(p):
        return "–"
    return "< 0.0001" if p < 1e-4 else f"{p:.4f}"


def fmt_num(x: float | None, spec: str = "+.3f") -> str:
    if x is None or pd.isna(x):
        return "–"
    return format(round(float(x), 3) + 0.0, spec)


def summary_html(d: tl.RunDiff) -> str:
    """The diff's summary line (every number also in a ``data-`` attribute for tests)."""
    if d.shared == 0:
        return banner("info", f"No prompt is on both sides (A only: {d.only_a:,}, B only: {d.only_b:,}): "
                              "pick steps or runs that sampled the same prompts.")
    if d.n == 0:
        return banner("info", f"{d.shared:,} shared prompts, but no rewards on both sides under this rule version.")
    ci = "bootstrap" if d.ci_method == "bootstrap" else "normal approximation"
    delta_cls = "up" if d.mean_delta > 0 else "down" if d.mean_delta < 0 else ""
    return (
        f'<div class="meta-line diff-line" data-shared="{d.shared}" data-n="{d.n}" '
        f'data-delta="{d.mean_delta:.6f}" data-ci-lo="{d.ci_lo:.6f}" data-ci-hi="{d.ci_hi:.6f}" '
        f'data-p-wilcoxon="{d.p_wilcoxon:.6g}" data-p-sign="{d.p_sign:.6g}" data-wins="{d.wins}" '
        f'data-ties="{d.ties}" data-losses="{d.losses}">'
        f'<span class="stat"><b class="d-shared">{d.shared:,}</b> shared prompts '
        f'<span class="muted">(A only {d.only_a:,} · B only {d.only_b:,})</span></span>'
        f'<span class="stat">mean reward <b>{fmt_num(d.mean_a, ".3f")}</b> → <b>{fmt_num(d.mean_b, ".3f")}</b></span>'
        f'<span class="stat">Δ <b class="d-delta {delta_cls}">{fmt_num(d.mean_delta)}</b> '
        f'<span title="95% interval, paired {esc(ci)} over prompts">[<span class="d-ci">{fmt_num(d.ci_lo)}, '
        f'{fmt_num(d.ci_hi)}</span>]</span></span>'
        f'<span class="stat" title="Wilcoxon signed-rank test on per-prompt differences">Wilcoxon p '
        f'<b class="d-pw">{fmt_p(d.p_wilcoxon)}</b></span>'
        f'<span class="stat" title="sign test: wins against losses, ties left out">sign p '
        f'<b class="d-ps">{fmt_p(d.p_sign)}</b></span>'
        f'<span class="stat">win / tie / loss <b class="d-wtl">{d.wins:,} / {d.ties:,} / {d.losses:,}</b></span>'
        f'<span class="stat">accuracy <b class="d-acc">{fmt_num(d.accuracy_a, ".3f")} → '
        f'{fmt_num(d.accuracy_b, ".3f")}</b></span></div>')


def movers_html(m: pd.DataFrame) -> str:
    """Two tables side by side: prompts whose reward rose most (B over A) and fell most."""
    def table(rows: pd.DataFrame, title: str, cls: str) -> str:
        if rows.empty:
            body = '<tr><td colspan="5" class="empty">none</td></tr>'
        else:
            body = "".join(
                f'<tr class="pick mover" data-click="mover" data-value="{esc(r.prompt_id)}" title="{esc(r.prompt)}">'
                f'<td class="mono">{esc(r.prompt)}</td><td class="num">{fmt_num(r.reward_a, ".2f")}</td>'
                f'<td class="num">{fmt_num(r.reward_b, ".2f")}</td>'
                f'<td class="num {cls}">{fmt_num(r.delta, "+.2f")}</td>'
                f'<td class="num muted">{int(r.n_a)}/{int(r.n_b)}</td></tr>' for r in rows.itertuples())
        return (f'<div><div class="meta-line"><b>{esc(title)}</b></div><table class="tl">'
                '<colgroup><col><col style="width:46px"><col style="width:46px"><col style="width:52px">'
                '<col style="width:54px"></colgroup>'
                '<tr><th>prompt</th><th class="num">A</th><th class="num">B</th><th class="num">Δ</th>'
                f'<th class="num" title="completions A / B">n</th></tr>{body}</table></div>')
    up, down = m[m["direction"] == "up"], m[m["direction"] == "down"]
    return (f'<div class="movers">{table(up, "rose most (B above A)", "up")}'
            f'{table(down, "fell most (B below A)", "down")}</div>'
            '<div class="meta-line"><span class="muted">click a prompt to see its timeline above</span></div>')


def steps_html(df: pd.DataFrame, selected: str, prompt_id: str = "", step: int | None = None) -> str:
    """One step's completions (of ``prompt_id`` at ``step``); a click opens one in the token strip."""
    if df.empty:
        return '<div class="empty">No completions at this step.</div>'
    rows = []
    for r in df.itertuples():
        ok = "" if pd.isna(r.accuracy) else ('<b class="ok">✓</b>' if r.accuracy >= 1 else '<b class="bad">✗</b>')
        sel = " selected" if r.rollout_id == selected else ""
        adv = None if pd.isna(r.advantage) else float(r.advantage)
        ent = "no tokens" if pd.isna(r.entropy) else f"{r.entropy:.3f}"
        rows.append(
            f'<tr class="pick step-row{sel}" data-click="open" data-value="{esc(r.rollout_id)}">'
            f'<td class="muted">#{int(r.sample_idx) if not pd.isna(r.sample_idx) else "?"}</td><td>{ok}</td>'
            f'<td class="num">{fmt_num(r.reward, ".3f")}</td><td>{chip(adv, SCALES["advantage"])}</td>'
            f'<td class="num">{esc(ent)}</td><td class="num">{"–" if pd.isna(r.n_tokens) else int(r.n_tokens)}</td>'
            f'<td class="muted">{esc(r.finish_reason or "")}</td><td class="mono" title="{esc(r.text)}">'
            f'{esc(r.text)}</td></tr>')
    return (f'<table class="tl steps" data-prompt="{esc(prompt_id)}" data-step="{esc(step)}">'
            '<colgroup><col style="width:34px"><col style="width:30px"><col style="width:58px">'
            '<col style="width:70px"><col style="width:80px"><col style="width:52px"><col style="width:52px"><col>'
            '</colgroup><tr><th></th><th></th><th class="num">reward</th><th>advantage</th>'
            '<th class="num">entropy</th><th class="num">tokens</th><th>finish</th><th>completion</th></tr>'
            + "".join(rows) + "</table>")


def prompt_info_html(df: pd.DataFrame, text: str | None) -> str:
    """The timeline's prompt line: its text, the steps it was seen at, its reward and accuracy
    from the first step to the last (``df``: ``studio.queries.timeline.prompt_timeline``)."""
    if not len(df):
        return '<div class="empty">This prompt has no rollouts at a training step here.</div>'
    steps = [int(s) for s in df["train_step"]]
    first, last = df.iloc[0], df.iloc[-1]
    no_tok = int((df["with_tokens"] == 0).sum())
    return (
        f'<div class="prompt-text">{esc(text or "")}</div>'
        f'<div class="meta-line"><span>seen at <b>{len(df)}</b> steps ({steps[0]}–{steps[-1]})</span>'
        f'<span><b>{int(df["n"].sum()):,}</b> completions</span>'
        f'<span>mean reward <b>{fmt_num(first.reward_mean, ".3f")}</b> → <b>{fmt_num(last.reward_mean, ".3f")}'
        f'</b></span><span>accuracy <b>{fmt_num(first.accuracy, ".2f")}</b> → '
        f'<b>{fmt_num(last.accuracy, ".2f")}</b></span>'
        f'<span>all-equal steps <b>{int(df["all_equal"].eq(True).sum())}</b></span>'
        + (f'<span class="muted">{no_tok} step{"s" if no_tok > 1 else ""} without tokens (entropy not '
           'known)</span>' if no_tok else "")
        + '</div>')
