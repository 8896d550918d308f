"""Writing an export of the accepted, non-stale pairs: :func:`export` to a file or folder,
:func:`export_bytes` / :func:`export_download` for a browser download.

The rows are one of TRL's formats (:mod:`studio.curation.formats`) as JSONL, Parquet or a
Hugging Face ``datasets`` folder (``save_to_disk``). Files are written beside the target under
a temporary name and renamed in, inside the transaction that stores the ``exports`` and
``export_pairs`` rows: a failure leaves neither a file nor a row. An existing target is never
overwritten unless asked (the next free ``name-2.jsonl`` is used: :func:`versioned_path`).
Every export writes its provenance sidecar (:mod:`studio.curation.provenance`).
"""
from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

from studio.curation.errors import CurationError, NothingToExport, StalePairsError
from studio.curation.formats import FORMATS, STYLES, _prompts, _rows_sql, _selection_sql, _step_source, _texts_sql
from studio.curation.provenance import _provenance, _write_sidecar, sidecar_of
from studio.curation.rules import LEVELS
from studio.curation.trajectories import has_trajectories, trajectory_texts
from studio.store import Store
from studio.store.files import sha256_of
from studio.store.records import new_id, now

FILETYPES = ("jsonl", "parquet", "datasets")
SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}


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



def export(store: Store, path: str | Path, format: str = "preference", style: str = "standard",
           filetype: str | None = None, *, overwrite: bool = False, skip_stale: bool = False,
           build_id: str | None = None, kinds: Iterable[str] | None = None, pair_ids: Iterable[str] | None = None,
           step_source: str | None = None, step_threshold: float = 0.5, answer_step: bool = True,
           correct_component: str = "correct", correct_threshold: float = 1.0,
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
            being at least ``correct_threshold``). Step pairs carry their shared prefix at
            the end of the prompt (standard) or the start of the assistant's message
            (conversational); stepwise rows are the pairs' rollouts, whole.
        style: ``standard`` (strings: the prompt's text, never a templated string) or
            ``conversational`` (lists of role/content messages: the prompt's chat, system
            prompt included, then the assistant's; an agent trajectory's turns as assistant
            ``tool_calls`` and ``tool`` messages; preference and unpaired only).
        skip_stale: export without the stale pairs (listed in the provenance) instead of
            refusing.
        build_id, kinds, pair_ids: export only these pairs (of the accepted ones).

    Raises:
        NothingToExport: no accepted pair matches, or the format makes no row of them.
        StalePairsError: some accepted pairs are stale and ``skip_stale`` is False.
        CurationError: a bad option (format, style, file type).
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
    if kinds is not None and (not kinds or set(kinds) - set(LEVELS)):
        raise CurationError(f"kinds must be some of {', '.join(LEVELS)}; got {kinds}")
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
        conds.append("build_id = ?")
        params.append(build_id)
    if kinds is not None:
        conds.append("list_contains(?, kind)")
        params.append(kinds)
    if pair_ids is not None:
        conds.append("list_contains(?, pair_id)")
        params.append(list(pair_ids))
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
                f"{skipped['pair_id'].iloc[0]}: {skipped['stale_detail'].iloc[0]}. Build the rule again "
                "(a re-scored pair takes the new rewards and returns to review), reject them, or export without them "
                "(skip stale pairs); nothing was written", skipped)
        sel = sel.filter(pc.invert(stale_mask)).drop_columns(["stale", "stale_detail"])
        if sel.num_rows == 0:
            raise NothingToExport(f"nothing to export: all {len(skipped)} matching accepted pairs are stale")
        cur.register("_sel", sel)
        cur.register("_prompts", _prompts(cur, style))
        opts = {"conflicts": conflicts, "step_threshold": step_threshold, "answer_step": answer_step,
                "correct_component": correct_component, "correct_threshold": correct_threshold,
                "trajectories": style == "conversational" and has_trajectories(cur)}
        extra: dict[str, Any] = {}
        if opts["trajectories"]:  # tool calls and tool messages, as TRL's conversational tool-calling format has them
            conv, as_text = trajectory_texts(cur)
            cur.register("_conv", conv)
            extra["trajectories"] = {"messages": "assistant tool_calls (type function, name, arguments) and tool "
                                                 "messages (name, content)",
                                     "arguments": "JSON text" if as_text else "objects"}
        if format == "stepwise":
            opts["step_source"] = _step_source(cur, step_source)
            extra["step_labels"] = {"source": opts["step_source"], "label": f"step reward > {step_threshold}",
                                    "answer_step": (f"text after the last step, labelled {correct_component} >= "
                                                    f"{correct_threshold}") if answer_step else None}
        if format == "unpaired":
            extra["unpaired"] = {"conflicts": conflicts, "conflicting_completions": int(cur.execute(
                f"""WITH t AS ({_texts_sql(style, opts["trajectories"])}) SELECT count(*) FROM (SELECT prompt, chosen AS c FROM t
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
            to = "'" + str(tmp).replace("'", "''") + "'"  # a literal: DuckDB 1.5 binds COPY's "TO ?" first
            n_rows = cur.execute(f"COPY ({rows_sql}) TO {to} ({opt})", rows_params).fetchall()[0][0]
        if not n_rows:
            why = {"stepwise": "none of their rollouts has step rewards from the chosen source",
                   "unpaired": "every completion is both chosen and rejected somewhere (conflicts are left out)",
                   }.get(fmt, "the pairs make no rows")
            raise NothingToExport(f"nothing to export: {sel.num_rows} accepted pairs, but {why}")
        digest = sha256_of(tmp)
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
    suffix = {"jsonl": ".jsonl", "parquet": ".parquet", "datasets": ""}[filetype]
    name = filename or f"{format}-{style}-{stamp}" + suffix
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
