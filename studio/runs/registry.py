"""The policies a picker can offer, shared by every page the process serves: the bundled ones
and every mini-run checkpoint in a store. (The device a local policy's worker runs on is the
worker pool's: ``studio.workers.processes.local_device``.)
"""
from __future__ import annotations

from sample_data import AGENT_POLICY_DIR, CHAT_POLICY_DIR, EARLY_POLICY_DIR, POLICY_DIR
from studio.runs import minirun
from studio.store import Store


def known_policies(store: Store) -> dict[str, str]:
    """Label -> folder of every policy a picker can offer: the bundled ones (the arithmetic world's
    two, the realistic world's chat policy, the agent world's policy) and every mini-run checkpoint in the store."""
    out = {"sample policy": str(POLICY_DIR), "sample policy (early checkpoint)": str(EARLY_POLICY_DIR),
           "sample chat policy (word problems)": str(CHAT_POLICY_DIR),
           "sample agent policy (calculator)": str(AGENT_POLICY_DIR)}
    for r in minirun.checkpoints(store).itertuples():
        out[f"{r.name} · step {int(r.step)}"] = r.path
    return out
