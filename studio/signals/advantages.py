"""Advantage estimators: pure functions with their formulas, and SQL twins for the store.

Sequence-level estimators take a group's rewards and give one advantage per completion,
broadcast to its tokens. Token-level estimators (GAE with a critic's values, KL in the
reward with a reference policy) give one per token. The entropy mask is a token weight
applied on top of any of them. Advantages are derived, never stored: the SQL forms
compute them inside DuckDB with window functions over the stored rewards, and the numpy
forms are the reference they are tested against (GRPO, Dr. GRPO and RLOO also against
TRL's trainers, ``tests/test_advantages_trl.py``).

Conventions shared by every estimator: rewards of one group are those of the completions
sampled together for one prompt (``group_id``); a group whose rewards are all equal
(spread <= ``EQUAL_TOL``) gets exactly 0 ("advantage collapse"), and so does a group of one.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GRPO_EPS = 1e-4  # TRL's GRPOTrainer adds 1e-4 to the group std
WHITEN_EPS = 1e-8  # OpenRLHF's whitening epsilon (REINFORCE++)
EQUAL_TOL = 1e-9  # rewards closer than this count as equal: the group gets exactly A = 0


def _by_group(rewards, groups):
    rewards = np.asarray(rewards, dtype=np.float64)
    groups = np.asarray(groups)
    return rewards, groups, [groups == g for g in np.unique(groups)]


def _per_group(rewards, groups, fn) -> np.ndarray:
    """``fn(r)`` on each group's rewards; all-equal groups and groups of one get 0."""
    rewards, groups, masks = _by_group(rewards, groups)
    adv = np.zeros_like(rewards)
    for idx in masks:
        r = rewards[idx]
        if r.size >= 2 and np.ptp(r) > EQUAL_TOL:
            adv[idx] = fn(r)
    return adv


def grpo(rewards: np.ndarray, groups: np.ndarray, eps: float = GRPO_EPS) -> np.ndarray:
    """GRPO group-normalised advantage (Shao et al. 2024, DeepSeekMath).

    A_i = (r_i - mean(r_g)) / (std(r_g) + eps), with the sample standard deviation
    (Bessel-corrected, as ``torch.std`` in TRL's GRPOTrainer, ``scale_rewards="group"``) over
    the completions g that share the rollout's group. All-equal groups and groups of one get
    A = 0 (exactly: r - mean(r) for equal rewards would leave float residue like -3e-13).

    >>> grpo(np.array([1.0, 0.0, 1.0, 0.0]), np.array([0, 0, 0, 0])).round(3).tolist()
    [0.866, -0.866, 0.866, -0.866]
    """
    return _per_group(rewards, groups, lambda r: (r - r.mean()) / (r.std(ddof=1) + eps))


