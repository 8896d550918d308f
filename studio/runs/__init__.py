"""Work that runs a model or writes a run: Generate (:mod:`~studio.runs.generation`), branching at a
fork (:mod:`~studio.runs.branch`), a second policy on stored tokens (:mod:`~studio.runs.compare`),
step credit by a model (:mod:`~studio.runs.credit_models`), enrich (:mod:`~studio.runs.enrich`),
mini-runs (:mod:`studio.runs.minirun`: the owner side; :mod:`studio.runs.training`: the worker side),
and what the process knows about policies (:mod:`~studio.runs.registry`).
"""
