"""``python -m studio.minirun``: a documented command, kept; it runs :mod:`studio.face.cli.minirun`."""
import runpy

if __name__ == "__main__":
    runpy.run_module("studio.face.cli.minirun", init_globals={"ENTRY_PROG": "python -m studio.minirun"}, run_name="__main__")
