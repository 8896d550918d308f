"""The quantities the studio makes visible, as pure functions over arrays (no store, no model).

:mod:`~studio.signals.advantages` (the estimator zoo and its SQL twins), :mod:`~studio.signals.forks`
(which tokens are forks), :mod:`~studio.signals.steps` (reasoning steps and step credit),
:mod:`~studio.signals.stats` (paired statistics of the run diff). ``studio.queries`` applies them to
what the store holds.
"""
