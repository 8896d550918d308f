"""Exports of the accepted pairs in TRL's dataset formats, with their provenance.

:func:`export` writes the accepted, non-stale pairs (:mod:`studio.curation.pairs`) as

- ``preference``: prompt / chosen / rejected (DPO and friends);
- ``unpaired``: prompt / completion / label, every chosen side True and every rejected
  side False, each once (KTO);
- ``stepwise``: prompt / completions (the rollout's steps) / labels (each step's reward
  from a step-reward source above a threshold; the answer after the last step labelled by
  correctness) (PRM training),

in the standard style (strings) or the conversational one (lists of ``role`` / ``content``
messages), as JSONL, Parquet or a Hugging Face ``datasets`` folder (``save_to_disk``).
Step pairs carry their shared prefix in the prompt. Files are written beside the target
under a temporary name and renamed in; an existing target is never overwritten unless
asked (the next free ``name-2.jsonl`` is used). Every export writes
``<path>.provenance.json`` (runs, policies, reward versions, pair rules with their
options, filters, decisions: counts per reviewer and every pair's decision, time, studio
version, row count, sha256) and rows in ``exports`` and ``export_pairs``.
:func:`export_bytes` does the same for a browser download.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable

import pandas as pd
import pyarrow.compute as pc

from studio.curation.pairs import NOT_SPECIAL, CurationError, _stale_sql
from studio.errors import NOT_DONE
from studio.store import Store
from studio.store.records import new_id, now

FORMATS = ("preference", "unpaired", "stepwise")
STYLES = ("standard", "conversational")
FILETYPES = ("jsonl", "parquet", "datasets")
SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}


class NothingToExport(CurationError):
    """The export would write no rows."""

    exit_code = NOT_DONE


class StalePairsError(CurationError):
    """Accepted pairs whose rollouts were deleted or re-scored; ``stale`` lists them."""

    exit_code = NOT_DONE

    def __init__(self, message: str, stale: pd.DataFrame):
        super().__init__(message)
        self.stale = stale


@dataclass
class ExportResult:
    path: Path | None  # where it was written (None for a download)
    requested: Path | None  # the path asked for; differs from ``path`` when that existed
    export_id: str
    format: str
    style: str
    filetype: str
    rows: int
    pairs: int
    sha256: str
    provenance_path: Path | None
    provenance: dict = field(repr=False, default_factory=dict)
    skipped_stale: int = 0
    message: str = ""
    _tmpdir: Path | None = field(default=None, repr=False)  # a download's scratch folder


def filetype_of(path: str | Path, filetype: str | None = None) -> str:
    """The file type for ``path``: ``filetype`` when given, else from the suffix (``.jsonl``,
    ``.parquet``; no suffix: a ``datasets`` folder)."""
    if filetype is not None:
        if filetype not in FILETYPES:
            raise CurationError(f"file type must be one of {', '.join(FILETYPES)}, got {filetype!r}")
        return filetype
    suffix = Path(path).suffix.lower()
    if not suffix:
        return "datasets"
    if suffix not in SUFFIXES:
        raise CurationError(f"cannot tell the file type from {Path(path).name!r}: name it .jsonl or .parquet, "
                            "give a folder name without a suffix for a datasets folder (save_to_disk), or say "
                            "the file type")
    return SUFFIXES[suffix]


def sidecar_of(path: Path) -> Path:
    """Where an export's provenance goes: ``<path>.provenance.json``, beside it."""
    return path.with_name(path.name + ".provenance.json")


def versioned_path(path: str | Path) -> Path:
    """``path`` when neither it nor its provenance file exists, else the first free
    ``<stem>-2<suffix>``, ``<stem>-3<suffix>``, … (a folder: ``<name>-2``, …).

    >>> versioned_path("/nonexistent/prefs.jsonl").name
    'prefs.jsonl'
    """
    path = Path(path)
    taken = lambda p: p.exists() or sidecar_of(p).exists()  # noqa: E731
    if not taken(path):
        return path
    i = 2
    while taken(path.with_name(f"{path.stem}-{i}{path.suffix}")):
        i += 1
    return path.with_name(f"{path.stem}-{i}{path.suffix}")


