"""``rollout-studio serve`` (also ``python launch.py``): the studio in a browser; see :mod:`studio.face.serve`."""
from __future__ import annotations

import sys

from studio.face import serve
from studio.face.cli.common import PROG, command

COMMAND = "serve"


@command
def main(argv: list[str], prog: str = f"{PROG} serve") -> int:
    return serve.main(argv, prog=prog)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:], globals().get("ENTRY_PROG", f"{PROG} {COMMAND}")))
