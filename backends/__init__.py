"""Model runners: policies with per-token statistics. Knows nothing of the store or UI.

Records and errors import without torch; the runners (which need torch) load on first use,
so a server that only browses never pays for importing torch.
"""
from .types import ROLES, AgentEnv, Generation, PolicyLoadError, ToolReply, Turn, check_policy_folder, is_policy_url

_LAZY = {"Policy": "policy", "load_policy": "policy", "sample_batch": "policy", "score_batch": "policy",
         "branch_batch": "policy", "pick_device": "device", "RemotePolicy": "remote", "RemoteError": "remote"}

__all__ = ["ROLES", "AgentEnv", "Generation", "PolicyLoadError", "ToolReply", "Turn", "check_policy_folder", "is_policy_url", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
