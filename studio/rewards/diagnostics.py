"""Reward-hacking diagnostics over stored reward versions: signs that a reward is being gamed.

:func:`length_correlation` (does the reward follow completion length, version by version),
:func:`component_dominance` (which component drives the total's variance) and
:func:`disagreement` (where two reward sources, rule versions or a reward model's, pass and
fail different rollouts). They read the ``rewards`` table only; the Hacking view draws them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from studio.rewards.rules import versions
from studio.signals.advantages import spread_sql
from studio.store import Store


def totals(store: Store, vid: str) -> pd.DataFrame:
    """Every rollout version ``vid`` scored (``total`` not NULL): reward, length in tokens and
    characters, completion and prompt."""
    return store.df("""
        SELECT rw.rollout_id, rw.value AS reward, ro.n_tokens, length(ro.text) AS n_chars, ro.text AS completion,
               p.text AS prompt
        FROM rewards rw JOIN rollouts ro USING (rollout_id) JOIN prompts p USING (prompt_id)
        WHERE rw.rule_version_id = ? AND rw.component = 'total' AND rw.value IS NOT NULL""", [vid])


def length_correlation(store: Store) -> pd.DataFrame:
    """Per version: Pearson correlation of reward with completion length (tokens), and the
    slope in reward per 10 tokens. A rising correlation across versions is the classic
    sign of a length hack."""
    df = store.df(f"""
        SELECT rw.rule_version_id, {spread_sql('corr', 'rw.value', ', ro.n_tokens')} AS r,
               regr_slope(rw.value, ro.n_tokens) * 10 AS per_10_tokens, count(*) AS rollouts
        FROM rewards rw JOIN rollouts ro USING (rollout_id)
        WHERE rw.component = 'total' AND rw.value IS NOT NULL
        GROUP BY rw.rule_version_id""")
    order = versions(store)["rule_version_id"].tolist()
    return df.set_index("rule_version_id").reindex([v for v in order if v in set(df["rule_version_id"])]).reset_index()


def component_dominance(store: Store, vid: str) -> pd.DataFrame:
    """Which component drives the variance of the total: each component's share
    ``w_i · cov(c_i, total) / var(total)``, with ``w_i`` fitted by least squares (the rule's
    weights when the total is a weighted sum). Shares sum to the fit's R²."""
    df = store.df("""SELECT rollout_id, component, value FROM rewards
                     WHERE rule_version_id = ? AND value IS NOT NULL""", [vid])
    wide = df.pivot_table(index="rollout_id", columns="component", values="value", aggfunc="first").dropna()
    comps = [c for c in wide.columns if c != "total"]
    if not comps or "total" not in wide or wide["total"].var() == 0:
        return pd.DataFrame({"component": comps, "weight": np.nan, "share": np.nan})
    X, y = wide[comps].to_numpy(float), wide["total"].to_numpy(float)
    X1 = np.column_stack([X, np.ones(len(X))])
    w = np.linalg.lstsq(X1, y, rcond=None)[0][:-1]
    cov = np.array([np.cov(X[:, i], y)[0, 1] for i in range(len(comps))])
    share = w * cov / y.var(ddof=1)
    return pd.DataFrame({"component": comps, "weight": w, "share": share}).sort_values("share", ascending=False,
                                                                                     ignore_index=True)


@dataclass
class Disagreement:
    """Two reward sources thresholded into pass / fail on the same rollouts; A is the reference."""

    a: str
    b: str
    matrix: pd.DataFrame  # rows: A pass / A fail, columns: B pass / B fail
    false_positives: pd.DataFrame  # B passes what A fails
    false_negatives: pd.DataFrame  # B fails what A passes


def disagreement(store: Store, a: str, b: str, threshold_a: float = 0.5, threshold_b: float = 0.5) -> Disagreement:
    """Where two reward sources (rule versions, a reward model's version) disagree."""
    ta, tb = totals(store, a), totals(store, b)[["rollout_id", "reward"]]
    j = ta.merge(tb, on="rollout_id", suffixes=("_a", "_b"))
    pa, pb = j["reward_a"] >= threshold_a, j["reward_b"] >= threshold_b
    m = pd.DataFrame([[int((pa & pb).sum()), int((pa & ~pb).sum())], [int((~pa & pb).sum()), int((~pa & ~pb).sum())]],
                     index=["A pass", "A fail"], columns=["B pass", "B fail"])
    cols = ["rollout_id", "prompt", "completion", "reward_a", "reward_b", "n_tokens"]
    return Disagreement(a, b, m, j[~pa & pb][cols].reset_index(drop=True), j[pa & ~pb][cols].reset_index(drop=True))
