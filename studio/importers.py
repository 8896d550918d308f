"""``python -m studio.importers``: a documented command, kept; it runs :mod:`studio.face.cli.import_`."""
import runpy

if __name__ == "__main__":
    runpy.run_module("studio.face.cli.import_", init_globals={"ENTRY_PROG": "python -m studio.importers"}, run_name="__main__")
