"""Rewards: the component library, built-in rules, user rules in a sandbox, reward models.

Modules, one job each: :mod:`~studio.rewards.rewardlib` (the components user rules import as
``studio.rewardlib``), :mod:`~studio.rewards.builtin` (``Rule`` and the built-in rules),
:mod:`~studio.rewards.sandbox` (running user code with limits), :mod:`~studio.rewards.rules`
(applying, versioning and diffing user rules), :mod:`~studio.rewards.reward_models` (scoring
with a reward model), :mod:`~studio.rewards.diagnostics` (reward-hacking signals).
This package re-exports the built-in rules and the component library.
"""
from studio.rewards.builtin import (
                                    ARITHMETIC_V1,
                                    DEFAULT_RULES,
                                    MATH_V1,
                                    Component,
                                    Rule,
                                    default_rule,
                                    rule_version_frame,
                                    score_frame,
)
from studio.rewards.rewardlib import *  # noqa: F403
from studio.rewards.rewardlib import __all__ as _library

__all__ = ["ARITHMETIC_V1", "DEFAULT_RULES", "MATH_V1", "default_rule", "Component", "Rule", "rule_version_frame", "score_frame", *_library]
