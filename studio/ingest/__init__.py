"""Training runs brought in from outside: TRL, verl, OpenRLHF / RL-Logging-Board and generic
JSONL / Parquet, imported once (:mod:`~studio.ingest.importers`) or followed as they grow
(:mod:`~studio.ingest.tail`, :mod:`~studio.ingest.tailers`).

An import reads a file (:mod:`~studio.ingest.read`), resolves the format's fields
(:mod:`~studio.ingest.formats`), turns records into the studio's rows
(:mod:`~studio.ingest.normalise`) and writes one transaction (:mod:`~studio.ingest.write`).
"""
