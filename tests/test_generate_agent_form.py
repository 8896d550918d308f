"""The Generate form on the agent world: picking a task with tools shows its tool-call budget, sets a token
budget a trajectory fits in and the sample agent policy, makes the task's own new prompts (chat messages), and
a Generate from the form stores trajectories with their turns."""
from __future__ import annotations

import asyncio

from sample_data import AGENT_POLICY_DIR, POLICY_DIR
from studio.store import Store
from widgets.base.state import StudioState
from widgets.generate_panel import GeneratePanel


def test_picking_the_agent_task_sets_its_budgets_and_policy_and_generates_trajectories():
    store = Store.open()
    state = StudioState(store=store)
    state.policy_path = str(POLICY_DIR)
    panel = GeneratePanel(state=state)
    assert "calculator_agent" in panel.param.task.objects
    assert not panel._turns_row.visible and panel.max_new_tokens < 256
    panel.task = "calculator_agent"
    assert panel._turns_row.visible and panel.max_new_tokens >= 256
    assert state.policy_path == str(AGENT_POLICY_DIR)
    panel.fresh, panel.group_size, panel.max_turns = 2, 2, 4
    prompts = panel.prompts()
    assert len(prompts) == 2 and all(p.messages and p.gold.get("answer") is not None for p in prompts)
    asyncio.run(panel._on_generate())
    got = store.df("SELECT n_turns, n_tool_calls FROM rollouts")
    assert len(got) == 4 and (got["n_tool_calls"] <= 4).all() and (got["n_turns"] > 1).any()
    assert store.scalar("SELECT count(*) FROM turns WHERE role = 'tool'") > 0
    assert store.scalar("SELECT count(*) FROM tokens WHERE NOT trained") > 0
    # back on arithmetic: the budget row hides; a user's own pick of policy stays
    panel.task = "arithmetic"
    assert not panel._turns_row.visible
