"""The token strip's mismatch channel: each token's Δ = log π_train − log π_behaviour beside its row
(the recomputed log-prob of the session's source joined on the token's position), what the sidebar's
correction does to each token (kept, clipped, masked, or dropped with a rejected sequence), the
marks those verdicts put on the strip with their legend line and counts, and the note a strip
without recomputed log-probs shows instead."""
from __future__ import annotations

import numpy as np
import pandas as pd

from studio.signals.mismatch import Correction, delta, sequence_rejected, sequence_stats, token_correction

from .base.style import esc

# a verdict's CSS class on the strip (kept tokens carry none)
MARK_CLASS = {"clipped": "mm-clipped", "masked": "mm-masked", "rejected": "mm-masked"}


def with_mismatch(tokens: pd.DataFrame, recomputed: pd.DataFrame | None) -> pd.DataFrame:
    """``tokens`` with ``train_logprob``, ``train_rank`` (from ``recomputed``: ``pos, train_logprob,
    train_rank``, joined on ``pos``; NaN where a token has none) and ``mismatch`` = Δ (NaN where either
    log-prob is missing and on tokens the policy did not write)."""
    out = tokens.copy()
    if recomputed is None or recomputed.empty:
        out["train_logprob"], out["train_rank"] = np.nan, np.nan
    else:
        rec = recomputed.set_index("pos")
        pos = out["pos"].to_numpy()
        out["train_logprob"] = rec["train_logprob"].reindex(pos).to_numpy(dtype=np.float64, na_value=np.nan)
        ranks = rec["train_rank"] if "train_rank" in rec.columns else pd.Series(np.nan, index=rec.index)
        out["train_rank"] = ranks.reindex(pos).to_numpy(dtype=np.float64, na_value=np.nan)
    d = delta(out["train_logprob"].to_numpy(dtype=np.float64),
              out["logprob"].to_numpy(dtype=np.float64, na_value=np.nan))
    if "trained" in out.columns:
        d = np.where(out["trained"].to_numpy(dtype=bool, na_value=True), d, np.nan)
    out["mismatch"] = d
    return out


def verdicts(d: np.ndarray, correction: Correction) -> list[str | None]:
    """What ``correction`` does to each token of one sequence with per-token Δ ``d``: ``kept``,
    ``clipped`` (weight reduced), ``masked`` (dropped), ``rejected`` (dropped with its whole sequence
    by a sequence-level rule), None where Δ is missing (those tokens take no part in it)."""
    d = np.asarray(d, dtype=np.float64)
    ok = np.isfinite(d)
    out: list[str | None] = [None] * len(d)
    if not ok.any():
        return out
    dk = d[ok]
    seq = np.zeros(len(dk), dtype=np.int64)
    if correction.level == "sequence" and bool(sequence_rejected(sequence_stats(dk, seq), correction)[0]):
        states = ["rejected"] * len(dk)
    else:
        _, codes = token_correction(dk, correction, seq)
        states = [("kept", "clipped", "masked")[int(c)] for c in codes]
    for i, v in zip(np.flatnonzero(ok).tolist(), states):
        out[i] = v
    return out


def verdict_text(verdict: str | None, correction: Correction) -> str:
    """A verdict in the hover card's words."""
    if verdict == "clipped":
        return f"clipped to C = {correction.cap:g}" if correction.method in ("tis", "seq_tis") else "clipped"
    if verdict == "rejected":
        return "in a rejected sequence"
    return verdict or "–"


def marks_key_html(marks: list[str | None], correction: Correction) -> str:
    """The legend line of the correction's marks, with how many tokens each covers."""
    n = {k: sum(v == k for v in marks) for k in ("kept", "clipped", "masked", "rejected")}
    scored = sum(n.values())
    dropped = (f'masked (dropped) <b>{n["masked"]}</b>' if not n["rejected"] else
               f'<b>sequence rejected</b>: all {n["rejected"]} dropped')
    return (f'<div class="legend mm-key"><span class="lg-name">{esc(correction.describe())}</span>'
            f'<span><span class="mm-swatch mm-clipped">tok</span> clipped (weight reduced) <b>{n["clipped"]}</b></span>'
            f'<span><span class="mm-swatch mm-masked">tok</span> {dropped}</span>'
            f'<span class="muted">· {scored} tokens with Δ</span></div>')


def no_recomputed_html(source: str) -> str:
    """The note of a strip whose rollout has no recomputed log-probs from ``source``."""
    what = "a recomputed (train) log-prob" if not source else f"log-probs from {source}"
    return ('<div class="legend mm-none"><span class="lg-help">This rollout has no '
            f'{esc(what)}: no Δ to colour. Rescore it in the Mismatch tab, or import it with both columns '
            '(the behaviour and the train log-probs).</span></div>')
