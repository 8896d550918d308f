"""What the pickers list: the store's runs by label, and a selector's options and value
changed as one patch."""
from __future__ import annotations

import panel as pn
import param

from studio import queries
from studio.store import Store


def run_choices(store: Store) -> dict[str, str]:
    """Label -> run id of every run with rollouts, as the run pickers show them (the id
    suffix keeps two runs with the same name apart)."""
    runs = queries.runs(store)
    return run_labels(runs[runs["rollouts"] > 0])


def run_labels(runs) -> dict[str, str]:
    """Label -> run id of each row of ``queries.runs`` (the id suffix keeps two runs with the same
    name and size apart)."""
    return {f"{name} ({n}) · {rid[-6:]}": rid for name, n, rid in
            zip(runs["name"], runs["rollouts"], runs["run_id"], strict=True)}


def set_choices(obj: param.Parameterized, name: str, objects: list, value) -> None:
    """Give selector ``name`` new ``objects`` and then ``value``, sent to the browser as one
    patch: a Select shown options without its value (or a value without its options) shows
    the wrong choice. The widget may pass through its first option on the way: callers hold
    their watchers off while they call this (``_quiet``)."""
    with pn.io.hold():
        obj.param[name].objects = objects
        if getattr(obj, name) != value:
            setattr(obj, name, value)