# the pairs columns an export reads (not params, margins, times: a million pairs read faster)
SELECTED = ("pair_id, kind, prompt_id, build_id, rule, source, rule_version_id, swapped, reviewer, decided_at, note, "
            "prefix, chosen_rollout_id, rejected_rollout_id, chosen_reward, rejected_reward")


def _selection_sql(where: str) -> str:
    """Accepted pairs as exported: swaps applied, the prompt with the shared prefix, the two
    continuations after it, and each side's run and policy (for the provenance)."""
    cut = "substr({}, length(coalesce(p.prefix, '')) + 1)"
    return f"""
        SELECT p.pair_id, p.kind, p.prompt_id, p.build_id, p.rule, p.source, p.rule_version_id, p.swapped,
               p.reviewer, p.decided_at, p.note,
               CASE WHEN p.swapped THEN p.rejected_rollout_id ELSE p.chosen_rollout_id END AS chosen_id,
               CASE WHEN p.swapped THEN p.chosen_rollout_id ELSE p.rejected_rollout_id END AS rejected_id,
               pr.text || coalesce(p.prefix, '') AS prompt,
               {cut.format("CASE WHEN p.swapped THEN p.r_text ELSE p.c_text END")} AS chosen,
               {cut.format("CASE WHEN p.swapped THEN p.c_text ELSE p.r_text END")} AS rejected,
               p.c_run, p.r_run, p.c_policy, p.r_policy, p.stale, p.stale_detail
        FROM ({_stale_sql(f"SELECT {SELECTED} FROM pairs WHERE status = 'accepted' AND {where}")}) p
        LEFT JOIN prompts pr ON pr.prompt_id = p.prompt_id"""


def _texts_sql() -> str:
    """prompt / chosen / rejected strings of the registered ``_sel`` pairs."""
    return "SELECT pair_id, prompt, chosen, rejected FROM _sel"


def _msg(role: str, col: str) -> str:
    return f"[{{'role': '{role}', 'content': {col}}}]"


def _rows_sql(fmt: str, style: str, opts: dict) -> tuple[str, list]:
    """The exported rows of the registered ``_sel`` pairs, in TRL's columns."""
    conv = style == "conversational"
    if fmt == "preference":
        cols = (f"{_msg('user', 'prompt')} AS prompt, {_msg('assistant', 'chosen')} AS chosen, "
                f"{_msg('assistant', 'rejected')} AS rejected") if conv else "prompt, chosen, rejected"
        return f"SELECT {cols} FROM ({_texts_sql()}) ORDER BY pair_id", []
    if fmt == "unpaired":
        # every side once; a completion both chosen and rejected has no clear label: left out by default
        keep = "" if opts.get("conflicts") == "keep" else "QUALIFY count(*) OVER (PARTITION BY prompt, completion) = 1"
        cols = (f"{_msg('user', 'prompt')} AS prompt, {_msg('assistant', 'completion')} AS completion, label"
                if conv else "prompt, completion, label")
        return f"""
            WITH t AS ({_texts_sql()}),
            sides AS (SELECT prompt, chosen AS completion, true AS label, pair_id FROM t
                      UNION ALL SELECT prompt, rejected, false, pair_id FROM t),
            once AS (SELECT prompt, completion, label, min(pair_id) AS first FROM sides
                     GROUP BY prompt, completion, label {keep})
            SELECT {cols} FROM once ORDER BY first, label DESC""", []
    # stepwise: each distinct rollout of the pairs, cut into its steps (token ranges of the step source)
    answer = """UNION ALL
            SELECT rid, n_steps, accuracy >= ? FROM ans WHERE accuracy IS NOT NULL""" if opts["answer_step"] else ""
    return f"""
        WITH ids AS (
            SELECT rid, any_value(vid) AS vid, min(pair_id) AS first FROM (
                SELECT chosen_id AS rid, rule_version_id AS vid, pair_id FROM _sel
                UNION ALL SELECT rejected_id, rule_version_id, pair_id FROM _sel) GROUP BY rid),
        st AS (
            SELECT s.rollout_id AS rid, s.start_pos, s.value,
                   row_number() OVER (PARTITION BY s.rollout_id ORDER BY s.step_idx) - 1 AS k,
                   count(*) OVER (PARTITION BY s.rollout_id) AS n_steps,
                   max(s.end_pos) OVER (PARTITION BY s.rollout_id) AS last_end
            FROM step_rewards s JOIN ids ON ids.rid = s.rollout_id
            WHERE s.source = ? AND s.start_pos IS NOT NULL),
        tk AS (SELECT t.rollout_id AS rid, t.pos, t.token_text FROM tokens t
               WHERE t.rollout_id IN (SELECT rid FROM st) AND {NOT_SPECIAL}),
        piece AS (
            SELECT tk.rid, tk.pos, tk.token_text,
                   CASE WHEN st.last_end IS NOT NULL AND tk.pos > st.last_end THEN st.n_steps
                        ELSE coalesce(st.k, 0) END AS k
            FROM tk ASOF LEFT JOIN st ON tk.rid = st.rid AND tk.pos >= st.start_pos),
        texts AS (SELECT rid, k, string_agg(token_text, '' ORDER BY pos) AS text FROM piece GROUP BY rid, k),
        ans AS (
            SELECT DISTINCT st.rid, st.n_steps, acc.value AS accuracy FROM st JOIN ids USING (rid)
            LEFT JOIN rewards acc ON acc.rollout_id = st.rid AND acc.rule_version_id = ids.vid
                 AND acc.component = ?),
        labels AS (SELECT rid, k, value > ? AS label FROM st {answer})
        SELECT pr.text AS prompt, list(x.text ORDER BY x.k) AS completions, list(l.label ORDER BY x.k) AS labels
        FROM texts x JOIN labels l USING (rid, k) JOIN ids USING (rid)
        JOIN rollouts ro ON ro.rollout_id = x.rid JOIN prompts pr ON pr.prompt_id = ro.prompt_id
        GROUP BY x.rid, pr.text, ids.first ORDER BY ids.first, x.rid""", (
        [opts["step_source"], opts["correct_component"], float(opts["step_threshold"])]
        + ([float(opts["correct_threshold"])] if opts["answer_step"] else []))


