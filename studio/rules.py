"""``python -m studio.rules``: the documented name of ``rollout-studio score``; it runs that command."""
import runpy
import sys

if __name__ == "__main__":
    sys.argv[1:1] = ["score"]
    runpy.run_module("studio.face.cli", run_name="__main__", alter_sys=True)
