"""``python -m backends.server``: the same as ``rollout-studio backend`` (:mod:`.cli`)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
