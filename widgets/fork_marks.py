"""The token strip's fork marks: the legend lines that say in words what ▾ unsure and ◆ pivotal /
◇ branched mean (with the numbers), the card's lines of a token the tree branched at, their CSS,
and the read of a rollout's tree that the strip and the fork panel share."""
from __future__ import annotations

import pandas as pd

from studio.queries import forks
from studio.signals.forks import Threshold

from .base.style import esc
from .token_text import VISIBLE_WS, token_display


def branched_card_html(tried: forks.Fork | None) -> str:
    """The card's lines for a token the tree branched at: pivotal or not, the spread, each choice's value."""
    if tried is None:
        return ""
    verdict = "◆ pivotal" if tried.pivotal else "◇ branched"
    choices = " · ".join(
        f"{'as sampled' if b.token_id is None else token_display(b.label)[0].translate(VISIBLE_WS)} "
        f"{b.value:.2f} (n {b.n})" for b in tried.branches)
    return (f'<span class="c-row c-branched"><span class="c-k">{verdict}</span>'
            f'<b>spread {tried.spread:.2f}</b></span>'
            f'<span class="c-row"><span class="c-k">value</span><span>{esc(choices)}</span></span>')


def tree_key(rollout_id: str, refresh: int) -> tuple:
    """The key a rollout's tree and forks are read ahead under (the strip and the fork panel share it)."""
    return ("fork_tree", rollout_id, refresh)


def tree_forks(store, rollout_id: str, lineage: tuple | None) -> tuple[pd.DataFrame, list[forks.Fork]] | None:
    """The tree of ``rollout_id`` and its forks (:func:`studio.queries.forks.tree`, ``forks``); None
    for a rollout that is alone in its tree (``lineage`` ``(None, 0)``: most rollouts, one read)."""
    if lineage is None or lineage == (None, 0):
        return None
    tdf = forks.tree(store, rollout_id)
    return tdf, forks.forks(store, tdf)


def fork_key_html(thr: Threshold, branch: bool = False) -> str:
    """The legend line that says in words what ▾ means: the threshold, the share of the scope's
    tokens it marks, and which part of the rule decides it (``branch``: the shown rollout is judged
    as its tree's root)."""
    if thr.value is None:
        return '<div class="legend"><span class="lg-help">no token entropies in this scope: no token marked unsure</span></div>'
    rule = thr.rule
    whose = {"run": "the root's run" if branch else "this run", "step": "the root's training step" if branch
             else "this training step", "filter": "the table's filter"}[rule.scope]
    if rule.absolute is not None:
        why = "a fixed threshold"
    elif thr.floored:
        why = (f"the {rule.min_entropy:.2f}-nat minimum decides; the top {rule.q:.0%} of the tokens of {whose} "
               f"starts at {thr.quantile:.2g} nats")
    else:
        why = f"the top {rule.q:.0%} of the tokens of {whose} decides" + (
            f", above the {rule.min_entropy:.2f}-nat minimum" if rule.min_entropy > 0 else "")
    share = "" if thr.share is None else f" · {thr.share:.1%} of the {thr.n_tokens:,} tokens of {whose}"
    return (f'<div class="legend fork-key" data-threshold="{thr.value:.6g}"><span><span class="fork-mark"></span>'
            f'<span class="lg-name">unsure</span> entropy ≥ <b>{thr.value:.2f}</b> nats{esc(share)} · '
            f'click any token to branch there</span>'
            f'<span class="lg-help">where the policy split its choice: {esc(why)}</span></div>')


def branched_key_html(explored: dict[int, forks.Fork]) -> str:
    """The legend line for the tokens the rollout's tree has branched at ('' when none)."""
    if not explored:
        return ""
    n_pivotal = sum(f.pivotal for f in explored.values())
    text = (f'<span class="pivot-mark">◆</span> <span class="lg-name">pivotal</span> branching here moved the mean '
            f'reward by ≥ {forks.PIVOTAL_SPREAD:g} ({n_pivotal})')
    if len(explored) > n_pivotal:
        text += (f' · <span class="branched-mark">◇</span> branched, values within {forks.PIVOTAL_SPREAD:g} '
                 f'({len(explored) - n_pivotal})')
    return (f'<div class="legend fork-key branched-key"><span>{text}'
            ' <span class="muted">· hover one for the value of each choice</span></span></div>')


# the tree's marks on the strip (the ▾ of an unsure token is in ``widgets.base.style.CSS``)
FORK_CSS = """
.tok.pivot::after, .tok.branched::after { position:absolute; right:-4px; top:-10px; font-size:10px; line-height:1;
                                          font-family:'DejaVu Sans', sans-serif; pointer-events:none; }
.tok.pivot::after { content:"◆"; color:#e03131; }
.tok.branched::after { content:"◇"; color:#868e96; }
.tok.pivot { box-shadow:inset 0 0 0 1px #e03131; }
.pivot-mark { color:#e03131; font-size:11px; }
.branched-mark { color:#868e96; font-size:11px; }
.card .c-branched b { color:#c92a2a; }
"""
