"""``studio.rewardlib``: the name user rules (and the rule sources stored in every store) import.

The library lives in :mod:`studio.rewards.rewardlib`; this module re-exports all of it.
"""
from studio.rewards.rewardlib import *  # noqa: F403
from studio.rewards.rewardlib import __all__  # noqa: F401
