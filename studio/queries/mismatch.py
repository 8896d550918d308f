"""Training–inference mismatch read from the store: the sources of recomputed log-probs, one
rollout's tokens with Δ (the strip's ``mismatch`` channel and its hover) and per-rollout sequence
summaries over a scope, all computed in DuckDB with the SQL twins of :mod:`studio.signals.mismatch`.

A **source** names the recomputed log-prob: ``""`` is the stored ``tokens.train_logprob`` (the
scale path: one column scan), any other value a ``token_scores.policy_version`` joined on
``(rollout_id, pos)`` (for small scopes: a rollout, a group, a run). A **scope** is one rollout id
(str), a list of rollout ids, a :class:`~studio.queries.filters.RolloutFilter` (its run, group,
training step, branch, prompt-text and row conditions; not its reward range) or None (the store).
Tool tokens (``trained = false``) are left out of every Δ here: the sampler did not generate them.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from studio.queries.filters import RolloutFilter, row_conditions, whole_group_conditions
from studio.signals.mismatch import (
    PRESETS,
    Cause,
    Correction,
    delta_sql,
    diagnose,
    rejected_sql,
    sequence_aggregates_sql,
    state_sql,
)
from studio.store import Store

Scope = RolloutFilter | list[str] | str | None


def scope_sql(scope: Scope) -> tuple[str | None, list]:
    """``SELECT rollout_id`` of the rollouts in ``scope`` and its values; None for the whole store."""
    if scope is None:
        return None, []
    if isinstance(scope, str):
        return "SELECT ?::VARCHAR AS rollout_id", [scope]
    if not isinstance(scope, RolloutFilter):
        return "SELECT unnest(?::VARCHAR[]) AS rollout_id", [list(scope)]
    groups, params = whole_group_conditions(scope)
    rows, rparams = row_conditions(scope)
    conds = groups + rows
    params = params + rparams
    if scope.prompt_contains:
        conds.append("ro.prompt_id IN (SELECT prompt_id FROM prompts WHERE contains(lower(text), lower(?)))")
        params.append(scope.prompt_contains.strip())
    if conds == ["TRUE"]:
        return None, []
    return f"SELECT ro.rollout_id FROM rollouts ro WHERE {' AND '.join(conds)}", params


def token_rows_sql(scope: Scope, source: str = "", trained_only: bool = True,
                   extra: str = "") -> tuple[str, list]:
    """SELECT of the scope's tokens with ``rollout_id, pos, logprob, train_logprob, d`` (Δ, NULL where
    either log-prob is missing), ``entropy``, ``trained`` and ``extra`` (more ``t.`` columns, with a
    leading comma), and its values. ``source`` picks the recomputed side (see the module doc)."""
    ids, params = scope_sql(scope)
    where = [f"t.rollout_id IN ({ids})"] if ids else []
    if trained_only:
        where.append("coalesce(t.trained, true)")
    if source:
        train, join = "s.logprob", ("JOIN token_scores s ON s.rollout_id = t.rollout_id AND s.pos = t.pos "
                                     "AND s.policy_version = ?")
        params = [source] + params
    else:
        train, join = "t.train_logprob", ""
    sql = (f"SELECT t.rollout_id, t.pos, t.logprob, {train} AS train_logprob, "
           f"{delta_sql(train, 't.logprob')} AS d, t.entropy, t.trained{extra} "
           f"FROM tokens t {join} WHERE {' AND '.join(where) or 'TRUE'}")
    return sql, params


def mismatch_sources(store: Store, run_id: str | None = None) -> pd.DataFrame:
    """The recomputed log-prob sources (of one run, or the store): ``source`` (``""``: the stored
    column), ``policy_version`` and ``engine`` that produced it, ``rollouts`` and ``tokens`` with
    both log-probs. The stored column has a row per (train_policy_version, train_engine) of its
    rollouts; each ``token_scores`` source with log-probs one row per engine."""
    run = "AND ro.run_id = ?" if run_id else ""
    params = [run_id] if run_id else []
    stored = store.df(f"""
        SELECT '' AS source, ro.train_policy_version AS policy_version, ro.train_engine AS engine,
               count(DISTINCT t.rollout_id) AS rollouts, count(*) AS tokens
        FROM tokens t JOIN rollouts ro ON ro.rollout_id = t.rollout_id
        WHERE t.train_logprob IS NOT NULL AND t.logprob IS NOT NULL {run}
        GROUP BY ALL ORDER BY rollouts DESC""", params)
    scored = store.df(f"""
        SELECT s.policy_version AS source, s.policy_version, s.engine,
               count(DISTINCT s.rollout_id) AS rollouts, count(*) AS tokens
        FROM token_scores s JOIN rollouts ro ON ro.rollout_id = s.rollout_id
             JOIN tokens t ON t.rollout_id = s.rollout_id AND t.pos = s.pos
        WHERE s.logprob IS NOT NULL AND t.logprob IS NOT NULL AND coalesce(t.trained, true) {run}
        GROUP BY ALL ORDER BY s.policy_version, s.engine""", params)
    return pd.concat([stored, scored], ignore_index=True)


def sources(store: Store, run_id: str | None = None) -> list[str]:
    """The ``token_scores`` sources with log-probs (``""``, the stored column, not included)."""
    return sorted({s for s in mismatch_sources(store, run_id)["source"] if s})


def has_recomputed(store: Store) -> bool:
    """Whether any token has a recomputed log-prob (the stored column or a ``token_scores`` source)."""
    return bool(store.scalar("""SELECT EXISTS (SELECT 1 FROM tokens WHERE train_logprob IS NOT NULL)
                                OR EXISTS (SELECT 1 FROM token_scores WHERE logprob IS NOT NULL)"""))


def rollout_mismatch(store: Store, rollout_id: str, source: str = "") -> pd.DataFrame:
    """One rollout's tokens in ``pos`` order: ``pos, token_text, logprob, train_logprob, delta,
    ratio, k3`` (NaN without Δ), ``rank`` (the token's place in the sampler's top-k, 1 = its argmax;
    NA: beyond the top-k or no top-k stored), ``train_rank`` (under the recomputation; NA: unknown),
    ``entropy``, ``trained``. Tool tokens are kept (their Δ is NaN)."""
    src = store.tokens_between(rollout_id, rollout_id)
    if source:
        train, rank = "s.logprob", "s.rank"
        join = "LEFT JOIN token_scores s ON s.rollout_id = t.rollout_id AND s.pos = t.pos AND s.policy_version = ?"
        params = [source, rollout_id]
    else:
        train, rank, join, params = "t.train_logprob", "t.train_rank", "", [rollout_id]
    d = delta_sql(train, "t.logprob")
    df = store.df(f"""
        SELECT t.pos, t.token_text, t.logprob, {train} AS train_logprob, {d} AS delta,
               exp({d}) AS ratio, exp({d}) - 1 - {d} AS k3,
               CASE WHEN t.topk_ids IS NOT NULL THEN nullif(list_position(t.topk_ids, t.token_id), 0) END AS rank,
               {rank} AS train_rank, t.entropy, t.trained
        FROM {src} t {join} WHERE t.rollout_id = ? ORDER BY t.pos""", params)
    for col in ("rank", "train_rank"):
        df[col] = df[col].astype("Int64")
    for col in ("logprob", "train_logprob", "delta", "ratio", "k3"):
        df[col] = df[col].astype("float64")
    return df


def sequence_summaries_sql(scope: Scope, source: str = "",
                           correction: Correction | None = None) -> tuple[str, list]:
    """SQL of :func:`sequence_summaries` and its values."""
    rows, params = token_rows_sql(scope, source)
    rejected = rejected_sql(correction) if correction is not None else "false"
    sql = f"""SELECT *, {rejected} AS rejected FROM (
                 SELECT rollout_id, {sequence_aggregates_sql('d')} FROM ({rows}) x
                 WHERE d IS NOT NULL GROUP BY rollout_id)"""
    return sql, params


def sequence_summaries(store: Store, scope: Scope, source: str = "",
                       correction: Correction | None = None) -> pd.DataFrame:
    """Per rollout of ``scope`` with Δ: ``rollout_id, n, delta_sum, delta_mean, geo_ratio,
    max_abs_delta, k1, k2, k3`` (the means per token of :func:`studio.signals.mismatch.sequence_stats`)
    and ``rejected`` under the sequence-level ``correction`` (False for token-level ones or None).
    Rollouts without Δ have no row; rows in no particular order (index them by ``rollout_id``: a
    sort would cost a whole store's summaries a tenth of their time)."""
    sql, params = sequence_summaries_sql(scope, source, correction)
    return store.df(sql, params)


# ---- the Mismatch tab: distributions, worst tokens, corrections, drift, engines ----

HIST_BINS = 40
POSITION_BINS = 100  # positions further than this are read in bins of equal width
ENTROPY_BINS = 10    # deciles of entropy


@dataclass
class Distributions:
    """Δ over a scope: ``hist`` (lo, hi, tokens), ``by_pos`` (pos, mean_abs_delta, tokens),
    ``by_entropy`` / ``by_frequency`` (a bin label, mean_abs_delta, tokens) and ``n_tokens``."""

    hist: pd.DataFrame
    by_pos: pd.DataFrame
    by_entropy: pd.DataFrame
    by_frequency: pd.DataFrame
    n_tokens: int


def delta_histogram(store: Store, scope: Scope, source: str = "", bins: int = HIST_BINS) -> pd.DataFrame:
    """Histogram of Δ: ``lo``, ``hi`` (each bin's edges, equal widths from min to max Δ), ``tokens``."""
    rows, params = token_rows_sql(scope, source)
    return store.df(f"""
        WITH x AS (SELECT d FROM ({rows}) WHERE d IS NOT NULL),
        r AS (SELECT min(d) AS lo, greatest(max(d) - min(d), 1e-12) / {int(bins)} AS w FROM x),
        b AS (SELECT least(floor((d - r.lo) / r.w), {int(bins) - 1}) AS k, count(*) AS tokens FROM x, r GROUP BY k)
        SELECT r.lo + k * r.w AS lo, r.lo + (k + 1) * r.w AS hi, tokens FROM b, r ORDER BY k""", params)


def delta_by_position(store: Store, scope: Scope, source: str = "", bins: int = POSITION_BINS) -> pd.DataFrame:
    """Mean |Δ| per completion position: ``pos`` (a bin's first position), ``mean_abs_delta``, ``tokens``."""
    rows, params = token_rows_sql(scope, source)
    return store.df(f"""
        WITH x AS (SELECT pos, abs(d) AS a FROM ({rows}) WHERE d IS NOT NULL),
        w AS (SELECT greatest(ceil((max(pos) + 1) / {int(bins)}), 1)::INTEGER AS w FROM x)
        SELECT (pos // w.w) * w.w AS pos, avg(a) AS mean_abs_delta, count(*) AS tokens
        FROM x, w GROUP BY 1 ORDER BY 1""", params)


def delta_by_entropy(store: Store, scope: Scope, source: str = "", bins: int = ENTROPY_BINS) -> pd.DataFrame:
    """Mean |Δ| per entropy quantile bin: ``entropy`` (label "≤ hi", the bin's upper edge in nats, two significant
    digits: the bins are contiguous), ``mean_abs_delta``, ``tokens``. The forking, high-entropy tokens are the
    last bins."""
    rows, params = token_rows_sql(scope, source)
    df = store.df(f"""
        WITH x AS (SELECT entropy, abs(d) AS a, ntile({int(bins)}) OVER (ORDER BY entropy) AS k
                   FROM ({rows}) WHERE d IS NOT NULL AND entropy IS NOT NULL)
        SELECT k, min(entropy) AS lo, max(entropy) AS hi, avg(a) AS mean_abs_delta, count(*) AS tokens
        FROM x GROUP BY k ORDER BY k""", params)
    df.insert(0, "entropy", [f"≤ {hi:.2g}" for hi in df["hi"]])
    return df[["entropy", "mean_abs_delta", "tokens"]]


def delta_by_frequency(store: Store, scope: Scope, source: str = "") -> pd.DataFrame:
    """Mean |Δ| by how often the token occurs in the scope, in decades: ``frequency`` ("1", "2–9",
    "10–99", …), ``mean_abs_delta``, ``tokens``."""
    rows, params = token_rows_sql(scope, source, extra=", t.token_id")
    df = store.df(f"""
        WITH x AS (SELECT token_id, abs(d) AS a, count(*) OVER (PARTITION BY token_id) AS f
                   FROM ({rows}) WHERE d IS NOT NULL)
        SELECT CASE WHEN f = 1 THEN 0 ELSE floor(log10(f))::INTEGER + 1 END AS k,
               avg(a) AS mean_abs_delta, count(*) AS tokens FROM x GROUP BY k ORDER BY k""", params)
    labels = {0: "1", 1: "2–9"}
    df.insert(0, "frequency", [labels.get(k, f"{10 ** (k - 1)}–{10 ** k - 1}") for k in df["k"]])
    return df[["frequency", "mean_abs_delta", "tokens"]]


def distributions(store: Store, scope: Scope, source: str = "") -> Distributions:
    """The four distributions of Δ over ``scope`` (one read each) and its count of tokens with Δ."""
    hist = delta_histogram(store, scope, source)
    return Distributions(hist, delta_by_position(store, scope, source), delta_by_entropy(store, scope, source),
                         delta_by_frequency(store, scope, source), int(hist["tokens"].sum()) if len(hist) else 0)


CONTEXT_TOKENS = 6  # tokens of context shown each side of a worst token


def worst_tokens(store: Store, scope: Scope, source: str = "", limit: int = 15,
                 train_step: int | None = None, context: int = CONTEXT_TOKENS) -> pd.DataFrame:
    """The ``limit`` tokens of largest |Δ|: ``rollout_id, pos, token_text, delta, logprob,
    train_logprob, entropy`` with ``before`` / ``after`` (the text of ``context`` tokens each side);
    ``train_step`` narrows to the rollouts sampled at that training step."""
    rows, params = token_rows_sql(scope, source, extra=", t.token_text")
    step, sparams = "", []
    if train_step is not None:
        step = "AND rollout_id IN (SELECT rollout_id FROM rollouts WHERE train_step = ?)"
        sparams = [int(train_step)]
    return store.df(f"""
        WITH w AS (SELECT rollout_id, pos, token_text, d AS delta, logprob, train_logprob, entropy
                   FROM ({rows}) WHERE d IS NOT NULL {step} ORDER BY abs(d) DESC, rollout_id, pos LIMIT ?)
        SELECT w.*,
            coalesce(string_agg(c.token_text, '' ORDER BY c.pos) FILTER (WHERE c.pos < w.pos), '') AS before,
            coalesce(string_agg(c.token_text, '' ORDER BY c.pos) FILTER (WHERE c.pos > w.pos), '') AS after
        FROM w JOIN tokens c ON c.rollout_id = w.rollout_id AND c.pos BETWEEN w.pos - ? AND w.pos + ?
        GROUP BY w.rollout_id, w.pos, w.token_text, w.delta, w.logprob, w.train_logprob, w.entropy
        ORDER BY abs(w.delta) DESC, w.rollout_id, w.pos""",
        params + sparams + [int(limit), int(context), int(context)])


def correction_shares(store: Store, scope: Scope, source: str = "",
                      corrections: dict[str, Correction] | None = None) -> pd.DataFrame:
    """Per correction (default: :data:`studio.signals.mismatch.PRESETS`): ``preset``, ``describe``
    and the shares (0..1) of tokens with Δ ``clipped`` and ``masked`` and of sequences ``rejected``;
    NaN where the method does not do it."""
    corrections = PRESETS if corrections is None else corrections
    rows, params = token_rows_sql(scope, source)
    names = list(corrections)
    states = ", ".join(f"{state_sql(c, 'd', 'rollout_id')} AS s{i}" for i, c in enumerate(corrections.values()))
    shares = ", ".join(f"avg(CASE WHEN s{i} = 1 THEN 1.0 ELSE 0.0 END) AS c{i}, "
                       f"avg(CASE WHEN s{i} = 2 THEN 1.0 ELSE 0.0 END) AS m{i}" for i in range(len(names)))
    tok = store.df(f"""SELECT {shares} FROM (SELECT {states} FROM ({rows}) WHERE d IS NOT NULL)""",
                   params).iloc[0] if names else None
    seq_sql, seq_params = sequence_summaries_sql(scope, source)
    rejected = ", ".join(f"avg(CASE WHEN {rejected_sql(c)} THEN 1.0 ELSE 0.0 END) AS r{i}"
                         for i, c in enumerate(corrections.values()))
    seq = store.df(f"SELECT {rejected} FROM ({seq_sql})", seq_params).iloc[0] if names else None
    out = []
    for i, (name, c) in enumerate(corrections.items()):
        clips = c.method in ("tis", "seq_tis")
        rejects = c.method in ("seq_mis", "geo", "seq_k3")
        masks = c.method in ("mis", "icepop", "k1", "k3") or rejects
        out.append({"preset": name, "describe": c.describe(),
                    "clipped": float(tok[f"c{i}"]) if clips else float("nan"),
                    "masked": float(tok[f"m{i}"]) if masks else float("nan"),
                    "rejected": float(seq[f"r{i}"]) if rejects else float("nan")})
    return pd.DataFrame(out, columns=["preset", "describe", "clipped", "masked", "rejected"])


def by_step(store: Store, scope: Scope, source: str = "") -> pd.DataFrame:
    """Per training step of the scope's rollouts (the drift): ``step``, ``mean_abs_delta``, ``k3``
    (mean per token), ``p99`` (of |Δ|), ``tokens`` and the step's worst token (``worst_rollout_id``,
    ``worst_pos``, ``worst_token``, ``worst_delta``). Empty when no rollout has a step."""
    rows, params = token_rows_sql(scope, source, extra=", t.token_text")
    return store.df(f"""
        SELECT ro.train_step AS step, avg(abs(x.d)) AS mean_abs_delta, avg(exp(x.d) - 1 - x.d) AS k3,
               quantile_cont(abs(x.d), 0.99) AS p99, count(*) AS tokens,
               arg_max(x.rollout_id, abs(x.d)) AS worst_rollout_id, arg_max(x.pos, abs(x.d)) AS worst_pos,
               arg_max(x.token_text, abs(x.d)) AS worst_token, arg_max(x.d, abs(x.d)) AS worst_delta
        FROM ({rows}) x JOIN rollouts ro ON ro.rollout_id = x.rollout_id
        WHERE x.d IS NOT NULL AND ro.train_step IS NOT NULL GROUP BY ro.train_step ORDER BY step""", params)


def engine_comparison(store: Store, scope: Scope, source: str = "") -> tuple[pd.DataFrame, list[Cause]]:
    """The engines compared over ``scope``: a frame per (behaviour ``engine``, ``train_engine``) with
    ``rollouts, tokens, mean_delta, mean_abs_delta``, and the known causes
    :func:`studio.signals.mismatch.diagnose` names on the scope's tokens (tool tokens included,
    so that "masked tool tokens included" can be seen)."""
    rows, params = token_rows_sql(scope, source, trained_only=False)
    train_engine = "(SELECT any_value(engine) FROM token_scores WHERE policy_version = ?)" if source else "ro.train_engine"
    train_version = "?" if source else "ro.train_policy_version"
    eparams = [source] if source else []
    vparams = [source] if source else []
    engines = store.df(f"""
        SELECT ro.engine, {train_engine} AS train_engine, count(DISTINCT x.rollout_id) AS rollouts,
               count(*) AS tokens, avg(x.d) AS mean_delta, avg(abs(x.d)) AS mean_abs_delta
        FROM ({rows}) x JOIN rollouts ro ON ro.rollout_id = x.rollout_id
        WHERE x.d IS NOT NULL AND coalesce(x.trained, true) GROUP BY ALL ORDER BY tokens DESC""",
        eparams + params)
    toks = store.df(f"""
        SELECT x.rollout_id, x.pos, x.d AS delta, coalesce(x.trained, true) AS trained, x.entropy,
               ro.policy_version, {train_version} AS train_version
        FROM ({rows}) x JOIN rollouts ro ON ro.rollout_id = x.rollout_id
        WHERE x.d IS NOT NULL""", vparams + params)
    # stale weights: only the rollouts whose two versions differ (a run's steps each have their own)
    stale = toks.dropna(subset=["policy_version", "train_version"])
    stale = stale[stale["policy_version"] != stale["train_version"]].drop_duplicates("rollout_id")
    causes = diagnose(toks[["rollout_id", "pos", "delta", "trained", "entropy"]],
                      list(stale["policy_version"].unique()), list(stale["train_version"].unique()))
    return engines, causes
