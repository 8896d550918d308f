"""What a pair rule is: :class:`PairRule`, its options with their help and choices (the CLI and
the curation form are generated from its fields), their validation, and the names a pair
carries (``RULES``, ``LEVELS``, ``STATUSES``).

The rules themselves run in :mod:`studio.curation.build`: ``best_vs_worst`` (the pair with
the largest reward margin in a set), ``correct_vs_incorrect`` (every correct × incorrect pair)
or ``all_pairs`` (every pair whose rewards differ), at the ``completion`` level (sets are
groups), the ``step`` level (sets are fork siblings) or the ``turn`` level (sets are fork siblings
and groups; a pair is two trajectories that share their turns up to one and differ from it on).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from studio.configs import problems, setting
from studio.curation.errors import CurationError

RULES = ("best_vs_worst", "correct_vs_incorrect", "all_pairs")
LEVELS = ("completion", "step", "turn")  # the levels of a rule, which are the kinds of its pairs
STATUSES = ("pending", "accepted", "rejected")


ROLLOUT_CORRECT = "correct"
"""``PairRule.correct_component`` naming the rollout's own correctness (``rollouts.correct``)."""


@dataclass(frozen=True)
class PairRule:
    """How pairs are made from a set of scored completions (a group, or a fork's siblings); the
    CLI (and the curation form) are generated from these fields (help and choices in their
    metadata)."""

    name: str = setting("best_vs_worst", "best_vs_worst: the largest margin per set; correct_vs_incorrect: every "
                        "correct × incorrect pair; all_pairs: every pair whose rewards differ", choices=RULES,
                        flag="--rule", label="pair rule")
    level: str = setting("completion", "completion: sets are groups of sampled completions; step: sets are fork "
                         "siblings (same prefix, different continuation); turn: fork siblings and group members "
                         "(agent trajectories) that share their turns up to one and differ from it on",
                         choices=LEVELS)
    min_margin: float | None = setting(None, "keep pairs whose chosen reward exceeds the rejected one by at least "
                                       "this (default: any positive margin; correct_vs_incorrect: no limit)", 0.0,
                                       label="min margin")
    length_match: float | None = setting(None, "keep pairs whose token lengths differ by at most this share of the "
                                         "longer one (0.2: within 20 percent), so length is not what is taught "
                                         "(default: no limit)", 0.0, 1.0, label="length match (a share)")
    per_prompt_cap: int | None = setting(None, "at most this many pairs per prompt, largest margins first "
                                         "(default: no cap)", 1, label="per-prompt cap")
    dedupe: bool = setting(True, "identical completions (same prompt, same text) count once (the first made "
                           "stands for them), and the same two texts make one pair per prompt in either order, "
                           "stored pairs included (no A > B beside B > A)")
    within: str = setting("group", "completion level: pair within each sampled group, or across every completion "
                          "of a prompt", choices=("group", "prompt"))
    correct_component: str = setting("correct", "correct_vs_incorrect: what says a completion is correct: 'correct' "
                                     "(the rollout's verified answer, whatever version is shown) or a reward "
                                     "component of the version (e.g. accuracy)")
    correct_threshold: float = setting(1.0, "correct_vs_incorrect: correct when that component is at or above this")

    def validate(self) -> None:
        """Raise :class:`CurationError` naming every option outside its declared bounds or choices."""
        bad = problems(self)
        if not self.correct_component:
            bad.append("name the reward component that says a completion is correct")
        if bad:
            raise CurationError("; ".join(bad))

    def params(self) -> dict:
        """The options that shaped the pairs (stored with every pair)."""
        out = {k: v for k, v in asdict(self).items() if k != "name"}
        if self.name != "correct_vs_incorrect":
            out.pop("correct_component"), out.pop("correct_threshold")
        return out
