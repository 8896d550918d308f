"""``python -m studio.enrich``: a documented command, kept; it runs :mod:`studio.face.cli.enrich`."""
import runpy

if __name__ == "__main__":
    runpy.run_module("studio.face.cli.enrich", init_globals={"ENTRY_PROG": "python -m studio.enrich"}, run_name="__main__")