def dr_grpo(rewards: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Dr. GRPO, mean-only advantage (Liu et al. 2025, "Understanding R1-Zero-Like Training").

    A_i = r_i - mean(r_g): GRPO without the division by the group std, which over-weights
    prompts that are nearly always solved or failed (TRL: ``scale_rewards="none"``).

    >>> dr_grpo(np.array([1.0, 0.0, 0.0, 0.0]), np.zeros(4)).tolist()
    [0.75, -0.25, -0.25, -0.25]
    """
    return _per_group(rewards, groups, lambda r: r - r.mean())


def rloo(rewards: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """RLOO, leave-one-out baseline (Ahmadian et al. 2024, "Back to Basics").

    A_i = r_i - mean(r_j, j != i) = G/(G-1) · (r_i - mean(r_g)) for a group of G: each
    completion is judged against the others only, so the baseline does not depend on it.

    >>> rloo(np.array([1.0, 0.0, 0.0, 0.0]), np.zeros(4)).round(4).tolist()
    [1.0, -0.3333, -0.3333, -0.3333]
    """
    return _per_group(rewards, groups, lambda r: r - (r.sum() - r) / (r.size - 1))


def reinforce_pp(rewards: np.ndarray, groups: np.ndarray, batches: np.ndarray | None = None,
                 eps: float = WHITEN_EPS) -> np.ndarray:
    """REINFORCE++ with a group baseline (Hu 2025; OpenRLHF's ``reinforce_baseline``) (†).

    First the group mean is subtracted, a_i = r_i - mean(r_g); then the result is whitened
    over the whole batch b (the rollouts of one training step: same run and step),
    A_i = (a_i - mean(a_b)) / (std(a_b) + eps) with the population std. This reading works
    at sequence level; OpenRLHF whitens over tokens, which weights long completions more.
    A batch whose a are all equal gets A = 0.

    >>> reinforce_pp(np.array([1.0, 0.0, 1.0, 1.0]), np.array([0, 0, 1, 1])).round(4).tolist()
    [1.4142, -1.4142, 0.0, 0.0]
    """
    return whiten(dr_grpo(rewards, groups), batches, eps)


def whiten(a: np.ndarray, batches: np.ndarray | None = None, eps: float = WHITEN_EPS) -> np.ndarray:
    """REINFORCE++'s second stage on its own: A_i = (a_i - mean(a_b)) / (std(a_b) + eps) per batch b,
    population std; a batch whose a are all equal gets 0 (the twin of :func:`reinforce_pp_sql`).

    >>> whiten(np.array([0.5, -0.5, 0.0, 0.0]), np.array([0, 0, 1, 1])).round(4).tolist()
    [1.0, -1.0, 0.0, 0.0]
    """
    a = np.asarray(a, dtype=np.float64)
    batches = np.zeros(len(a), dtype=int) if batches is None else np.asarray(batches)
    out = np.zeros_like(a)
    for b in np.unique(batches):
        idx = batches == b
        x = a[idx]
        if np.ptp(x) <= EQUAL_TOL:
            continue
        out[idx] = (x - x.mean()) / (x.std() + eps)
    return out


def gae(token_rewards: np.ndarray, values: np.ndarray, gamma: float = 1.0, lam: float = 1.0) -> np.ndarray:
    """Generalised advantage estimation over one completion's tokens (Schulman et al. 2016; PPO).

    δ_t = r_t + γ·V(s_{t+1}) - V(s_t) with V after the last token = 0, and
    A_t = Σ_{l>=0} (γλ)^l · δ_{t+l}. ``values[t]`` is the critic's V(s_t), the state before
    token t. With γ = λ = 1 (common for LLMs) and the outcome as the only reward, A_t = R - V(s_t).

    >>> gae(np.array([0.0, 0.0, 1.0]), np.array([0.5, 0.5, 0.8])).round(6).tolist()  # = R - V(s_t)
    [0.5, 0.5, 0.2]
    >>> gae(np.array([0.0, 1.0]), np.array([0.5, 0.5]), gamma=1.0, lam=0.5).tolist()  # δ = (0, 0.5)
    [0.25, 0.5]
    """
    r = np.asarray(token_rewards, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    if r.shape != v.shape:
        raise ValueError(f"need one value per token: {v.shape[0]} values for {r.shape[0]} tokens")
    nxt = np.append(v[1:], 0.0)
    delta = r + gamma * nxt - v
    adv = np.zeros_like(r)
    run = 0.0
    for t in range(len(r) - 1, -1, -1):
        run = delta[t] + gamma * lam * run
        adv[t] = run
    return adv


def outcome_rewards(n_tokens: int, outcome: float) -> np.ndarray:
    """Token rewards of an outcome-only reward: the outcome on the last token, 0 elsewhere.

    >>> outcome_rewards(3, 1.0).tolist()
    [0.0, 0.0, 1.0]
    """
    r = np.zeros(n_tokens)
    if n_tokens:
        r[-1] = outcome
    return r


def kl_token_rewards(logprobs: np.ndarray, ref_logprobs: np.ndarray, outcome: float, beta: float) -> np.ndarray:
    """KL in the reward (Ziegler et al. 2019; InstructGPT; OpenRLHF's ``use_kl_loss=False``) (†).

    r_t = -β·(log π(y_t) - log π_ref(y_t)), plus the outcome reward on the last token: the
    first-order (k1) KL estimate per token, so drifting away from the reference costs reward.

    >>> kl_token_rewards(np.array([-1.0, -0.5]), np.array([-1.5, -0.5]), 1.0, 0.1).tolist()
    [-0.05, 1.0]
    """
    lp, ref = np.asarray(logprobs, dtype=np.float64), np.asarray(ref_logprobs, dtype=np.float64)
    if lp.shape != ref.shape:
        raise ValueError(f"need one reference logprob per token: {ref.shape[0]} for {lp.shape[0]} tokens")
    return -beta * (lp - ref) + outcome_rewards(len(lp), outcome)


def returns_to_go(token_rewards: np.ndarray) -> np.ndarray:
    """G_t = Σ_{s>=t} r_s (γ = 1).

    >>> returns_to_go(np.array([-0.05, 0.0, 1.0])).tolist()
    [0.95, 1.0, 1.0]
    """
    return np.cumsum(np.asarray(token_rewards, dtype=np.float64)[::-1])[::-1]


def kl_in_reward(token_rewards: list[np.ndarray], groups: np.ndarray) -> list[np.ndarray]:
    """Token advantages with the KL in the reward: A_t = G_t - mean over the group of G_0 (†).

    G_t is the return-to-go of the KL-shaped token rewards (:func:`kl_token_rewards`); the
    baseline is the mean total return of the completions in the group (a REINFORCE baseline),
    so tokens after a costly drift carry less than the ones before it.

    >>> [a.round(3).tolist() for a in kl_in_reward([np.array([-0.1, 1.0]), np.array([0.0, 0.0])], np.array([0, 0]))]
    [[0.45, 0.55], [-0.45, -0.45]]
    """
    groups = np.asarray(groups)
    g0 = np.array([returns_to_go(r)[0] if len(r) else 0.0 for r in token_rewards])
    base = {g: g0[groups == g].mean() for g in np.unique(groups)}
    return [returns_to_go(r) - base[g] for r, g in zip(token_rewards, groups, strict=False)]


def entropy_mask(entropies: np.ndarray, threshold: float) -> np.ndarray:
    """Token weights of the entropy-masked loss ("Beyond the 80/20 rule"; TRL's
    ``top_entropy_quantile``): 1 for tokens at or above the threshold (the forks), 0 elsewhere.
    The threshold is the (1-q) quantile of the batch's entropies (:func:`studio.queries.forks.threshold`).

    >>> entropy_mask(np.array([0.1, 0.9, 0.5]), 0.5).tolist()
    [0.0, 1.0, 1.0]
    """
    return (np.asarray(entropies, dtype=np.float64) >= threshold).astype(np.float64)


def all_equal_groups(rewards: np.ndarray, groups: np.ndarray, tol: float = EQUAL_TOL) -> set:
    """Groups whose rewards are all equal: advantage collapse, no learning signal."""
    rewards, groups = np.asarray(rewards, dtype=np.float64), np.asarray(groups)
    return {g for g in np.unique(groups) if np.ptp(rewards[groups == g]) <= tol}


# ---------------------------------------------------------------------------- SQL twins

def spread_sql(agg: str, x: str, rest: str = "", over: str = "") -> str:
    """``agg(x rest) over`` for a variance-family aggregate (``stddev_samp``, ``var_samp``, ``corr``...):
    NaN where ``x`` holds a NaN or an infinity, as DuckDB 2 returns it (DuckDB 1.5 raises "out of range")."""
    return (f"CASE WHEN bool_and(isfinite({x})) {over} IS FALSE THEN 'nan'::DOUBLE "
            f"ELSE {agg}(CASE WHEN isfinite({x}) THEN {x} END{rest}) {over} END")


def _collapsed(reward: str, win: str, expr: str) -> str:
    """``expr``, or exactly 0 for an all-equal group (and NULL-safe for a group of one)."""
    return (f"CASE WHEN max({reward}) {win} - min({reward}) {win} <= {EQUAL_TOL!r} "
            f"THEN 0.0 ELSE coalesce({expr}, 0.0) END")


def grpo_sql(reward: str = "reward", group: str = "group_id", eps: float = GRPO_EPS) -> str:
    """SQL expression for :func:`grpo` over a relation with ``reward`` and ``group`` columns.

    ``stddev_samp`` is NULL for a one-row group and ``coalesce`` turns that into 0.
    """
    win = f"OVER (PARTITION BY {group})"
    std = spread_sql("stddev_samp", reward, over=win)
    return _collapsed(reward, win, f"({reward} - avg({reward}) {win}) / ({std} + {float(eps)!r})")


def dr_grpo_sql(reward: str = "reward", group: str = "group_id") -> str:
    """SQL expression for :func:`dr_grpo`."""
    win = f"OVER (PARTITION BY {group})"
    return _collapsed(reward, win, f"{reward} - avg({reward}) {win}")


def rloo_sql(reward: str = "reward", group: str = "group_id") -> str:
    """SQL expression for :func:`rloo` (NULL rewards are left out of the baseline)."""
    win = f"OVER (PARTITION BY {group})"
    return _collapsed(reward, win,
                      f"{reward} - (sum({reward}) {win} - {reward}) / nullif(count({reward}) {win} - 1, 0)")


def reinforce_pp_sql(reward: str = "reward", group: str = "group_id", batch: str = "run_id, train_step",
                     eps: float = WHITEN_EPS) -> str:
    """SQL for :func:`reinforce_pp`: a nested window (group mean, then batch whitening).

    Returns an expression over a relation that already has the column ``_a`` =
    :func:`dr_grpo_sql`; :func:`estimator_sql` adds it.
    """
    win = f"OVER (PARTITION BY {batch})"
    return (f"CASE WHEN max(_a) {win} - min(_a) {win} <= {EQUAL_TOL!r} THEN 0.0 ELSE "
            f"coalesce((_a - avg(_a) {win}) / ({spread_sql('stddev_pop', '_a', over=win)} + {float(eps)!r}), 0.0) END")


# The same three estimators from one GROUP BY: per-group statistics joined back to the rows.
# DuckDB computes this about 1.6x faster than the window forms above (one hash aggregate
# instead of a sort per partition); the queries use it, the window forms stay as the
# readable definition and are checked equal to it.

GROUP_STATS = {"grpo", "dr_grpo", "rloo"}  # estimators with a group-statistics form


def group_stats_sql(reward: str = "reward") -> str:
    """Select list of the per-group statistics the ``*_from_stats`` forms read; use it as
    ``SELECT group_id, {group_stats_sql()} FROM … GROUP BY group_id`` and join it back."""
    return (f"avg({reward}) AS _g_mean, {spread_sql('stddev_samp', reward)} AS _g_std, sum({reward}) AS _g_sum, "
            f"count({reward}) AS _g_n, max({reward}) - min({reward}) AS _g_spread")


def from_stats_sql(key: str, reward: str = "reward", eps: float = GRPO_EPS) -> str:
    """The advantage of ``key`` (``grpo``, ``dr_grpo`` or ``rloo``) from a row's ``reward``
    and its group's :func:`group_stats_sql` columns; equal to the window twins."""
    expr = {"grpo": f"({reward} - _g_mean) / (_g_std + {float(eps)!r})",
            "dr_grpo": f"{reward} - _g_mean",
            "rloo": f"{reward} - (_g_sum - {reward}) / nullif(_g_n - 1, 0)"}[key]
    return f"CASE WHEN _g_spread <= {EQUAL_TOL!r} THEN 0.0 ELSE coalesce({expr}, 0.0) END"


# ---------------------------------------------------------------------------- the registry

@dataclass(frozen=True)
class Estimator:
    """One way to assign credit, as the studio's views offer it."""

    key: str
    label: str
    level: str  # "sequence": one value per completion; "token": one per token
    needs: str = ""  # "values" (a critic's per-token values) | "reference" (a reference policy's logprobs)
    formula: str = ""


ESTIMATORS: dict[str, Estimator] = {e.key: e for e in [
    Estimator("grpo", "GRPO (std-normalised)", "sequence", formula="A = (r − mean_g r) / (std_g r + 1e-4)"),
    Estimator("dr_grpo", "Dr. GRPO (mean-only)", "sequence", formula="A = r − mean_g r"),
    Estimator("rloo", "RLOO (leave-one-out)", "sequence", formula="A = r − mean_{j≠i} r_j"),
    Estimator("reinforce_pp", "REINFORCE++ (batch-whitened)", "sequence",
              formula="a = r − mean_g r;  A = (a − mean_batch a) / std_batch a"),
    Estimator("gae", "PPO GAE (critic values)", "token", needs="values",
              formula="A_t = Σ (γλ)^l δ_{t+l},  δ_t = r_t + γV_{t+1} − V_t"),
    Estimator("kl", "KL in reward (reference)", "token", needs="reference",
              formula="r_t = −β (log π − log π_ref) + R·[t = T];  A_t = G_t − mean_g G_0"),
]}

SEQUENCE_FNS = {"grpo": grpo, "dr_grpo": dr_grpo, "rloo": rloo, "reinforce_pp": reinforce_pp}


def sequence_advantages(key: str, rewards: np.ndarray, groups: np.ndarray,
                        batches: np.ndarray | None = None) -> np.ndarray:
    """A sequence-level estimator by key (``reinforce_pp`` whitens per ``batches``)."""
    if key not in SEQUENCE_FNS:
        raise ValueError(f"{key!r} is not a sequence-level estimator; choose from {sorted(SEQUENCE_FNS)}")
    if key == "reinforce_pp":
        return reinforce_pp(rewards, groups, batches)
    return SEQUENCE_FNS[key](rewards, groups)


def estimator_sql(key: str, reward: str = "reward", group: str = "group_id") -> tuple[str, str]:
    """``(pre, final)`` SQL for a sequence-level estimator: ``pre`` adds helper columns to
    a relation (``''`` when none are needed), ``final`` is the advantage expression.
    Token-level estimators read as GRPO here: their sequence figure is computed per rollout
    from its tokens (:mod:`studio.queries.credit`)."""
    if key == "dr_grpo":
        return "", dr_grpo_sql(reward, group)
    if key == "rloo":
        return "", rloo_sql(reward, group)
    if key == "reinforce_pp":
        return f", {dr_grpo_sql(reward, group)} AS _a", reinforce_pp_sql(reward, group)
    return "", grpo_sql(reward, group)


@dataclass(frozen=True)
class Credit:
    """What a view's advantages are computed with: the estimator and its settings.

    ``reference`` names a policy version whose teacher-forced log-probs are stored
    (``token_scores``; the KL estimator and the implicit process reward read it); ``values``
    names a critic whose per-token values are stored there (GAE reads it).
    """

    estimator: str = "grpo"
    beta: float = 0.05
    reference: str | None = None
    gamma: float = 1.0
    lam: float = 1.0
    values: str | None = None

    def validate(self) -> None:
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"unknown estimator {self.estimator!r}; choose from {', '.join(ESTIMATORS)}")
        if not 0.0 <= self.beta <= 10.0:
            raise ValueError(f"β must be within [0, 10], got {self.beta}")
        if not (0.0 <= self.gamma <= 1.0 and 0.0 <= self.lam <= 1.0):
            raise ValueError(f"γ and λ must be within [0, 1], got γ={self.gamma}, λ={self.lam}")

    @property
    def missing(self) -> str | None:
        """What the estimator needs and is not set (None when it can run)."""
        need = ESTIMATORS[self.estimator].needs
        if need == "reference" and not self.reference:
            return "pick a reference policy (its log-probs stored by Compare policies → score)"
        if need == "values" and not self.values:
            return "pick a critic whose per-token values are stored (score with a value model)"
        return None

    def describe(self) -> str:
        e = ESTIMATORS[self.estimator]
        extra = {"kl": f", β={self.beta:g} vs {self.reference}", "gae": f", γ={self.gamma:g} λ={self.lam:g}"}
        return e.label + extra.get(self.estimator, "")
