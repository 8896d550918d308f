"""Training–inference mismatch per token: Δ, the KL estimators, the corrections trainers apply,
their SQL twins, and the known causes a pattern of Δ points to.

Δ = log π_train − log π_behaviour (``tokens.train_logprob - tokens.logprob``), r = exp(Δ).
KL(π_behaviour ‖ π_train) per token, sampled from π_behaviour: k1 = −Δ, k2 = Δ²/2,
k3 = r − 1 − Δ (≥ 0). Tokens without both log-probs (tool tokens, not recomputed) have no Δ
(NaN here, NULL in SQL); every correction keeps them with weight 1, as TRL does
(``trl/trainer/grpo_trainer.py``: a NaN log-prob difference becomes 0, ratio 1).

Corrections (:class:`Correction`; token states kept 0 / clipped 1 / masked 2):

- ``tis``: w = min(r, C) (and max(·, low) when low > 0); verl ``rollout_is="token"``
  (``verl/trainer/ppo/rollout_corr_helper.py``), TRL ``token_truncate``, slime ``--use-tis``.
- ``mis`` / ``icepop``: w = r inside [low, C], 0 outside; TRL ``token_mask``, prime-rl
  ``token_mask_low/high`` (``src/prime_rl/trainer/rl/loss.py``), IcePop (Ring-1T) band [0.5, 5].
- ``k1`` / ``k3``: token rejection where |Δ| > threshold / k3 > threshold (weight 1 or 0).
- ``seq_tis``: w = min(exp(ΣΔ), C) on every token of the sequence; ``seq_mis``: exp(ΣΔ)
  outside [low, C] drops the sequence (TRL ``sequence_truncate`` / ``sequence_mask``).
- ``geo``: geometric-mean ratio exp(mean Δ) outside [low, C] (low 0: 1/C) rejects the sequence
  (verl ``rollout_rs="geometric"``, ``RolloutCorrectionConfig.decoupled_geo_rs`` in
  ``verl/trainer/config/algorithm.py``; prime-rl ``geo_mask_low/high``); ``seq_k3``: mean k3 > threshold
  rejects it.

>>> float(delta([-1.0], [-1.5])[0])
0.5
>>> w, s = token_correction(np.array([0.0, np.log(3.0)]), Correction("tis", cap=2.0))
>>> [round(float(x), 6) for x in w], s.tolist()
([1.0, 2.0], [0, 1])
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

METHODS: dict[str, str] = {
    "none": "w = 1 (no correction)",
    "tis": "w = min(r, C), r = exp(Δ) (token truncated IS)",
    "mis": "w = r if low ≤ r ≤ C else 0 (token masked IS)",
    "icepop": "w = r if low ≤ r ≤ high else 0 (IcePop band mask)",
    "k1": "drop the token if |Δ| > threshold",
    "k3": "drop the token if r − 1 − Δ > threshold",
    "seq_tis": "w = min(exp(ΣΔ), C) on every token of the sequence",
    "seq_mis": "drop the sequence if exp(ΣΔ) is outside [low, C]",
    "geo": "drop the sequence if exp(mean Δ) is outside [low, C] (low 0: 1/C)",
    "seq_k3": "drop the sequence if mean(r − 1 − Δ) > threshold",
}
SEQUENCE_METHODS = ("seq_tis", "seq_mis", "geo", "seq_k3")
STATES = ("kept", "clipped", "masked")
KEPT, CLIPPED, MASKED = 0, 1, 2


@dataclass(frozen=True)
class Correction:
    """One correction: ``method`` (a :data:`METHODS` key), its upper bound ``cap`` (C, or the
    band's high end), lower bound ``low`` (0: none) and rejection ``threshold`` (k1, k3, seq_k3)."""

    method: str = "tis"
    cap: float = 2.0
    low: float = 0.0
    threshold: float = 0.0

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"unknown correction method {self.method!r}; one of {', '.join(METHODS)}")
        for name in ("cap", "low", "threshold"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"correction {self.method}: {name} must be a finite number ≥ 0, got {value!r}")
        if self.cap <= 0 or self.low > self.cap:
            raise ValueError(f"correction {self.method}: needs 0 ≤ low ≤ cap and cap > 0, "
                             f"got low = {self.low:g}, cap = {self.cap:g}")

    @property
    def level(self) -> str:
        """``"sequence"`` for the methods deciding per sequence, else ``"token"``."""
        return "sequence" if self.method in SEQUENCE_METHODS else "token"

    def band(self) -> tuple[float, float]:
        """The ratio band [low, high] of the mask / rejection methods (geo: low 0 means 1/C)."""
        low = self.low
        if self.method == "geo" and low <= 0:
            low = 1.0 / self.cap
        return low, self.cap

    def describe(self) -> str:
        """Short label, e.g. ``"TIS, C = 2"``, ``"IcePop [0.5, 5]"``."""
        m, c = self.method, f"{self.cap:g}"
        lo, hi = self.band()
        band = f"[{lo:g}, {hi:g}]"
        return {
            "none": "no correction",
            "tis": f"TIS, C = {c}" + (f", low = {self.low:g}" if self.low > 0 else ""),
            "mis": f"MIS {band}",
            "icepop": f"IcePop {band}",
            "k1": f"token k1 rejection, |Δ| > {self.threshold:g}",
            "k3": f"token k3 rejection, k3 > {self.threshold:g}",
            "seq_tis": f"sequence TIS, C = {c}",
            "seq_mis": f"sequence MIS {band}",
            "geo": f"geometric-mean rejection {band}",
            "seq_k3": f"sequence k3 rejection, mean k3 > {self.threshold:g}",
        }[m]