def _step_source(cur, given: str | None) -> str:
    """The step-reward source for stepwise labels: ``given``, else the only source that scored
    steps of the exported rollouts, else the pairs' version when it is one."""
    sources = [r[0] for r in cur.execute("""
        SELECT DISTINCT source FROM step_rewards WHERE rollout_id IN
            (SELECT chosen_id FROM _sel UNION SELECT rejected_id FROM _sel) ORDER BY 1""").fetchall()]
    if given is not None:
        if given not in sources:
            raise NothingToExport(f"step-reward source {given!r} scored no step of the exported rollouts"
                                  + (f"; sources there: {', '.join(sources)}" if sources else
                                     "; none has step rewards yet (apply a rule with step_reward, or compute "
                                     "PRM / information-gain step scores in the Advantages & steps tab)"))
        return given
    if not sources:
        raise NothingToExport("none of the exported rollouts has step rewards: apply a rule with step_reward, "
                              "or compute PRM / information-gain step scores, then export stepwise again")
    versions = [r[0] for r in cur.execute("SELECT DISTINCT rule_version_id FROM _sel").fetchall()]
    if len(sources) == 1:
        return sources[0]
    if len(versions) == 1 and versions[0] in sources:
        return versions[0]
    raise CurationError(f"the exported rollouts have step rewards from {len(sources)} sources "
                        f"({', '.join(sources)}); say which one labels the steps")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        if path.is_dir():
            h.update(f.relative_to(path).as_posix().encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


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
    return [{c: (v.isoformat() if isinstance(v, datetime) else v) for c, v in zip(cols, row)}
            for row in res.fetchall()]


# per exported pair in the sidecar (its rule, version and kind are its build's, listed in pair_rules;
# build_id null: picked by hand)
PAIR_COLUMNS = ("pair_id", "build_id", "chosen_id", "rejected_id", "swapped", "reviewer", "decided_at", "note")


def export(store: Store, path: str | Path, format: str = "preference", style: str = "standard",
           filetype: str | None = None, *, overwrite: bool = False, skip_stale: bool = False,
           build_id: str | None = None, kinds: Iterable[str] | None = None, pair_ids: Iterable[str] | None = None,
           step_source: str | None = None, step_threshold: float = 0.5, answer_step: bool = True,
           correct_component: str = "accuracy", correct_threshold: float = 1.0,
           conflicts: str = "drop", _download: str | None = None) -> ExportResult:
    """Write the accepted pairs in one of TRL's dataset formats, with provenance.

    Args:
        path: the file (``.jsonl``, ``.parquet``) or folder (``datasets`` ``save_to_disk``).
            When it (or its provenance file) exists, the next free ``name-2.jsonl`` is used
            instead, unless ``overwrite``; the result says which path was written.
        format: ``preference`` (prompt, chosen, rejected), ``unpaired`` (prompt, completion,
            label: every chosen side True, every rejected side False, each once; a
            completion that is both is left out unless ``conflicts="keep"``) or
            ``stepwise`` (prompt, completions: the rollout's steps, labels: step reward
            from ``step_source`` above ``step_threshold``; with ``answer_step`` the text
            after the last step is one more step labelled by the ``correct_component``
            being at least ``correct_threshold``). Step pairs carry their shared prefix in
            the prompt; stepwise rows are the pairs' rollouts, whole.
        style: ``standard`` (strings) or ``conversational`` (lists of role/content
            messages; preference and unpaired only, completion-level pairs only).
        skip_stale: export without the stale pairs (listed in the provenance) instead of
            refusing.
        build_id, kinds, pair_ids: export only these pairs (of the accepted ones).

    Raises:
        NothingToExport: no accepted pair matches, or the format makes no row of them.
        StalePairsError: some accepted pairs are stale and ``skip_stale`` is False.
        CurationError: a bad option (format, style, file type, a conversational step pair).
    """
    if format not in FORMATS:
        raise CurationError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    if style not in STYLES:
        raise CurationError(f"style must be one of {', '.join(STYLES)}, got {style!r}")
    if format == "stepwise" and style == "conversational":
        raise CurationError("TRL's stepwise supervision format is standard (text) only; export it with style "
                            "'standard'")
    if conflicts not in ("drop", "keep"):
        raise CurationError(f"conflicts must be 'drop' or 'keep', got {conflicts!r}")
    kinds = list(kinds) if kinds is not None else None
    if kinds is not None and (not kinds or set(kinds) - {"completion", "step"}):
        raise CurationError(f"kinds must be some of completion, step; got {kinds}")
    requested = Path(path).expanduser() if _download is None else None
    ftype = filetype_of(requested if requested is not None else _download, filetype)
    if ftype == "datasets":
        try:
            import datasets  # noqa: F401  (checked before anything is read or written)
        except ImportError:
            raise CurationError("writing a datasets folder needs the datasets package: pip install datasets "
                                "(or pip install 'rollout-studio[export]'); JSONL and Parquet need nothing "
                                "more") from None

    conds, params = [], []
    if build_id is not None:
        conds.append("build_id = ?"); params.append(build_id)
    if kinds is not None:
        conds.append("list_contains(?, kind)"); params.append(kinds)
    if pair_ids is not None:
        conds.append("list_contains(?, pair_id)"); params.append(list(pair_ids))
    where = " AND ".join(conds) or "TRUE"
    filters = {"status": "accepted", "build_id": build_id, "kinds": kinds,
               "pair_ids": None if pair_ids is None else len(params[-1]), "skip_stale": skip_stale}
    cur = store.cursor()
    try:
        sel = cur.sql(_selection_sql(where), params=params).to_arrow_table()
        if sel.num_rows == 0:
            pending = store.scalar("SELECT count(*) FROM pairs WHERE status = 'pending'")
            raise NothingToExport("nothing to export: no accepted pair" + (" matches the filter" if conds else "")
                                  + (f"; {pending} pairs await review in the queue" if pending else
                                     "; build pairs and accept some first"))
        stale_mask = pc.is_valid(sel.column("stale"))
        skipped = sel.filter(stale_mask).select(["pair_id", "stale", "stale_detail"]).to_pandas()
        if len(skipped) and not skip_stale:
            reasons = skipped["stale"].value_counts()
            why = ", ".join(f"{reasons[k]} {text}" for k, text in (("deleted", "with a deleted rollout"),
                                                                    ("rescored", "re-scored since they were built"))
                            if k in reasons)
            raise StalePairsError(
                f"{len(skipped)} of {sel.num_rows} accepted pairs are stale ({why}), e.g. "
                f"{skipped['pair_id'].iloc[0]}: {skipped['stale_detail'].iloc[0]}. Build the rule again (a re-scored pair "
                "takes the new rewards and returns to review), reject them, or export without them (skip stale pairs); "
                "nothing was written", skipped)
        sel = sel.filter(pc.invert(stale_mask)).drop_columns(["stale", "stale_detail"])
        if sel.num_rows == 0:
            raise NothingToExport(f"nothing to export: all {len(skipped)} matching accepted pairs are stale")
        cur.register("_sel", sel)
        if style == "conversational":
            n_step = cur.execute("SELECT count(*) FROM _sel WHERE kind = 'step'").fetchall()[0][0]
            if n_step:
                raise CurationError(f"{n_step} of the accepted pairs are step pairs: they continue a partial "
                                    "answer, which conversational messages cannot hold. Export them in the "
                                    "standard style, or only the completion pairs (kinds: completion)")
        opts = {"conflicts": conflicts, "step_threshold": step_threshold, "answer_step": answer_step,
                "correct_component": correct_component, "correct_threshold": correct_threshold}
        extra: dict[str, Any] = {}
        if format == "stepwise":
            opts["step_source"] = _step_source(cur, step_source)
            extra["step_labels"] = {"source": opts["step_source"], "label": f"step reward > {step_threshold}",
                                    "answer_step": (f"text after the last step, labelled {correct_component} >= "
                                                    f"{correct_threshold}") if answer_step else None}
        if format == "unpaired":
            extra["unpaired"] = {"conflicts": conflicts, "conflicting_completions": int(cur.execute(
                f"""WITH t AS ({_texts_sql()}) SELECT count(*) FROM (SELECT prompt, chosen AS c FROM t
                    INTERSECT SELECT prompt, rejected FROM t)""").fetchall()[0][0])}
        rows_sql, rows_params = _rows_sql(format, style, opts)
        export_id = new_id("x")
        return _write(store, cur, rows_sql, rows_params, requested, ftype, format, style, overwrite, export_id,
                      filters, skipped, extra, _download, sel)
    finally:
        cur.close()  # drops _sel and ends the cursor's read transaction


def _write(store, cur, rows_sql, rows_params, requested, ftype, fmt, style, overwrite, export_id, filters,
           skipped, extra, download, sel) -> ExportResult:
    """Write rows + sidecar beside the target (temp names, then renamed in), then the store rows."""
    if download is not None:
        tmpdir = Path(tempfile.mkdtemp(prefix="studio-export-"))
        target = tmpdir / download
    else:
        target = requested if overwrite else versioned_path(requested)
        if not target.parent.is_dir():
            raise CurationError(f"the folder {target.parent} does not exist; create it or pick another path")
        tmpdir = None
    tmp = target.with_name(f".{target.name}.writing-{os.getpid()}")
    side_tmp = target.with_name(f".{target.name}.provenance-{os.getpid()}")
    try:
        if ftype == "datasets":
            import datasets

            table = cur.sql(rows_sql, params=rows_params).to_arrow_table()
            n_rows = table.num_rows
            if n_rows:
                bars = datasets.is_progress_bar_enabled()
                datasets.disable_progress_bars()
                try:
                    datasets.Dataset(table).save_to_disk(str(tmp))
                finally:
                    if bars:
                        datasets.enable_progress_bars()
        else:
            opt = "FORMAT parquet" if ftype == "parquet" else "FORMAT json"
            n_rows = cur.execute(f"COPY ({rows_sql}) TO ? ({opt})", rows_params + [str(tmp)]).fetchall()[0][0]
        if not n_rows:
            why = {"stepwise": "none of their rollouts has step rewards from the chosen source",
                   "unpaired": "every completion is both chosen and rejected somewhere (conflicts are left out)",
                   }.get(fmt, "the pairs make no rows")
            raise NothingToExport(f"nothing to export: {sel.num_rows} accepted pairs, but {why}")
        digest = _sha256(tmp)
        existed = download is None and target.exists()
        if existed and not overwrite:  # it appeared since the path was chosen: take the next free version
            target, existed = versioned_path(requested), False
        if existed and target.is_dir() and not ((target / "dataset_info.json").is_file()
                                                or sidecar_of(target).is_file()):
            raise CurationError(f"{target} is a folder that is not a datasets export; it was left as it is: pick "
                                "another path")
        prov = _provenance(store, cur, export_id, fmt, style, ftype, n_rows, filters, skipped, extra)
        prov["file"], prov["sha256"] = target.name, digest
        if download is None:
            prov["path"] = str(target)
            if target != requested:
                prov["requested_path"] = str(requested)
        _write_sidecar(cur, side_tmp, prov)
        snapshot = sel.select(["pair_id", "swapped", "reviewer", "decided_at", "note"])
        stored = {k: v for k, v in prov.items() if k != "skipped_stale"}  # the stale list stays in the sidecar
        stored["skipped_stale"] = {k: v for k, v in prov["skipped_stale"].items() if k != "pairs"}
        with store.transaction() as tx:  # the files are renamed in last: a failure before leaves no row
            tx.execute("INSERT INTO exports VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       [export_id, now(), f"download:{download}" if download else str(target), fmt, style, ftype,
                        int(n_rows), sel.num_rows, digest, json.dumps(stored)])
            tx.register("_snap", snapshot)
            tx.execute("INSERT INTO export_pairs SELECT ?, pair_id, swapped, reviewer, decided_at, note FROM _snap",
                       [export_id]).fetchall()
            tx.unregister("_snap")
            if existed:  # overwrite=True, and the result says so
                shutil.rmtree(target) if target.is_dir() else target.unlink()
            os.replace(tmp, target)
            os.replace(side_tmp, sidecar_of(target))
    except BaseException:
        for p in (tmp, side_tmp):
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)
        raise
    if download is not None:
        msg = f"{n_rows} {fmt} rows from {sel.num_rows} accepted pairs"
    else:
        msg = (f"wrote {n_rows} {fmt} rows ({style}, {ftype}) from {sel.num_rows} accepted pairs to {target}"
               + (f" ({requested.name} exists, so a new version)" if target != requested else "")
               + (" (overwrote the previous file)" if existed else ""))
    if len(skipped):
        msg += f"; left out {len(skipped)} stale pairs"
    return ExportResult(None if download else target, requested, export_id, fmt, style, ftype, int(n_rows),
                        sel.num_rows, digest, None if download else sidecar_of(target), prov, len(skipped), msg,
                        _tmpdir=tmpdir)


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


