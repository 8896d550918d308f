"""Paired statistics of two sides' values per pair (per prompt, say): mean difference with a
bootstrap interval, Wilcoxon signed-rank, sign test, wins / ties / losses.

Pure functions of arrays, no store. With d = b - a per pair:

- Mean Δ with a paired bootstrap 95% interval (:func:`bootstrap_ci`): resample the pairs with
  replacement, ``N_BOOT`` times, seeded; the interval is the 2.5th and 97.5th percentiles of
  the resampled means (Efron's percentile interval). Past ``BOOT_MAX_DRAWS`` draws the
  interval is the normal one, mean ± 1.96·sd/√n, which the bootstrap converges to.
- Wilcoxon signed-rank test on the d ≠ 0 (:func:`wilcoxon_p`: scipy's ``wilcoxon`` when scipy
  is installed; else the normal approximation, :func:`wilcoxon_normal_p`, z = (W⁺ - n(n+1)/4) / σ
  with the tie-corrected σ² = n(n+1)(2n+1)/24 - Σ(t³-t)/48).
- Sign test (:func:`sign_test_p`): wins (d > 0) against losses (d < 0), ties (|d| ≤ ``EQUAL_TOL``)
  left out, exact two-sided binomial p = min(1, 2·P(X ≤ min(wins, losses))), X ~ Bin(wins + losses, ½).

:func:`paired_stats` gives them all at once (``studio.queries.timeline.run_diff`` uses it).

>>> sign_test_p(8, 2)  # 2 * (1 + 10 + 45) / 2**10
0.109375
>>> s = paired_stats([0.0, 0.5], [1.0, 0.5])  # d = +1, 0
>>> s["wins"], s["ties"], s["losses"], s["mean_delta"]
(1, 1, 0, 0.5)
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from studio.signals.advantages import EQUAL_TOL

N_BOOT = 2000
BOOT_MAX_DRAWS = 40_000_000  # n_pairs × N_BOOT past which the CI is the normal interval


def bootstrap_ci(d: np.ndarray, n_boot: int = N_BOOT, seed: int = 0, level: float = 0.95) -> tuple[float, float, str]:
    """``(lo, hi, method)``: percentile bootstrap interval of the mean of the paired
    differences ``d`` (method ``"bootstrap"``), or the normal interval past
    ``BOOT_MAX_DRAWS`` draws (``"normal"``). NaNs for an empty ``d``."""
    d = np.asarray(d, dtype=float)
    n = len(d)
    if n == 0:
        return float("nan"), float("nan"), "none"
    alpha = (1 - level) / 2
    if n * n_boot > BOOT_MAX_DRAWS:
        half = 1.959963984540054 * (d.std(ddof=1) if n > 1 else 0.0) / math.sqrt(n)
        return float(d.mean() - half), float(d.mean() + half), "normal"
    rng = np.random.default_rng(seed)
    means = np.empty(n_boot)
    chunk = max(1, 2_000_000 // n)  # resamples per batch: bounded memory
    for lo in range(0, n_boot, chunk):
        k = min(chunk, n_boot - lo)
        means[lo:lo + k] = d[rng.integers(0, n, size=(k, n))].mean(axis=1)  # [k]
    q = np.percentile(means, [100 * alpha, 100 * (1 - alpha)])
    return float(q[0]), float(q[1]), "bootstrap"


def sign_test_p(wins: int, losses: int) -> float:
    """Exact two-sided sign test: p = min(1, 2·P(X ≤ min(wins, losses))), X ~ Bin(wins + losses, ½)."""
    n, k = int(wins) + int(losses), min(int(wins), int(losses))
    if n == 0:
        return 1.0
    log_half_n = n * math.log(0.5)
    terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + log_half_n for i in range(k + 1)]
    top = max(terms)
    tail = math.exp(top) * sum(math.exp(t - top) for t in terms)
    return min(1.0, 2 * tail)


def wilcoxon_normal_p(d: np.ndarray) -> float:
    """Two-sided Wilcoxon signed-rank p by the normal approximation (no continuity
    correction), zeros dropped, tied |d| given their average rank."""
    d = np.asarray(d, dtype=float)
    d = d[np.abs(d) > EQUAL_TOL]
    n = len(d)
    if n == 0:
        return 1.0
    ranks = pd.Series(np.abs(d)).rank(method="average").to_numpy()
    w_plus = ranks[d > 0].sum()
    mu = n * (n + 1) / 4
    _, t = np.unique(np.abs(d), return_counts=True)
    var = n * (n + 1) * (2 * n + 1) / 24 - (t ** 3 - t).sum() / 48
    if var <= 0:
        return 1.0
    z = (w_plus - mu) / math.sqrt(var)
    return float(math.erfc(abs(z) / math.sqrt(2)))


def wilcoxon_p(d: np.ndarray) -> float:
    """Two-sided Wilcoxon signed-rank p of the paired differences (|d| ≤ ``EQUAL_TOL`` dropped):
    scipy's ``wilcoxon`` (exact for small samples without ties) when scipy is installed, else
    :func:`wilcoxon_normal_p`."""
    d = np.asarray(d, dtype=float)
    nz = d[np.abs(d) > EQUAL_TOL]
    if len(nz) == 0:
        return 1.0
    try:
        from scipy.stats import wilcoxon
    except ImportError:
        return wilcoxon_normal_p(nz)
    return float(wilcoxon(nz).pvalue)


def paired_stats(a: np.ndarray, b: np.ndarray, n_boot: int = N_BOOT, seed: int = 0) -> dict:
    """Statistics of paired values (b - a per pair): ``n, mean_a, mean_b, mean_delta, ci_lo,
    ci_hi, ci_method, wins, ties, losses, p_wilcoxon, p_sign``."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    d = b - a
    wins, losses = int((d > EQUAL_TOL).sum()), int((d < -EQUAL_TOL).sum())
    lo, hi, method = bootstrap_ci(d, n_boot, seed)
    nan = float("nan")
    return {"n": len(d), "mean_a": float(a.mean()) if len(a) else nan, "mean_b": float(b.mean()) if len(b) else nan,
            "mean_delta": float(d.mean()) if len(d) else nan, "ci_lo": lo, "ci_hi": hi, "ci_method": method,
            "wins": wins, "ties": len(d) - wins - losses, "losses": losses,
            "p_wilcoxon": wilcoxon_p(d) if len(d) else nan, "p_sign": sign_test_p(wins, losses)}
