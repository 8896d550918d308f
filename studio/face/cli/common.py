"""What every subcommand shares: the program name, the exit codes, the store option and error lines."""
from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from pathlib import Path

PROG = "rollout-studio"
OK, FAILED, BAD_INPUT, INTERRUPTED = 0, 1, 2, 130


def exit_code(exc: BaseException) -> int:
    """The exit code of an exception a command did not handle itself (``studio.face.cli``'s contract)."""
    from backends.types import PolicyLoadError
    from studio.errors import StudioError

    if isinstance(exc, KeyboardInterrupt):
        return INTERRUPTED
    if isinstance(exc, StudioError):
        return exc.exit_code
    if isinstance(exc, (PolicyLoadError, OSError, ValueError)):
        return BAD_INPUT
    return FAILED


def command(main: Callable[..., int]) -> Callable[..., int]:
    """A subcommand's ``main``: what it raises becomes one ``error: …`` (or ``refused: …``) line on
    stderr and its exit code (:func:`exit_code`), never a traceback for a user's mistake; Ctrl-C is 130."""
    from backends.types import PolicyLoadError
    from studio.errors import StudioError

    @functools.wraps(main)
    def run(*args, **kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return INTERRUPTED
        except (StudioError, PolicyLoadError, OSError, ValueError) as exc:
            print(f"{getattr(exc, 'label', 'error')}: {exc}", file=sys.stderr)
            return exit_code(exc)

    return run


def _err(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)


def _db_argument(ap: argparse.ArgumentParser) -> None:
    from studio.store import default_db_path

    ap.add_argument("--db", default=str(default_db_path()),
                    help=f"the store: a DuckDB file (default {default_db_path()}), a shared store's folder or a "
                         "team catalog's postgresql:// URL (docs/shared-store.md)")


def _open(db: str):
    from studio.store import Store

    return Store.open_existing(db, mirror=False)  # a command reads little: no mirror of a shared store


def _sample_policy() -> str:
    from sample_data import POLICY_DIR

    return str(POLICY_DIR)


def _db_problem(argv: list[str]) -> str | None:
    """Why a ``--db`` path cannot be a path at all (``~user/…`` for a user that does not exist:
    ``Path.expanduser`` raises RuntimeError, which every subcommand's store opening would let through)."""
    for i, arg in enumerate(argv):
        value = argv[i + 1] if arg == "--db" and i + 1 < len(argv) else arg[5:] if arg.startswith("--db=") else None
        if value is not None:
            try:
                Path(value).expanduser()
            except RuntimeError as exc:
                return f"--db {value}: {exc}"
    return None
