"""Model runners: policies with per-token statistics. Knows nothing of the store or UI."""
from .device import pick_device
from .policy import Generation, Policy, PolicyLoadError, check_policy_folder, load_policy, sample_batch, score_batch

__all__ = ["Generation", "Policy", "PolicyLoadError", "check_policy_folder", "load_policy", "pick_device", "sample_batch", "score_batch"]
