"""``python -m studio.rules``: a documented command, kept; it runs :mod:`studio.face.cli.score`."""
import runpy

if __name__ == "__main__":
    runpy.run_module("studio.face.cli.score", init_globals={"ENTRY_PROG": "python -m studio.rules"}, run_name="__main__")
