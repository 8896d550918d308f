"""Training–inference mismatch over a large store: per-token Δ and per-sequence summaries in DuckDB
against the same computation in pandas.

Run: ``python benchmarks/bench_mismatch.py`` (100M tokens: a few minutes on a 2-core CPU, most of
it building the store and reading the baseline's rows; ``--tokens 10000000`` for a quick check).

One figure, ``mismatch_100m_tokens_s``, on an on-disk store (a temporary directory, or ``--db
PATH``, reused when it holds the same number of tokens) of ``--tokens`` token rows (default
100,000,000: 1M rollouts x 100 tokens) with both log-probs: the behaviour one in
``tokens.logprob`` and a recomputed one in ``tokens.train_logprob`` (the behaviour log-prob plus
a small noise, a few larger outliers). The rows are made by DuckDB from ``range()`` with ids in
the studio's order (``r`` + 16 hex digits, rising with creation) and about 1% tool tokens
(``trained = false``, no log-prob), as agent rollouts have.

DuckDB (the figure)
    The studio's own path: ``studio.queries.mismatch.sequence_summaries(store, None)`` over the
    whole store (Δ per token by ``signals.mismatch.delta_sql``, the per-rollout n, ΣΔ, mean Δ,
    geometric-mean ratio, max |Δ|, mean k1/k2/k3 by ``sequence_aggregates_sql``), fetched as a
    DataFrame (1M rows).

Baseline, ``pandas_mismatch_s``
    The same rows read into pandas once (not timed): rollout ids as a categorical (DuckDB ENUM ->
    pandas Categorical), the two log-probs as float32. Timed: Δ = train − behaviour in float64
    (NaN where either is missing), k1/k2/k3 per token, one ``groupby`` of the rollout codes with
    count, sum, mean, max |Δ| and the means of k1/k2/k3, and the geometric-mean ratio.

Both results are checked against each other (and against ``signals.mismatch.sequence_stats`` on
a few rollouts) before timing; then they alternate for ``--reps`` repetitions and the figure is
the DuckDB median, the baseline the pandas median. Target: ratio <= 0.5 and under 5 s.

Options: --tokens, --per-rollout, --reps, --db, --threads, --smoke (20,000 tokens, one repetition).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: import the project's packages

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from benchmarks import smoke  # noqa: E402
from studio.queries.mismatch import sequence_summaries  # noqa: E402
from studio.signals.mismatch import SEQUENCE_COLUMNS, delta, kl_terms, sequence_stats  # noqa: E402
from studio.store import Store  # noqa: E402

TARGET_RATIO, TARGET_S = 0.5, 5.0


def build(store: Store, tokens: int, per_rollout: int) -> None:
    """Fill ``token_rows`` with ``tokens`` rows, ``per_rollout`` per rollout, in one INSERT from range()."""
    store.cursor().execute(f"""
        INSERT INTO token_rows (rollout_id, pos, token_id, logprob, train_logprob, trained)
        SELECT printf('r%016x', i // {per_rollout}) AS rollout_id, (i % {per_rollout})::INTEGER AS pos,
               (hash(i) % 50000)::INTEGER AS token_id,
               CASE WHEN tool THEN NULL ELSE b END AS logprob,
               CASE WHEN tool THEN NULL ELSE b + noise END AS train_logprob,
               NOT tool AS trained
        FROM (SELECT i, (hash(i * 7 + 1) % 100) = 0 AS tool,
                     -((hash(i * 7 + 2) % 1000000) / 1000000.0) * 4 AS b,
                     ((hash(i * 7 + 3) % 1000000) / 1000000.0 - 0.5) * 0.02
                       + CASE WHEN hash(i * 7 + 4) % 1000 = 0 THEN 0.8 ELSE 0 END AS noise
              FROM range({tokens}) r(i))""")  # range() keeps its order: ids rise with the rows


def pandas_frame(store: Store) -> pd.DataFrame:
    """The baseline's rows: rollout ids as a pandas Categorical, the log-probs as float32."""
    cur = store.cursor()
    cur.execute("DROP TYPE IF EXISTS rid")
    cur.execute("CREATE TYPE rid AS ENUM (SELECT DISTINCT rollout_id FROM tokens ORDER BY 1)")
    return cur.execute("""SELECT rollout_id::rid AS rollout_id, logprob, train_logprob, trained
                          FROM tokens""").df()


def pandas_summaries(df: pd.DataFrame) -> pd.DataFrame:
    """Δ per token and the per-rollout summaries, as :func:`sequence_summaries` computes them in SQL."""
    keep = df["trained"].fillna(True).to_numpy(dtype=bool)
    d = delta(df["train_logprob"].to_numpy()[keep], df["logprob"].to_numpy()[keep])
    k1, k2, k3 = kl_terms(d)
    frame = pd.DataFrame({"r": df["rollout_id"].cat.codes.to_numpy()[keep], "d": d, "a": np.abs(d),
                          "k1": k1, "k2": k2, "k3": k3})
    frame = frame[np.isfinite(d)]
    g = frame.groupby("r", sort=True)
    out = pd.DataFrame({"n": g["d"].count(), "delta_sum": g["d"].sum(), "delta_mean": g["d"].mean(),
                        "max_abs_delta": g["a"].max(), "k1": g["k1"].mean(), "k2": g["k2"].mean(),
                        "k3": g["k3"].mean()})
    out["geo_ratio"] = np.exp(out["delta_mean"])
    out.index = df["rollout_id"].cat.categories[out.index]
    return out


def check(duck: pd.DataFrame, pand: pd.DataFrame, df: pd.DataFrame) -> None:
    """The two results agree on every rollout, and with ``signals.mismatch.sequence_stats`` on a few."""
    d = duck.set_index("rollout_id")
    p = pand.loc[d.index]
    for col in SEQUENCE_COLUMNS:
        diff = np.nanmax(np.abs(d[col].to_numpy(dtype=float) - p[col].to_numpy(dtype=float)))
        assert diff < 1e-6, f"{col}: DuckDB and pandas differ by {diff}"
    few = df[df["rollout_id"].isin(d.index[:5])]
    few = few[few["trained"].fillna(True)]
    ref = sequence_stats(delta(few["train_logprob"], few["logprob"]), few["rollout_id"].astype(str).to_numpy())
    assert np.allclose(ref[list(SEQUENCE_COLUMNS)].to_numpy(float), d.loc[ref.index, list(SEQUENCE_COLUMNS)]
                       .to_numpy(float), atol=1e-6), "DuckDB differs from signals.mismatch.sequence_stats"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=100_000_000, help="token rows in the store")
    ap.add_argument("--per-rollout", type=int, default=100, help="tokens per rollout")
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions of each side")
    ap.add_argument("--db", type=Path, default=None, help="store file (default: a temporary directory)")
    ap.add_argument("--threads", type=int, default=None, help="DuckDB threads (default: all cores)")
    args = smoke.parse_args(ap, argv, tokens=20_000, reps=1)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.db or Path(tmp) / "mismatch.duckdb"
        store = Store.open(path)
        if args.threads:
            store.cursor().execute(f"SET threads = {int(args.threads)}")
        have = int(store.scalar("SELECT count(*) FROM token_rows"))
        if have != args.tokens:
            store.cursor().execute("DELETE FROM token_rows")
            t0 = time.perf_counter()
            build(store, args.tokens, args.per_rollout)
            print(f"built {args.tokens:,} token rows in {time.perf_counter() - t0:.1f} s", flush=True)
        t0 = time.perf_counter()
        df = pandas_frame(store)
        print(f"read {len(df):,} rows into pandas in {time.perf_counter() - t0:.1f} s (not timed)", flush=True)
        check(sequence_summaries(store, None), pandas_summaries(df), df)
        duck_s, pandas_s = [], []
        for rep in range(args.reps):
            for side in ((0, 1) if rep % 2 == 0 else (1, 0)):
                t0 = time.perf_counter()
                if side == 0:
                    sequence_summaries(store, None)
                    duck_s.append(time.perf_counter() - t0)
                else:
                    pandas_summaries(df)
                    pandas_s.append(time.perf_counter() - t0)
        value, base = statistics.median(duck_s), statistics.median(pandas_s)
        print(f"DuckDB sequence_summaries: {value:.2f} s, pandas: {base:.2f} s, ratio {value / base:.2f} "
              f"(target <= {TARGET_RATIO} and < {TARGET_S:g} s)")
        store.close()
    print(json.dumps({"figure": "mismatch_100m_tokens_s", "value": round(value, 4), "unit": "s",
                      "baseline": "pandas_mismatch_s", "baseline_value": round(base, 4),
                      "ratio": round(value / base, 4)}))


if __name__ == "__main__":
    main()