def export_bytes(store: Store, format: str = "preference", filetype: str = "jsonl", style: str = "standard",
                 filename: str | None = None, **options) -> tuple[str, bytes, dict]:
    """An export for the browser's download: ``(file name, bytes, provenance)``.

    A ``datasets`` folder comes as a ``.zip`` of the folder with ``provenance.json`` inside.
    Takes :func:`export`'s options; recorded in ``exports`` with path ``download:<name>``.
    """
    name, data, prov, _ = _download(store, format, filetype, style, filename, **options)
    return name, data, prov


def export_download(store: Store, format: str = "preference", filetype: str = "jsonl", style: str = "standard",
                    filename: str | None = None, **options) -> tuple[str, bytes, dict, bytes]:
    """:func:`export_bytes` plus the provenance sidecar's bytes (the browser offers both
    files; a ``datasets`` zip also holds it as ``provenance.json``)."""
    return _download(store, format, filetype, style, filename, **options)


def _download(store, format, filetype, style, filename, **options) -> tuple[str, bytes, dict, bytes]:
    if filetype not in FILETYPES:
        raise CurationError(f"file type must be one of {', '.join(FILETYPES)}, got {filetype!r}")
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    name = filename or f"{format}-{style}-{stamp}" + {"jsonl": ".jsonl", "parquet": ".parquet", "datasets": ""}[filetype]
    res = export(store, name, format, style, filetype, _download=name, **options)
    path = res._tmpdir / name
    try:
        sidecar = sidecar_of(path).read_bytes()
        if filetype == "datasets":
            buf = io.BytesIO()
            with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
                for f in sorted(path.rglob("*")):
                    if f.is_file():
                        zf.write(f, f"{name}/{f.relative_to(path).as_posix()}")
                zf.write(sidecar_of(path), f"{name}/provenance.json")
            return f"{name}.zip", buf.getvalue(), res.provenance, sidecar
        return name, path.read_bytes(), res.provenance, sidecar
    finally:
        shutil.rmtree(res._tmpdir, ignore_errors=True)


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