# Display name (framework + option) -> correction; each comment names the file defining the option.
PRESETS: dict[str, Correction] = {
    # verl/trainer/config/algorithm.py RolloutCorrectionConfig.decoupled_token_is() (rollout_is="token", 2.0)
    "verl token TIS (threshold 2)": Correction("tis", cap=2.0),
    # ... decoupled_seq_is() (rollout_is="sequence", rollout_is_threshold=2.0)
    "verl sequence TIS (threshold 2)": Correction("seq_tis", cap=2.0),
    # ... decoupled_geo_rs() (rollout_rs geometric, 0.999_1.001)
    "verl geometric RS [0.999, 1.001]": Correction("geo", cap=1.001, low=0.999),
    # trl/trainer/grpo_config.py vllm_importance_sampling_mode, vllm_importance_sampling_clip_max = 3.0
    "TRL token_truncate (cap 3)": Correction("tis", cap=3.0),
    "TRL token_mask (cap 3)": Correction("mis", cap=3.0),
    "TRL sequence_truncate (cap 3)": Correction("seq_tis", cap=3.0),
    "TRL sequence_mask (cap 3)": Correction("seq_mis", cap=3.0),
    # slime/utils/arguments.py --use-tis --tis-clip 2.0 --tis-clip-low 0 (slime/backends/megatron_utils/loss.py)
    "slime --use-tis (--tis-clip 2)": Correction("tis", cap=2.0),
    # prime-rl src/prime_rl/trainer/rl/config.py LossConfig token_mask_low 0.125, token_mask_high 8.0
    "prime-rl token mask [0.125, 8]": Correction("mis", cap=8.0, low=0.125),
    # ... geo_mask_low 0.1, geo_mask_high 10.0 (reject_by_geo_k1 in loss.py: the sequence's exp(mean Δ))
    "prime-rl geo mask [0.1, 10]": Correction("geo", cap=10.0, low=0.1),
    # Ring-1T IcePop: ratio band [α, β] = [0.5, 5] (slime: --custom-tis-function-path ...icepop_function)
    "IcePop [0.5, 5]": Correction("icepop", cap=5.0, low=0.5),
}


def delta(train_logprob, behaviour_logprob) -> np.ndarray:
    """Δ = train − behaviour per token as float64; NaN where either is missing or non-finite."""
    t = np.asarray(train_logprob, dtype=np.float64)
    b = np.asarray(behaviour_logprob, dtype=np.float64)
    if t.shape != b.shape:
        raise ValueError(f"train and behaviour log-probs differ in length: {t.shape} vs {b.shape}")
    ok = np.isfinite(t) & np.isfinite(b)
    return np.where(ok, t - b, np.nan)


