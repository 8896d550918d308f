"""Every benchmark's ``--smoke`` flag: a tiny run that proves the script still runs against the code.

A smoke run replaces the benchmark's sizes with tiny ones (a flag given on the command line
still wins) and goes through the same code paths, down to the JSON figure lines, in seconds;
``tests/test_benchmarks.py`` runs each one so that a schema or API change that breaks a
benchmark fails a test. Its figures measure nothing worth reporting.
"""
from __future__ import annotations

import argparse

NOTE = "smoke run: tiny sizes, to check that the benchmark runs; its figures are not measurements"


def parse_args(ap: argparse.ArgumentParser, argv: list[str] | None = None, **sizes) -> argparse.Namespace:
    """``ap``'s arguments plus ``--smoke``; with ``--smoke``, ``sizes`` replace the defaults.

    Args:
        ap: the benchmark's parser (without ``--smoke``).
        argv: the command line (default ``sys.argv[1:]``).
        sizes: option destinations and their smoke values, e.g. ``reps=1``.
    """
    ap.add_argument("--smoke", action="store_true",
                    help="a tiny run in seconds that checks the benchmark still runs (figures mean nothing)")
    unknown = set(sizes) - {a.dest for a in ap._actions}
    if unknown:
        raise ValueError(f"smoke sizes for options the benchmark does not have: {sorted(unknown)}")
    args = ap.parse_args(argv)
    if args.smoke:
        ap.set_defaults(**sizes)
        args = ap.parse_args(argv)  # flags given on the command line keep their values
        print(NOTE, flush=True)
    return args
