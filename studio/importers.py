"""``python -m studio.importers``: a documented command, kept; it runs :mod:`studio.ingest.importers`."""
import runpy

if __name__ == "__main__":
    runpy.run_module("studio.ingest.importers", run_name="__main__", alter_sys=True)
