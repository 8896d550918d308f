"""Serve Rollout Studio: ``python launch.py [--db PATH] [--policy FOLDER|URL] ...`` or ``panel serve launch.py``.

A thin entry point: the options, the checks and the server are :mod:`studio.face.serve`.
"""
import sys

from studio.face.serve import main, served_by_panel

if __name__ == "__main__":
    sys.exit(main())
elif __name__.startswith("bokeh_app"):
    served_by_panel()
