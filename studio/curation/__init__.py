"""Curated preference data: the studio's output to the rest of the pipeline.

One import for the widgets and one command line over :mod:`studio.curation.pairs` (pair rules over
groups and fork trees, the review queue, staleness) and :mod:`studio.curation.export` (TRL's
preference, unpaired and stepwise formats as JSONL, Parquet or a ``datasets`` folder, with
provenance)::

    python -m studio.curation build  --db studio.duckdb --rule correct_vs_incorrect --length-match 0.2
    python -m studio.curation accept --db studio.duckdb --build b1234...   # or review in the UI
    python -m studio.curation status --db studio.duckdb
    python -m studio.curation export --db studio.duckdb --out prefs.jsonl --format preference

Exit codes: 0 done, 1 refused (nothing to export, stale pairs, a rule that made no pair),
2 bad arguments or an unreadable store.
"""
from __future__ import annotations

from studio.curation.export import (
    FILETYPES,
    FORMATS,
    STYLES,
    ExportResult,
    NothingToExport,
    StalePairsError,
    export,
    export_bytes,
    export_provenance,
    exports,
    filetype_of,
    sidecar_of,
    versioned_path,
)
from studio.curation.pairs import (
    LEVELS,
    RULES,
    STATUSES,
    BuildResult,
    CurationError,
    PairRule,
    accept,
    build_pairs,
    builds,
    decide,
    default_version,
    hand_pick,
    progress,
    queue,
    reject,
    set_note,
    stale_pairs,
    swap,
)

__all__ = ["FILETYPES", "FORMATS", "LEVELS", "RULES", "STATUSES", "STYLES", "BuildResult", "CurationError",
           "ExportResult", "NothingToExport", "PairRule", "StalePairsError", "accept", "build_pairs", "builds",
           "decide", "default_version", "export", "export_bytes", "export_provenance", "exports", "filetype_of",
           "hand_pick", "progress", "queue", "reject", "set_note", "sidecar_of", "stale_pairs", "swap",
           "versioned_path"]
