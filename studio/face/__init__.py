"""The faces of the studio: the served app (:mod:`~studio.face.app`, :mod:`~studio.face.serve`), the
Python API and its views (:mod:`~studio.face.api`, :mod:`~studio.face.static_html`) and the command
line (:mod:`studio.face.cli`).

The only part of ``studio`` that imports ``widgets``, Panel, HoloViews or Bokeh; nothing in the
core imports it (``tests/test_layers.py``).
"""
