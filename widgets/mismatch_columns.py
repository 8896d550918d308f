"""The rollout table's mismatch columns: per rollout, the mean Δ, the largest |Δ|, the mean k3, the
geometric-mean ratio and whether the sidebar's sequence-level correction rejects it
(:func:`studio.queries.mismatch.sequence_summaries` of the page's rows). They take the place of
reward, advantage, correctness, length and fork while the strip is coloured by ``mismatch`` in a store with
recomputed log-probs (the table card keeps its width); max |Δ| and k3 sort worst first on one click,
and the sidebar's filters keep rollouts with max |Δ| at least x, or the rejected ones only."""
from __future__ import annotations

import pandas as pd
from bokeh.models.widgets.tables import NumberFormatter

from studio.queries.mismatch import sequence_summaries
from studio.signals.mismatch import Correction
from studio.store import Store

MM_COLUMNS = ["max_abs_delta", "k3", "delta_mean", "geo_ratio", "rejected"]
MM_TITLES = {"max_abs_delta": "max|Δ|", "k3": "k3", "delta_mean": "avg Δ", "geo_ratio": "geo r", "rejected": "rej."}  # rej.: ✗ where rejected
MM_WIDTHS = {"max_abs_delta": 68, "k3": 52, "delta_mean": 70, "geo_ratio": 56, "rejected": 48}
MM_FORMATTERS = {"max_abs_delta": NumberFormatter(format="0.000"), "k3": NumberFormatter(format="0.000"),
                 "delta_mean": NumberFormatter(format="+0.000"), "geo_ratio": NumberFormatter(format="0.000"),
                 "rejected": {"type": "plaintext"}}
# the worst first on one header click (Tabulator's first click sorts ascending otherwise)
MM_SORT_CONFIG = [{"field": c, "headerSortStartingDir": "desc"} for c in ("max_abs_delta", "k3", "rejected")]
# the columns the mismatch ones stand in for
REPLACED = ["reward", "advantage", "correct", "n_tokens", "fork_pos"]


def sequence_correction(correction: Correction) -> Correction | None:
    """The correction that decides the *rej.* column: the sidebar's when it is sequence-level, else none."""
    return correction if correction.level == "sequence" else None


def with_mismatch_columns(store: Store, rows: pd.DataFrame, source: str, correction: Correction | None) -> pd.DataFrame:
    """``rows`` (a page, with ``rollout_id``) with :data:`MM_COLUMNS` filled for the rollouts with Δ
    (blank for the others)."""
    out = rows.copy()
    ids = out["rollout_id"].tolist()
    summ = sequence_summaries(store, ids, source, correction).set_index("rollout_id") if ids else pd.DataFrame()
    for c in MM_COLUMNS:
        col = summ[c].reindex(out["rollout_id"]).to_numpy() if c in summ.columns else [None] * len(out)
        out[c] = pd.Series(col, dtype=object if c == "rejected" else "float64")
    out["rejected"] = pd.Series(["" if pd.isna(x) or not x else "✗" for x in out["rejected"]], dtype=object)
    return out
