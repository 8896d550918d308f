"""``python -m studio.face.cli``: the ``rollout-studio`` command."""
from studio.face.cli import entry

if __name__ == "__main__":
    entry()
