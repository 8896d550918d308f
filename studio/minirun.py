"""``python -m studio.minirun``: a documented command, kept; it runs :mod:`studio.runs.minirun`."""
import runpy

if __name__ == "__main__":
    runpy.run_module("studio.runs.minirun", run_name="__main__", alter_sys=True)
