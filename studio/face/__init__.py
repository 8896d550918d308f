"""The faces of the studio: the served app (:mod:`~studio.face.app` composes the page from the tabs of
:mod:`~studio.face.tabs`; :mod:`~studio.face.serve` serves it), the Python API (:mod:`~studio.face.api`,
its argument checks :mod:`~studio.face.checks`, its Panel components :mod:`~studio.face.views`,
:mod:`~studio.face.static_html`) and the command line (:mod:`studio.face.cli`).

The only part of ``studio`` that imports ``widgets``, Panel, HoloViews or Bokeh; nothing in the
core imports it (``tests/test_layers.py``).
"""
