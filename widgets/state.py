"""The state every view of one browser session shares: store, selection, channel, filters.

Views depend on these parameters; changing one (selecting a row, picking a channel,
finishing a Generate) re-renders exactly the views that show it.
"""
from __future__ import annotations

import param

from studio.store import Store
from widgets.style import CHANNELS


class StudioState(param.Parameterized):
    store = param.ClassSelector(class_=Store, doc="The store this session reads and writes.")
    policy_path = param.String(default="", doc="Policy folder used by Generate.")
    rollout_id = param.String(default="", doc="The rollout shown in the token strip.")
    group_id = param.String(default="", doc="The group shown in the group view.")
    channel = param.Selector(default="entropy", objects=CHANNELS, doc="What colours the tokens.")
    refresh = param.Integer(default=0, doc="Bumped when new rollouts are stored, so views reload.")
