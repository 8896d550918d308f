"""A token's hover card in the token strip: the token, its statistics, its top-k alternatives (a
policy's token), or what it is (a tool response's token: masked, no statistics); and such a masked
token as the strip draws it, greyed."""
from __future__ import annotations

import math

import pandas as pd

from studio.queries.forks import Fork

from .base.style import esc
from .fork_marks import branched_card_html
from .token_text import VISIBLE_WS, num, token_display


def text_of(row) -> str:
    """A token's text; ``#id`` for one imported with its id alone (enriching fills the text)."""
    t = row.token_text
    return t if isinstance(t, str) else f"#{'' if row.token_id is None or row.token_id != row.token_id else int(row.token_id)}"


def listed(cell) -> list:
    """A list cell as a list: [] for NULL (imported tokens come without top-k alternatives)."""
    return [] if cell is None or cell is pd.NA or (isinstance(cell, float) and cell != cell) else list(cell)


def card_html(row, channel: str, value: float | None, alts: list[str] | None, step: int | None,
              is_fork: bool = False, tried: Fork | None = None) -> str:
    """The hover card of one of the policy's tokens: the token, where it is, its log-prob, probability and
    entropy (the channel's value bold), the values of the branches tried there, its top-k alternatives."""
    p = math.exp(row.logprob) if row.logprob is not None else float("nan")
    rows = []
    ids, lps = listed(row.topk_ids), listed(row.topk_logprobs)
    for j, (tid, lp) in enumerate(zip(ids, lps)):
        q = math.exp(lp)
        alt = alts[j] if alts else f"#{tid}"
        alt_shown, _ = token_display(alt)
        chosen = ' class="chosen"' if tid == row.token_id else ""
        rows.append(f'<tr{chosen}><td class="alt">{esc(alt_shown.translate(VISIBLE_WS))}</td>'
                    f'<td><span class="pbar" style="width:{max(1, round(q * 80))}px"></span></td>'
                    f'<td style="text-align:right">{num(q)}</td></tr>')
    where = f"pos {row.pos}" + (f" · step {step + 1}" if step is not None else "") + (" · unsure" if is_fork else "")
    stats = [("log-prob", num(row.logprob), channel == "logprob"), ("p(token)", num(p), False),
             ("entropy", num(row.entropy) + (" nats" if row.entropy == row.entropy and row.entropy is not None else ""),
              channel == "entropy")]
    if channel in ("advantage", "weight"):
        stats.append((channel, "–" if value is None else num(value, "+.3f"), True))
    lines = "".join(f'<span class="c-row"><span class="c-k">{k}</span>{"<b>" if bold else "<span>"}{esc(v)}'
                    f'{"</b>" if bold else "</span>"}</span>' for k, v, bold in stats)  # keys: fixed, safe text
    return (f'<span class="card"><span class="c-row"><span class="c-tok">{esc(text_of(row).translate(VISIBLE_WS))}</span>'
            f'<span class="c-k">{esc(where)}</span></span>{lines}{branched_card_html(tried)}'
            f'<table><tr><td class="c-k" colspan="3">top-{len(ids)} alternatives</td></tr>{"".join(rows)}</table></span>')


def masked_card_html(row) -> str:
    """The hover card of a token the policy did not write (a tool response's): not trained, no statistics."""
    return (f'<span class="card"><span class="c-row"><span class="c-tok">{esc(text_of(row).translate(VISIBLE_WS))}'
            f'</span><span class="c-k">pos {row.pos}</span></span><span class="c-row"><span class="c-k">masked</span>'
            '<span>not trained · no statistics</span></span></span>')


def masked_html(rows: list, trained: list[bool], i: int, compact: bool) -> str:
    """A token the policy did not write, greyed: its text and card, or, ``compact``, one chip for the run
    of such tokens it starts (nothing for the others of the run)."""
    row = rows[i]
    if not compact:
        shown, _ = token_display(text_of(row))
        return f'<span class="tok masked" data-pos="{row.pos}">{esc(shown)}{masked_card_html(row)}</span>'
    if i > 0 and not trained[i - 1]:
        return ""
    n = next((j for j in range(i, len(rows)) if trained[j]), len(rows)) - i
    return f'<span class="tok masked-run" title="tool response: {n} tokens, masked (not trained)">⚙ {n} tok</span>'
