"""``python -m studio.enrich``: a documented command, kept; it runs :mod:`studio.runs.enrich`."""
import runpy

if __name__ == "__main__":
    runpy.run_module("studio.runs.enrich", run_name="__main__", alter_sys=True)