def kl_terms(d) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-token (k1, k2, k3) of KL(π_behaviour ‖ π_train): −Δ, Δ²/2, exp(Δ) − 1 − Δ."""
    d = np.asarray(d, dtype=np.float64)
    return -d, d * d / 2.0, np.expm1(d) - d


def token_mult_prob_error(d) -> float:
    """NeMo-RL's ``token_mult_prob_error``: mean of exp(|Δ|) over the tokens with Δ (1.0: no
    mismatch; ``nemo_rl/algorithms/loss_functions.py``, generation_logprobs against prev_logprobs)."""
    d = np.asarray(d, dtype=np.float64)
    d = d[np.isfinite(d)]
    return float(np.mean(np.exp(np.abs(d)))) if len(d) else float("nan")


def _band_state(ratio: np.ndarray, low: float, high: float) -> np.ndarray:
    """True where ``ratio`` falls outside [low, high] (NaN: inside)."""
    with np.errstate(invalid="ignore"):
        return (ratio < low) | (ratio > high)


def token_correction(d, c: Correction, seq_index=None) -> tuple[np.ndarray, np.ndarray]:
    """(weights float64, states int8) per token under correction ``c``; the formulas are in the
    module docstring. Sequence-level methods need ``seq_index`` (each token's sequence, any
    hashable labels); tokens without Δ are kept with weight 1."""
    d = np.asarray(d, dtype=np.float64)
    nan = np.isnan(d)
    w = np.ones_like(d)
    s = np.zeros(d.shape, dtype=np.int8)
    m = c.method
    if m == "none":
        return w, s
    if c.level == "sequence":
        if seq_index is None:
            raise ValueError(f"{c.describe()} is a sequence-level correction: seq_index is required")
        codes, uniq = pd.factorize(np.asarray(seq_index))
        if len(codes) != len(d):
            raise ValueError(f"seq_index has {len(codes)} entries for {len(d)} tokens")
        stats = sequence_stats(d, codes)
        if m == "seq_tis":
            ratio = np.exp(np.clip(stats["delta_sum"].to_numpy(), -700, 700))[codes]
            over = ratio > c.cap
            w = np.where(nan, 1.0, np.minimum(ratio, c.cap))
            s[over & ~nan] = CLIPPED
            return w, s
        rejected = sequence_rejected(stats, c)[codes]
        if m == "seq_mis":
            ratio = np.exp(np.clip(stats["delta_sum"].to_numpy(), -700, 700))[codes]
            w = np.where(nan, 1.0, np.where(rejected, 0.0, ratio))
        else:
            w = np.where(rejected & ~nan, 0.0, 1.0)
        s[rejected & ~nan] = MASKED
        return w, s
    r = np.exp(d)
    if m == "tis":
        hi, lo = r > c.cap, (r < c.low) if c.low > 0 else np.zeros_like(nan)
        w = np.clip(r, c.low if c.low > 0 else None, c.cap)
        s[(hi | lo) & ~nan] = CLIPPED
    elif m in ("mis", "icepop"):
        out = _band_state(r, *c.band())
        w = np.where(out, 0.0, r)
        s[out] = MASKED
    else:  # k1, k3
        score = np.abs(d) if m == "k1" else kl_terms(d)[2]
        with np.errstate(invalid="ignore"):
            out = score > c.threshold
        w = np.where(out, 0.0, 1.0)
        s[out] = MASKED
    w = np.where(nan, 1.0, w)
    return w, s


SEQUENCE_COLUMNS = ("n", "delta_sum", "delta_mean", "geo_ratio", "max_abs_delta", "k1", "k2", "k3")


def sequence_stats(d, seq_index) -> pd.DataFrame:
    """Per sequence (index: the sequence labels, in first-seen order): ``n`` tokens with Δ,
    ``delta_sum``, ``delta_mean``, ``geo_ratio`` = exp(mean Δ), ``max_abs_delta`` and the mean
    per-token ``k1``, ``k2``, ``k3`` (verl's ``rollout_corr/kl`` / ``k3_kl`` are such means).
    A sequence without Δ has n = 0 and NaN elsewhere (SQL's NULL)."""
    d = np.asarray(d, dtype=np.float64)
    codes, uniq = pd.factorize(np.asarray(seq_index))
    k1, k2, k3 = kl_terms(d)
    frame = pd.DataFrame({"s": codes, "d": d, "a": np.abs(d), "k1": k1, "k2": k2, "k3": k3})
    g = frame.groupby("s", sort=True)
    out = pd.DataFrame({
        "n": g["d"].count(),
        "delta_sum": g["d"].sum(min_count=1),
        "delta_mean": g["d"].mean(),
        "max_abs_delta": g["a"].max(),
        "k1": g["k1"].mean(), "k2": g["k2"].mean(), "k3": g["k3"].mean(),
    }).reindex(range(len(uniq)))
    out["n"] = out["n"].fillna(0).astype(np.int64)
    out["geo_ratio"] = np.exp(out["delta_mean"])
    out.index = pd.Index(uniq, name="sequence")
    return out[list(SEQUENCE_COLUMNS)]


def sequence_rejected(stats: pd.DataFrame, c: Correction) -> np.ndarray:
    """Whether each sequence of :func:`sequence_stats` is dropped by ``c``: seq_mis (exp(ΣΔ)
    outside [low, C], compared in log space), geo (geo_ratio outside the band), seq_k3 (mean k3
    > threshold). Token-level methods and seq_tis reject nothing; sequences without Δ are kept."""
    if c.method == "seq_mis":
        s = stats["delta_sum"].to_numpy(dtype=np.float64)
        lo, hi = c.band()
        with np.errstate(invalid="ignore", divide="ignore"):
            return (s > math.log(hi)) | ((s < math.log(lo)) if lo > 0 else False)
    if c.method == "geo":
        lo, hi = c.band()
        return _band_state(stats["geo_ratio"].to_numpy(dtype=np.float64), lo, hi)
    if c.method == "seq_k3":
        with np.errstate(invalid="ignore"):
            return stats["k3"].to_numpy(dtype=np.float64) > c.threshold
    return np.zeros(len(stats), dtype=bool)


# ---- SQL twins (DuckDB) ----

def delta_sql(train: str = "t.train_logprob", behaviour: str = "t.logprob") -> str:
    """SQL for Δ as DOUBLE; NULL where either side is NULL or non-finite (twin of :func:`delta`)."""
    t, b = f"CAST({train} AS DOUBLE)", f"CAST({behaviour} AS DOUBLE)"
    return f"(CASE WHEN isfinite({t}) AND isfinite({b}) THEN {t} - {b} END)"


def _f(x: float) -> str:
    return repr(float(x))


def _sequence_window(c: Correction, d: str, partition: str) -> tuple[str, str]:
    """(rejected, log-ratio) SQL over a window partitioned by ``partition``."""
    over = f"OVER (PARTITION BY {partition})"
    agg = {"delta_sum": f"sum({d}) {over}", "geo_ratio": f"exp(avg({d}) {over})",
           "k3": f"avg(exp({d}) - 1 - {d}) {over}"}
    return rejected_sql(c, agg), agg["delta_sum"]


def state_sql(c: Correction, d: str = "d", partition: str | None = None) -> str:
    """SQL CASE giving each token's state code (0 kept, 1 clipped, 2 masked), twin of
    :func:`token_correction`'s states; NULL Δ is kept. Sequence-level methods need ``partition``
    (the column(s) naming a token's sequence, e.g. ``"rollout_id"``): window aggregates."""
    m = c.method
    if m == "none":
        return "0"
    if c.level == "sequence":
        if not partition:
            raise ValueError(f"{c.describe()} is a sequence-level correction: state_sql needs partition")
        rejected, log_ratio = _sequence_window(c, d, partition)
        if m == "seq_tis":
            return f"(CASE WHEN {d} IS NOT NULL AND {log_ratio} > {_f(math.log(c.cap))} THEN 1 ELSE 0 END)"
        return f"(CASE WHEN {d} IS NOT NULL AND {rejected} THEN 2 ELSE 0 END)"
    if m == "tis":
        cond = f"{d} > {_f(math.log(c.cap))}" + (f" OR {d} < {_f(math.log(c.low))}" if c.low > 0 else "")
        return f"(CASE WHEN {cond} THEN 1 ELSE 0 END)"
    if m in ("mis", "icepop"):
        lo, hi = c.band()
        cond = f"exp({d}) > {_f(hi)}" + (f" OR exp({d}) < {_f(lo)}" if lo > 0 else "")
    elif m == "k1":
        cond = f"abs({d}) > {_f(c.threshold)}"
    else:
        cond = f"exp({d}) - 1 - {d} > {_f(c.threshold)}"
    return f"(CASE WHEN {cond} THEN 2 ELSE 0 END)"


def weight_sql(c: Correction, d: str = "d", partition: str | None = None) -> str:
    """SQL for each token's weight, twin of :func:`token_correction`'s weights (NULL Δ: 1)."""
    m = c.method
    if m == "none":
        return "1.0"
    if c.level == "sequence":
        state = state_sql(c, d, partition)
        _, log_ratio = _sequence_window(c, d, partition)
        if m == "seq_tis":
            return f"(CASE WHEN {d} IS NULL THEN 1.0 ELSE least(exp({log_ratio}), {_f(c.cap)}) END)"
        keep = f"exp({log_ratio})" if m == "seq_mis" else "1.0"
        return f"(CASE WHEN {d} IS NULL THEN 1.0 WHEN {state} = 2 THEN 0.0 ELSE {keep} END)"
    state = state_sql(c, d)
    if m == "tis":
        lo = f"greatest(exp({d}), {_f(c.low)})" if c.low > 0 else f"exp({d})"
        return f"(CASE WHEN {d} IS NULL THEN 1.0 ELSE least({lo}, {_f(c.cap)}) END)"
    keep = f"exp({d})" if m in ("mis", "icepop") else "1.0"
    return f"(CASE WHEN {d} IS NULL THEN 1.0 WHEN {state} = 2 THEN 0.0 ELSE {keep} END)"


def sequence_aggregates_sql(d: str = "d") -> str:
    """The :func:`sequence_stats` columns as SQL aggregates over Δ column ``d`` (for a GROUP BY
    per sequence)."""
    return (f"count({d}) AS n, sum({d}) AS delta_sum, avg({d}) AS delta_mean, "
            f"exp(avg({d})) AS geo_ratio, max(abs({d})) AS max_abs_delta, avg(-{d}) AS k1, "
            f"avg({d} * {d} / 2) AS k2, avg(exp({d}) - 1 - {d}) AS k3")


def rejected_sql(c: Correction, columns: dict[str, str] | None = None) -> str:
    """Boolean SQL over :func:`sequence_aggregates_sql`'s columns (or the expressions in
    ``columns``): twin of :func:`sequence_rejected`; never NULL."""
    col = {"delta_sum": "delta_sum", "geo_ratio": "geo_ratio", "k3": "k3", **(columns or {})}
    if c.method == "seq_mis":
        lo, hi = c.band()
        s = col["delta_sum"]
        cond = f"{s} > {_f(math.log(hi))}" + (f" OR {s} < {_f(math.log(lo))}" if lo > 0 else "")
    elif c.method == "geo":
        lo, hi = c.band()
        g = col["geo_ratio"]
        cond = f"{g} > {_f(hi)} OR {g} < {_f(lo)}"
    elif c.method == "seq_k3":
        cond = f"{col['k3']} > {_f(c.threshold)}"
    else:
        return "false"
    return f"coalesce(({cond}), false)"


# ---- known causes ----

@dataclass(frozen=True)
class Cause:
    """A known cause of mismatch that the data shows: its ``name``, the ``evidence`` (numbers)
    and the ``fix``."""

    name: str
    evidence: str
    fix: str


MIN_TOKENS = 20          # fewer trained tokens with Δ: no verdict
OFFSET_MIN = 0.02        # |median Δ| of a constant offset
OFFSET_SHARE = 0.9       # share of tokens on the median's side
FIRST_RATIO = 5.0        # first token's mean |Δ| against the rest's
FIRST_MIN = 0.1          # ... and at least this much
TOOL_RATIO = 3.0         # tool tokens' mean |Δ| against trained tokens'


def weights_of(version: str) -> str:
    """The weights a policy version names, without how they ran: a backend's ``<url>#`` and a precision's
    ``~<dtype>`` are dropped (the same weights in bfloat16 or behind a URL are not stale).

    >>> weights_of("http://gpu:8000#policy@562503e564~bfloat16"), weights_of("run_x@3")
    ('policy@562503e564', 'run_x@3')
    """
    return version.rsplit("#", 1)[-1].split("~", 1)[0]


def _versions(names: list[str]) -> str:
    """A list of policy versions as evidence reads it: all of a few, else the count and the first two.

    >>> _versions(["a@1", "a@2", "a@3"])
    '3 versions (a@1, a@2, …)'
    """
    return ", ".join(names) if len(names) <= 2 else f"{len(names)} versions ({names[0]}, {names[1]}, …)"


def diagnose(tokens: pd.DataFrame, behaviour_versions: list[str], train_versions: list[str]) -> list[Cause]:
    """The known causes the data shows, each with its evidence; silent on clean data.

    ``tokens``: ``rollout_id``, ``pos``, ``delta``, ``trained`` (``entropy`` optional).

    - constant offset: ≥ 90% of trained tokens' Δ on one side with |median Δ| ≥ 0.02 — the
      sampler renormalised over a truncated top-p / top-k support (its log-probs too high: Δ < 0).
    - first-token outlier: mean |Δ| of each rollout's first trained token ≥ 5× the rest's and ≥ 0.1
      — the first token's log-prob computed without the sampling temperature.
    - masked tool tokens included: tokens with ``trained`` false carry Δ, mean |Δ| ≥ 3× the
      trained tokens' (and ≥ 0.1).
    - stale weights: the behaviour and train policy versions name different weights (:func:`weights_of`).
    """
    causes: list[Cause] = []
    b = sorted({v for v in behaviour_versions if v})
    t = sorted({v for v in train_versions if v})
    if b and t and {weights_of(v) for v in b} != {weights_of(v) for v in t}:
        causes.append(Cause(
            "stale weights",
            f"sampled by {_versions(b)}; recomputed by {_versions(t)}",
            "sync the sampler's weights before each rollout batch (or, when off-policy by design, "
            "apply a correction: TIS / MIS); compare Δ within one version to separate the engines' own mismatch"))
    if tokens.empty:
        return causes
    d = tokens["delta"].to_numpy(dtype=np.float64)
    trained = tokens["trained"].fillna(False).to_numpy(dtype=bool)
    has = np.isfinite(d)
    dt = d[trained & has]
    if len(dt) >= MIN_TOKENS:
        med = float(np.median(dt))
        share = float(np.mean(np.sign(dt) == np.sign(med)))
        if abs(med) >= OFFSET_MIN and share >= OFFSET_SHARE:
            causes.append(Cause(
                "constant offset",
                f"median Δ = {med:+.3f} over {len(dt)} tokens, {share:.0%} of them on that side",
                "the sampler's log-probs come from a truncated support (top-p / top-k renormalised) or a "
                "different temperature: report log-probs of the full distribution (vLLM logprobs_mode="
                "'raw_logprobs') or recompute with the same sampling settings"))
        frame = pd.DataFrame({"r": tokens["rollout_id"].to_numpy()[trained & has],
                              "p": tokens["pos"].to_numpy()[trained & has], "a": np.abs(dt)})
        first = frame.groupby("r")["p"].transform("min") == frame["p"]
        if frame["r"].nunique() >= 3 and (~first).sum() > 0:
            fa, ra = float(frame.loc[first, "a"].mean()), float(frame.loc[~first, "a"].mean())
            if fa >= FIRST_MIN and fa >= FIRST_RATIO * ra:
                causes.append(Cause(
                    "first-token outlier",
                    f"mean |Δ| of the first token {fa:.3f} over {int(first.sum())} rollouts, "
                    f"{ra:.3f} on the other tokens",
                    "the first token's log-prob was computed without the sampling temperature: divide the "
                    "logits by the same temperature on both sides (sampler and trainer)"))
    du = d[~trained & has]
    if len(du):
        ua = float(np.mean(np.abs(du)))
        ta = float(np.mean(np.abs(dt))) if len(dt) else 0.0
        if ua >= FIRST_MIN and ua >= TOOL_RATIO * ta:
            causes.append(Cause(
                "masked tool tokens included",
                f"{len(du)} tool / observation tokens carry Δ, mean |Δ| {ua:.3f} against {ta:.3f} "
                "on the trained tokens",
                "leave the tokens the sampler did not generate out of the loss mask and out of the "
                "mismatch metrics (their behaviour log-prob is not a sampling probability)"))
    return causes
