"""What a pair rule is: :class:`PairRule`, its options with their help and choices (the CLI and
the curation form are generated from its fields), their validation, and the names a pair
carries (``RULES``, ``LEVELS``, ``STATUSES``).

The rules themselves run in :mod:`studio.curation.build`: ``best_vs_worst`` (the pair with
the largest reward margin in a set), ``correct_vs_incorrect`` (every correct × incorrect pair)
or ``all_pairs`` (every pair whose rewards differ), at the ``completion`` level (sets are
groups) or the ``step`` level (sets are fork siblings).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from studio.curation.errors import CurationError

RULES = ("best_vs_worst", "correct_vs_incorrect", "all_pairs")
LEVELS = ("completion", "step")
STATUSES = ("pending", "accepted", "rejected")


def _f(default, help: str, choices=None):
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass(frozen=True)
class PairRule:
    """How pairs are made from a set of scored completions (a group, or a fork's siblings); the
    CLI (and the curation form) are generated from these fields (help and choices in their
    metadata)."""

    name: str = _f("best_vs_worst", "best_vs_worst: the largest margin per set; correct_vs_incorrect: every "
                   "correct × incorrect pair; all_pairs: every pair whose rewards differ", RULES)
    level: str = _f("completion", "completion: sets are groups of sampled completions; step: sets are fork "
                    "siblings (same prefix, different continuation)", LEVELS)
    min_margin: float | None = _f(None, "keep pairs whose chosen reward exceeds the rejected one by at least "
                                  "this (default: any positive margin; correct_vs_incorrect: no limit)")
    length_match: float | None = _f(None, "keep pairs whose token lengths differ by at most this share of the "
                                    "longer one (0.2: within 20 percent), so length is not what is taught "
                                    "(default: no limit)")
    per_prompt_cap: int | None = _f(None, "at most this many pairs per prompt, largest margins first "
                                    "(default: no cap)")
    dedupe: bool = _f(True, "identical completions (same prompt, same text) count once (the first made stands "
                      "for them), and the same two texts make one pair per prompt in either order, stored pairs "
                      "included (no A > B beside B > A)")
    within: str = _f("group", "completion level: pair within each sampled group, or across every completion of "
                     "a prompt", ("group", "prompt"))
    correct_component: str = _f("accuracy", "correct_vs_incorrect: the reward component that says a completion "
                                "is correct")
    correct_threshold: float = _f(1.0, "correct_vs_incorrect: correct when that component is at or above this")

    def validate(self) -> None:
        problems = []
        if self.name not in RULES:
            problems.append(f"pair rule must be one of {', '.join(RULES)}, got {self.name!r}")
        if self.level not in LEVELS:
            problems.append(f"level must be one of {', '.join(LEVELS)}, got {self.level!r}")
        if self.within not in ("group", "prompt"):
            problems.append(f"within must be 'group' or 'prompt', got {self.within!r}")
        if self.min_margin is not None and not (self.min_margin == self.min_margin and self.min_margin >= 0):
            problems.append(f"min margin must be a number >= 0, got {self.min_margin}")
        if self.length_match is not None and not 0 <= self.length_match <= 1:
            problems.append(f"length match must be a share between 0 and 1, got {self.length_match}")
        if self.per_prompt_cap is not None and self.per_prompt_cap < 1:
            problems.append(f"per-prompt cap must be at least 1, got {self.per_prompt_cap}")
        if not self.correct_component:
            problems.append("name the reward component that says a completion is correct")
        if problems:
            raise CurationError("; ".join(problems))

    def params(self) -> dict:
        """The options that shaped the pairs (stored with every pair)."""
        out = {k: v for k, v in asdict(self).items() if k != "name"}
        if self.name != "correct_vs_incorrect":
            out.pop("correct_component"), out.pop("correct_threshold")
        return out
