"""Worker processes for heavy work: the pool (:mod:`studio.workers.processes`) and the jobs it runs
(:mod:`studio.workers.jobs`); policy references and token texts (:mod:`studio.workers.vocab`);
coroutines run from synchronous code (:mod:`studio.workers.sync`).

Callers use this package's names (``workers.pool()``, ``workers.sample_job``, …). Workers
never touch the store: they return plain records and the owner writes them.
"""
from studio.workers.jobs import (
    TokenizerMismatch,
    agent_branch_job,
    agent_job,
    answer_prob_job,
    branch_job,
    context_length,
    enrich_job,
    policy_version,
    prm_job,
    sample_job,
    score_job,
    value_job,
    warm_job,
)
from studio.workers.processes import pool, reset_pool, shutdown, warm

__all__ = ["TokenizerMismatch", "agent_branch_job", "agent_job", "answer_prob_job", "branch_job", "context_length", "enrich_job", "policy_version",
           "pool", "prm_job", "reset_pool", "sample_job", "score_job", "shutdown", "value_job", "warm",
           "warm_job"]
