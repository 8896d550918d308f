"""Curated preference data: the studio's output to the rest of the pipeline.

The public API of the package's modules, one job each, for the widgets, the API and one command
line (:mod:`studio.face.cli.curate`):

- :mod:`~studio.curation.rules`: what a pair rule is (:class:`PairRule`, its options and names);
- :mod:`~studio.curation.build`: making a rule's pairs over a scope and a reward version;
- :mod:`~studio.curation.stale`: which stored pairs were deleted or re-scored since;
- :mod:`~studio.curation.review`: the review queue and the decisions on pairs;
- :mod:`~studio.curation.formats`: TRL's preference, unpaired and stepwise rows of the pairs;
- :mod:`~studio.curation.writer`: writing them as JSONL, Parquet or a ``datasets`` folder;
- :mod:`~studio.curation.provenance`: the sidecar and the stored exports;
- :mod:`~studio.curation.errors`: the errors a request can raise.

::

    python -m studio.curation build  --db studio.duckdb --rule correct_vs_incorrect --length-match 0.2
    python -m studio.curation accept --db studio.duckdb --build b1234...   # or review in the UI
    python -m studio.curation status --db studio.duckdb
    python -m studio.curation export --db studio.duckdb --out prefs.jsonl --format preference

Exit codes: 0 done, 1 refused (nothing to export, stale pairs, a rule that made no pair),
2 bad arguments or an unreadable store.
"""
from __future__ import annotations

from studio.curation.build import BuildResult, build_pairs, default_version
from studio.curation.errors import CurationError, NothingToExport, StalePairsError
from studio.curation.formats import FORMATS, STYLES
from studio.curation.provenance import export_provenance, exports, sidecar_of
from studio.curation.review import accept, builds, decide, hand_pick, progress, queue, reject, set_note, swap
from studio.curation.rules import LEVELS, RULES, STATUSES, PairRule
from studio.curation.stale import stale_pairs
from studio.curation.writer import FILETYPES, ExportResult, export, export_bytes, filetype_of, versioned_path

__all__ = ["FILETYPES", "FORMATS", "LEVELS", "RULES", "STATUSES", "STYLES", "BuildResult", "CurationError",
           "ExportResult", "NothingToExport", "PairRule", "StalePairsError", "accept", "build_pairs", "builds",
           "decide", "default_version", "export", "export_bytes", "export_provenance", "exports", "filetype_of",
           "hand_pick", "progress", "queue", "reject", "set_note", "sidecar_of", "stale_pairs", "swap",
           "versioned_path"]
