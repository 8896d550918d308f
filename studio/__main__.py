"""``python -m studio``: the ``rollout-studio`` command."""
import runpy

if __name__ == "__main__":
    runpy.run_module("studio.face.cli", run_name="__main__", alter_sys=True)
