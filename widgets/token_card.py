"""A token's hover card in the token strip: the token, its statistics, its mismatch (both log-probs and
probabilities, Δ, the ratio, the rank under each policy, the correction's verdict) where it has a
recomputed log-prob, its top-k alternatives (a policy's token), or what it is (a tool response's token: masked, no statistics); and such a masked
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


def behaviour_rank(row) -> str:
    """The sampled token's rank under the sampler from its top-k alternatives ("> k" beyond them)."""
    ids, lps = listed(row.topk_ids), listed(row.topk_logprobs)
    if not ids:
        return "–"
    if row.token_id not in ids:
        return f"> {len(ids)}"
    own = lps[ids.index(row.token_id)]
    return str(1 + sum(lp > own for lp in lps))


def mismatch_html(row, verdict: str | None, bold: bool) -> str:
    """The card's mismatch lines of a token with Δ: behaviour and train log-prob, probability and rank,
    Δ and the ratio, the correction's verdict (``verdict``: its words); "" for a token without Δ."""
    d = getattr(row, "mismatch", None)
    if d is None or d != d:
        return ""
    rank = getattr(row, "train_rank", None)
    train_rank = "–" if rank is None or rank != rank else str(int(rank))
    cells = "".join(f'<tr><td class="c-k">{k}</td><td>{esc(num(lp))}</td><td>{esc(num(math.exp(lp)))}</td>'
                    f'<td>{esc(r)}</td></tr>' for k, lp, r in (("behaviour", row.logprob, behaviour_rank(row)),
                                                              ("train", row.train_logprob, train_rank)))
    out = (f'<table class="mm-lp"><tr class="c-k"><td></td><td>log-prob</td><td>p</td><td>rank</td></tr>{cells}</table>'
           f'<span class="c-row"><span class="c-k">Δ · ratio</span>{"<b>" if bold else "<span>"}{d:+.4f} · '
           f'{math.exp(d):.4g}{"</b>" if bold else "</span>"}</span>')
    if verdict:
        kind = "rejected" if verdict.startswith("in a") else verdict.split()[0]
        out += (f'<span class="c-row"><span class="c-k">correction</span>'
                f'<span class="mm-verdict {esc(kind)}">{esc(verdict)}</span></span>')
    return f'<span class="c-sec mm-card" style="display:block">{out}</span>'


def card_html(row, channel: str, value: float | None, alts: list[str] | None, step: int | None,
              is_fork: bool = False, tried: Fork | None = None, verdict: str | None = None) -> str:
    """The hover card of one of the policy's tokens: the token, where it is, its log-prob, probability and
    entropy (the channel's value bold), its mismatch where it has Δ (:func:`mismatch_html`, ``verdict``
    the correction's in words), the values of the branches tried there, its top-k alternatives."""
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
            f'<span class="c-k">{esc(where)}</span></span>{lines}{mismatch_html(row, verdict, channel == "mismatch")}'
            f'{branched_card_html(tried)}'
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
