"""``rollout-studio backend`` (also ``python -m backends.server``): a policy over HTTP, the OpenAI completions API."""
from __future__ import annotations

import sys

from studio.face.cli.common import PROG, command

COMMAND = "backend"


@command
def main(argv: list[str], prog: str = f"{PROG} backend") -> int:
    from backends.server import main as serve_backend

    return serve_backend(argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:], globals().get("ENTRY_PROG", f"{PROG} {COMMAND}")))
