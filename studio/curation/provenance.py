"""An export's provenance: the sidecar ``<path>.provenance.json`` beside every export (runs,
policies, reward versions, pair rules with their options, filters, decisions: counts per
reviewer and every pair's decision, time, studio version, row count, sha256), and the stored
``exports`` rows read back (:func:`exports`, :func:`export_provenance`).
"""
from __future__ import annotations

import json
import shutil
from datetime import datetime
from pathlib import Path

import pandas as pd

from studio.curation.errors import CurationError
from studio.store import Store
from studio.store.records import now


def sidecar_of(path: Path) -> Path:
    """Where an export's provenance goes: ``<path>.provenance.json``, beside it."""
    return path.with_name(path.name + ".provenance.json")


def _provenance(store: Store, cur, export_id: str, fmt: str, style: str, filetype: str, n_rows: int,
                filters: dict, skipped: pd.DataFrame, extra: dict) -> dict:
    """The export's provenance summary (the per-pair decisions are appended to the sidecar
    and kept in ``export_pairs``)."""
    runs = _records(cur, """
        WITH sides AS (SELECT c_run AS run_id, c_policy AS pv FROM _sel UNION SELECT r_run, r_policy FROM _sel)
        SELECT r.run_id, r.name, r.kind, r.policy,
               list(DISTINCT s.pv) FILTER (WHERE s.pv IS NOT NULL) AS policy_versions
        FROM sides s JOIN runs r USING (run_id)
        GROUP BY ALL ORDER BY r.run_id""")
    for r in runs:
        r["policy_versions"] = sorted(r["policy_versions"] or [])
    versions = _records(cur, """
        SELECT rule_version_id, name, sha256, created_at, note FROM rule_versions
        WHERE rule_version_id IN (SELECT rule_version_id FROM _sel) ORDER BY 1""")
    rules = _records(cur, """
        SELECT b.build_id, b.rule, b.level, b.params, b.scope, b.rule_version_id, b.created_at,
               count(*) AS exported_pairs
        FROM _sel s JOIN pair_builds b USING (build_id) GROUP BY ALL ORDER BY b.created_at, b.build_id""")
    for r in rules:
        r["params"], r["scope"] = json.loads(r["params"] or "{}"), json.loads(r["scope"] or "{}")
    hand = cur.execute("SELECT count(*) FROM _sel WHERE source = 'hand'").fetchall()[0][0]
    by = _records(cur, """
        SELECT reviewer, count(*) AS pairs, count(*) FILTER (WHERE swapped) AS swapped, count(note) AS noted,
               min(decided_at) AS first_decision, max(decided_at) AS last_decision
        FROM _sel GROUP BY 1 ORDER BY 1 NULLS LAST""")
    kinds = dict(cur.execute("SELECT kind, count(*) FROM _sel GROUP BY 1 ORDER BY 1").fetchall())
    totals = dict(cur.execute("SELECT status, count(*) FROM pairs GROUP BY 1 ORDER BY 1").fetchall())
    policies = sorted({p for r in runs for p in r["policy_versions"]} | {r["policy"] for r in runs if r["policy"]})
    try:
        from importlib.metadata import version
        studio_version = version("rollout-studio")
    except Exception:  # running from a checkout that was never installed
        studio_version = "unknown"
    return {
        "export_id": export_id, "created_at": now().isoformat() + "Z", "studio_version": studio_version,
        "store": store.path, "format": fmt, "style": style, "filetype": filetype, "rows": int(n_rows),
        "pairs": int(cur.execute("SELECT count(*) FROM _sel").fetchall()[0][0]), "kinds": kinds,
        "runs": runs, "policies": policies, "rule_versions": versions,
        "pair_rules": rules + ([{"rule": "hand", "exported_pairs": int(hand)}] if hand else []),
        "filters": filters,
        "decisions": {"exported": "accepted pairs only", "by_reviewer": by,
                      "store_totals": {k: int(v) for k, v in totals.items()}},
        "skipped_stale": {"count": int(len(skipped)),
                          "by_reason": {k: int(v) for k, v in skipped["stale"].value_counts().items()},
                          "pairs": skipped[["pair_id", "stale", "stale_detail"]].to_dict("records")},
        **extra,
    }


def _records(cur, sql: str) -> list[dict]:
    """Rows as JSON-ready dicts (times as ISO strings)."""
    res = cur.execute(sql)
    cols = [d[0] for d in res.description]
    return [{c: (v.isoformat() if isinstance(v, datetime) else v) for c, v in zip(cols, row, strict=True)}
            for row in res.fetchall()]


# per exported pair in the sidecar (its rule, version and kind are its build's, listed in pair_rules;
# build_id null: picked by hand)
PAIR_COLUMNS = ("pair_id", "build_id", "chosen_id", "rejected_id", "swapped", "reviewer", "decided_at", "note")


def _write_sidecar(cur, path: Path, prov: dict) -> None:
    """The provenance JSON: the summary, then ``pairs``, every exported pair's decision (written
    by DuckDB: a million pairs take well under a second)."""
    head = json.dumps(prov, indent=1, default=str)
    cols = ", ".join(f"{c}" if c != "decided_at" else "strftime(decided_at, '%Y-%m-%dT%H:%M:%S.%f') AS decided_at"
                     for c in PAIR_COLUMNS)
    part = path.with_name(path.name + ".pairs")
    try:
        cur.execute(f"COPY (SELECT {cols} FROM _sel ORDER BY pair_id) TO ? (FORMAT json, ARRAY true)",
                    [str(part)]).fetchall()  # DuckDB 2: finish a result before other work on the cursor
        with open(path, "w", encoding="utf-8") as out:
            out.write(head[:-1].rstrip() + ',\n "pair_decisions": ')
            with open(part, encoding="utf-8") as src:
                shutil.copyfileobj(src, out, 1 << 20)
            out.write("}\n")
    finally:
        part.unlink(missing_ok=True)


def exports(store: Store) -> pd.DataFrame:
    """Every export, newest first (without the provenance JSON: read it with :func:`export_provenance`)."""
    return store.df("""SELECT export_id, created_at, path, format, style, filetype, n_rows, n_pairs, sha256
                       FROM exports ORDER BY created_at DESC, export_id""")


def export_provenance(store: Store, export_id: str) -> dict:
    """The provenance summary stored with an export."""
    raw = store.scalar("SELECT provenance FROM exports WHERE export_id = ?", [export_id])
    if raw is None:
        raise CurationError(f"no export {export_id!r} in this store")
    return json.loads(raw)
