"""The state every view of one browser session shares: store, selection, channel, filters,
fork rule, advantage and step settings, the mismatch source and correction.

Views depend on these parameters; changing one (selecting a row, picking a channel,
finishing a Generate) re-renders exactly the views that show it. A click reads first, then
shows (``widgets.base.preload``). Nothing here is process-wide: what every page of the process
shares (known policies, folder tailers, devices) is the core's (``studio.runs.registry``,
``studio.ingest.tailers``).
"""
from __future__ import annotations

import param

from studio.queries import RolloutFilter, lookups
from studio.signals.advantages import ESTIMATORS, Credit
from studio.signals.forks import DEFAULT_MIN_ENTROPY, DEFAULT_Q, SCOPES, ForkRule
from studio.signals.mismatch import METHODS, Correction
from studio.signals.steps import AGGREGATES, SEGMENTERS, Segmenter
from studio.signals.turns import NORMALISATIONS, TurnCredit
from studio.store import Store

from .preload import Preloading
from .style import CHANNELS


class StudioState(Preloading, param.Parameterized):
    """One browser session's shared state (one per page; a notebook's ``Studio`` has one too)."""


    store = param.ClassSelector(class_=Store, doc="The store this session reads and writes.")
    policy_path = param.String(default="", doc="Policy folder used by Generate.")
    rollout_id = param.String(default="", doc="The rollout shown in the token strip.")
    group_id = param.String(default="", doc="The group shown in the group view.")
    channel = param.Selector(default="entropy", objects=CHANNELS, doc="What colours the tokens.")
    refresh = param.Integer(default=0, doc="Bumped when new rollouts are stored, so views reload.")
    rule_version = param.String(default="", doc="Rule version whose rewards the views show ('' = each "
                                                  "rollout's most recent scoring).")
    fork_pos = param.Integer(default=-1, doc="The token of the shown rollout picked for branching (-1: none).")
    fork_mode = param.Selector(default="top share", objects=["top share", "absolute"],
                               doc="Unsure tokens (marked ▾) are the top share by entropy above a minimum, or "
                                   "every token above a fixed entropy.")
    fork_q = param.Number(default=DEFAULT_Q, bounds=(0.01, 1.0), step=0.01,
                          doc="Top share: the share of the scope's tokens (by entropy) that may be marked, "
                              "TRL's top_entropy_quantile.")
    fork_min = param.Number(default=DEFAULT_MIN_ENTROPY, bounds=(0.0, 10.0), step=0.05,
                            doc="Top share: the least entropy (nats) a marked token has; 0 gives TRL's rule alone.")
    fork_abs = param.Number(default=DEFAULT_MIN_ENTROPY, bounds=(0.0, 10.0), step=0.05,
                            doc="Absolute: the fork threshold, nats.")
    fork_scope = param.Selector(default="run", objects=list(SCOPES),
                                doc="Top share: whose token entropies set the quantile: the run of the rollout's "
                                    "tree root, its training step, or the rollouts the table's filter keeps.")
    branches_of = param.String(default="", doc="The table shows only branches (at any depth) of this rollout.")
    train_step = param.Integer(default=None, allow_None=True, doc="The table shows only this training step's rollouts (None: all).")
    jump_run = param.String(default="", doc="Set to a run id to make the table show that run.")
    table_filter = param.ClassSelector(class_=RolloutFilter, default=RolloutFilter(),
                                       doc="The table's current filter (the 'filter' fork scope reads it).")
    page_groups = param.List(default=[], item_type=str,
                             doc="The groups of the rows on the table's page (the group view's picker offers them).")

    estimator = param.Selector(default="grpo", objects=list(ESTIMATORS),
                               doc="Advantage estimator every view shows (studio.signals.advantages.ESTIMATORS).")
    kl_beta = param.Number(default=0.05, bounds=(0.0, 10.0), step=0.01, doc="β of the KL penalty and implicit PRM.")
    reference = param.String(default="", doc="Reference policy version (stored teacher-forced log-probs).")
    gae_gamma = param.Number(default=1.0, bounds=(0.0, 1.0), step=0.01, doc="GAE discount γ.")
    gae_lam = param.Number(default=1.0, bounds=(0.0, 1.0), step=0.01, doc="GAE λ.")
    value_source = param.String(default="", doc="Critic whose per-token values GAE reads (stored in token_scores).")
    segmenter = param.Selector(default="task", objects=list(SEGMENTERS), doc="How completions split into steps.")
    step_pattern = param.String(default=";", doc="Delimiter, regex or tag name for the step segmentation.")
    step_source = param.String(default="", doc="Step rewards shown under the tokens ('' = none).")
    step_agg = param.Selector(default="min", objects=list(AGGREGATES), doc="Step rewards → outcome.")
    gate_tau = param.Number(default=1.0, bounds=(-10.0, 10.0), step=0.05,
                            doc="Gated accumulation: step rewards count only when the outcome ≥ τ.")
    turn_source = param.String(default="", doc="Per-turn rewards the turn advantages use ('' = the shown version's, "
                                               "else the first stored).")
    turn_norm = param.Selector(default="group", objects=list(NORMALISATIONS),
                               doc="Turn rewards normalised over every turn of the group, per turn index, or not.")
    turn_gamma = param.Number(default=1.0, bounds=(0.0, 1.0), step=0.05,
                              doc="Discount of later turns in a turn's advantage (1: summed to go, 0: the turn alone).")
    turn_gate = param.Boolean(default=False, doc="G-RA over turns: turn rewards count only when the outcome ≥ τ.")

    mismatch_source = param.String(default="", doc="Recomputed log-probs Δ is taken against ('' = the stored "
                                                   "tokens.train_logprob, else a token_scores source).")
    mm_preset = param.String(default="", doc="The correction preset last picked ('' = the fields as set by hand).")
    mm_method = param.Selector(default="tis", objects=list(METHODS), doc="Correction method (signals.mismatch.METHODS).")
    mm_cap = param.Number(default=2.0, bounds=(0.0, 1e6), step=0.1,
                          doc="Correction cap C: TIS truncates the ratio there, MIS/ICEPOP mask above it.")
    mm_low = param.Number(default=0.0, bounds=(0.0, 1e6), step=0.05, doc="Lower end of the MIS/ICEPOP band.")
    mm_threshold = param.Number(default=0.0, bounds=(0.0, 1e6), step=0.01,
                                doc="Rejection threshold of k1/k3/geo-mean/sequence-k3 methods.")
    mm_marks = param.Boolean(default=False, doc="Mark the tokens the correction clips or drops on every channel "
                                                "(always on under the mismatch channel).")

    def correction(self) -> Correction:
        """The correction the sidebar's Mismatch card describes. Fields that make none (a cap of 0, a band whose
        low end is above its cap) leave the last one that did, and :meth:`correction_problem` says why: the
        strip, the table and the Mismatch tab keep drawing."""
        try:
            c = Correction(method=self.mm_method, cap=float(self.mm_cap), low=float(self.mm_low),
                           threshold=float(self.mm_threshold))
        except ValueError as exc:
            self._correction_problem = str(exc)
            return getattr(self, "_last_correction", Correction())
        self._correction_problem, self._last_correction = "", c
        return c

    def correction_problem(self) -> str:
        """Why the Mismatch card's fields make no correction ('' when they make one)."""
        self.correction()
        return self._correction_problem

    def credit(self) -> Credit:
        return Credit(estimator=self.estimator, beta=float(self.kl_beta), reference=self.reference or None,
                      gamma=float(self.gae_gamma), lam=float(self.gae_lam), values=self.value_source or None)

    def turn_credit(self) -> TurnCredit:
        return TurnCredit(self.turn_norm, float(self.turn_gamma), float(self.gate_tau) if self.turn_gate else None)

    def segmentation(self) -> Segmenter:
        return Segmenter(self.segmenter, self.step_pattern)

    def fork_rule(self) -> ForkRule:
        return ForkRule(q=float(self.fork_q), absolute=float(self.fork_abs) if self.fork_mode == "absolute" else None,
                        scope=self.fork_scope, min_entropy=float(self.fork_min))

    def open_rollout(self, rollout_id: str, pos: int | None = None) -> bool:
        """Show ``rollout_id`` in the token strip and its group in the group view (and pick
        token ``pos`` when given). False when the rollout is not in the store."""
        gid = lookups.group_of(self.store, rollout_id)
        if gid is None:
            return False
        self.param.update(rollout_id=rollout_id, group_id=gid)
        if pos is not None:
            self.fork_pos = pos
        return True
