"""``python -m studio.curation``: a documented command, kept; it runs :mod:`studio.face.cli.curate`."""
import runpy

if __name__ == "__main__":
    runpy.run_module("studio.face.cli.curate", init_globals={"ENTRY_PROG": "python -m studio.curation"},
                     run_name="__main__")
