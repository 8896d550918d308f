"""Preference pairs: made by rules over groups and fork trees, reviewed, checked for staleness.

:func:`build_pairs` makes pairs in DuckDB, in one query per rule run, over a scope of
rollouts and one reward version:

- ``level="completion"``: the sets are groups (completions sampled together; or every
  completion of a prompt with ``within="prompt"``). Branch rollouts are left out: their
  text starts with a forced prefix.
- ``level="step"``: the sets are fork siblings, the branches of one rollout at one
  position plus that rollout itself (:mod:`studio.queries.forks`). The pair keeps their longest
  common token prefix as ``prefix`` and the two continuations after it: exported, the
  prompt is the prompt plus that prefix (a step-level pair).

Within a set the rule picks pairs: ``best_vs_worst`` (the pair with the largest reward
margin), ``correct_vs_incorrect`` (every correct × incorrect pair; correct: the
``accuracy`` component, or another, at or above a threshold) or ``all_pairs`` (every pair
whose rewards differ). Options: a minimum margin, length matching (relative token
difference), identical completions once and identical pairs once per prompt (``dedupe``),
and a per-prompt cap (largest margins first). A pair's id is a hash of its kind and its two
rollouts, so building a rule twice adds nothing.

Review (:func:`queue`, :func:`accept`, :func:`reject`, :func:`swap`, :func:`set_note`,
:func:`hand_pick`, :func:`progress`) sets a pair's status, order and note, with the reviewer
and the time. A pair is *stale* (:func:`stale_pairs`) when one of its rollouts is gone or its
total reward under the pair's version is no longer the one it was built with;
:mod:`studio.curation.export` refuses stale pairs.
"""
from __future__ import annotations

import getpass
import hashlib
import json
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Iterable

import pandas as pd

from studio import queries
from studio.errors import StudioError
from studio.rewards import DEFAULT_RULES
from studio.signals.advantages import EQUAL_TOL
from studio.store import Store
from studio.store.records import new_id, now

RULES = ("best_vs_worst", "correct_vs_incorrect", "all_pairs")
LEVELS = ("completion", "step")
STATUSES = ("pending", "accepted", "rejected")
# a special token's text (<eos>, <pad>) is no part of the completion text (as credit.steps_of)
NOT_SPECIAL = "NOT (t.token_text LIKE '<%>' AND length(t.token_text) > 2)"


class CurationError(StudioError, ValueError):
    """A pair or export request that cannot be done as asked; the message says what to change."""



# ---------------------------------------------------------------------------- pair rules

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


@dataclass
class BuildResult:
    build_id: str | None  # None when nothing new was stored
    rule: PairRule
    rule_version_id: str
    pairs: int  # pairs the rule made over the scope
    added: int  # of those, new in the store
    seconds: float
    message: str


def _scope(scope: queries.RolloutFilter | None, run_ids: Iterable[str] | None,
           rule_version_id: str | None) -> tuple[str, list, dict]:
    """A condition on ``rollouts ro`` for the scope, its parameters, and its description.

    Correctness and reward filters read ``rule_version_id``'s rewards (None: each
    rollout's latest, as the table shows them)."""
    conds, params, desc = [], [], {}
    if run_ids:
        run_ids = list(run_ids)
        conds.append("list_contains(?, ro.run_id)"); params.append(run_ids); desc["run_ids"] = run_ids
    if scope is not None:
        desc.update({k: v for k, v in asdict(scope).items() if v is not None and k != "limit"})
        simple = {"run_id": "ro.run_id = ?", "group_id": "ro.group_id = ?", "train_step": "ro.train_step = ?"}
        for name, cond in simple.items():
            if getattr(scope, name) is not None:
                conds.append(cond); params.append(getattr(scope, name))
        rest = replace(scope, run_id=None, group_id=None, train_step=None, limit=10**9)
        if rest != queries.RolloutFilter(limit=10**9):  # text, correctness, reward or branch filters
            sql, p = queries.rollout_table_sql(rule_version_id, rest)
            conds.append(f"ro.rollout_id IN (SELECT rollout_id FROM ({sql}))"); params += p
    return (" AND ".join(conds) or "TRUE"), params, desc


def default_version(store: Store, scope: queries.RolloutFilter | None = None,
                    run_ids: Iterable[str] | None = None) -> str:
    """The reward version pairs compare by default: the task's built-in rule when it scored
    rollouts of the scope, else the version that scored most of them (the newest on ties)."""
    cond, params, _ = _scope(scope, run_ids, None)
    df = store.df(f"""
        SELECT rw.rule_version_id, count(*) AS n, max(v.created_at) AS last_at
        FROM rewards rw JOIN rule_versions v USING (rule_version_id)
        WHERE rw.component = 'total' AND rw.value IS NOT NULL
          AND rw.rollout_id IN (SELECT ro.rollout_id FROM rollouts ro WHERE {cond})
        GROUP BY 1 ORDER BY n DESC, last_at DESC, 1""", params, timeout_s=0)
    if df.empty:
        raise CurationError("no rollout in scope has a reward yet: apply a reward rule to them first")
    builtin = {r.version_id for r in DEFAULT_RULES.values()}
    for vid in df["rule_version_id"]:
        if vid in builtin:
            return vid
    return str(df["rule_version_id"].iloc[0])


def _pairs_sql(rule: PairRule, cond: str) -> str:
    """The query that makes ``rule``'s pairs over the rollouts ``cond`` selects (bound values:
    :func:`_pair_params`)."""
    correct = rule.name == "correct_vs_incorrect"
    cc = ("LEFT JOIN rewards cc ON cc.rollout_id = ro.rollout_id AND cc.rule_version_id = ? "
          "AND cc.component = ?") if correct else ""
    step = rule.level == "step"
    if not step:  # sets are groups (or prompts); branches start with a forced prefix and are left out
        ctes = []
        source = f"""FROM rollouts ro
            JOIN rewards tot ON tot.rollout_id = ro.rollout_id AND tot.rule_version_id = ? AND tot.component = 'total'
            {cc}
            WHERE ro.parent_rollout_id IS NULL AND {cond} AND tot.value IS NOT NULL"""
        set_key = f"ro.{'group_id' if rule.within == 'group' else 'prompt_id'}"
    else:  # a fork: its parent and the branches taken at one position of it
        ctes = [f"""forks AS (
            SELECT DISTINCT b.parent_rollout_id AS parent, b.fork_pos
            FROM rollouts b WHERE b.parent_rollout_id IS NOT NULL AND (
                b.rollout_id IN (SELECT ro.rollout_id FROM rollouts ro WHERE {cond})
                OR b.parent_rollout_id IN (SELECT ro.rollout_id FROM rollouts ro WHERE {cond})))""",
                """members AS (
            SELECT b.rollout_id, f.parent || '@' || f.fork_pos AS set_key
            FROM forks f JOIN rollouts b ON b.parent_rollout_id = f.parent AND b.fork_pos = f.fork_pos
            UNION ALL
            SELECT f.parent, f.parent || '@' || f.fork_pos FROM forks f)"""]
        source = f"""FROM members m JOIN rollouts ro USING (rollout_id)
            JOIN rewards tot ON tot.rollout_id = ro.rollout_id AND tot.rule_version_id = ? AND tot.component = 'total'
            {cc}
            WHERE tot.value IS NOT NULL"""
        set_key = "m.set_key"
    better = ("a.cval >= ? AND b.cval < ?" if correct else f"a.reward - b.reward > {EQUAL_TOL!r}")
    # texts are compared by a 64-bit hash (th): two different completions of one prompt colliding is
    # a chance of about n² / 2^64
    ctes.append(f"""sc AS (
            SELECT {set_key} AS set_key, ro.rollout_id, ro.prompt_id, ro.n_tokens, hash(ro.text) AS th,
                   ro.created_at AS made,
                   tot.value AS reward{', cc.value AS cval' if correct else ''}{', ro.text' if step else ''}
            {source})""")
    if rule.dedupe:  # identical completions of one set count once: the first made stands for them (at a fork:
        # the rollout the branches continue, before a branch that repeats it), then the smallest id
        ctes.append("""u AS (SELECT * FROM sc
                            QUALIFY row_number() OVER (PARTITION BY set_key, th ORDER BY made, rollout_id) = 1)""")
    else:
        ctes.append("u AS (SELECT * FROM sc)")
    texts = ", a.text AS ctext, b.text AS rtext" if step else ""
    ctes.append(f"""cand AS (
            SELECT a.set_key, a.prompt_id, a.rollout_id AS chosen, b.rollout_id AS rejected,
                   a.reward AS chosen_reward, b.reward AS rejected_reward, a.reward - b.reward AS margin,
                   a.th AS cth, b.th AS rth, a.n_tokens AS cn, b.n_tokens AS rn{texts}
            FROM u a JOIN u b ON a.set_key = b.set_key AND a.rollout_id <> b.rollout_id
            WHERE {better} AND a.th <> b.th AND a.reward - b.reward >= ?)""")
    if step:
        ctes.append("""lcp AS (
            SELECT c.chosen, c.rejected,
                   coalesce(min(ta.pos) FILTER (WHERE ta.token_id IS DISTINCT FROM tb.token_id),
                            least(any_value(c.cn), any_value(c.rn))) AS k
            FROM cand c JOIN tokens ta ON ta.rollout_id = c.chosen
            JOIN tokens tb ON tb.rollout_id = c.rejected AND tb.pos = ta.pos
            GROUP BY c.chosen, c.rejected)""")
        ctes.append(f"""pre AS (
            SELECT l.chosen, l.rejected, l.k,
                   coalesce(string_agg(t.token_text, '' ORDER BY t.pos)
                                FILTER (WHERE t.pos < l.k AND {NOT_SPECIAL}), '')
                       AS prefix
            FROM lcp l LEFT JOIN tokens t ON t.rollout_id = l.chosen AND t.pos < l.k
            GROUP BY l.chosen, l.rejected, l.k)""")
        ctes.append("""shaped AS (
            SELECT c.*, p.prefix, p.k AS prefix_tokens, c.cn - p.k AS clen, c.rn - p.k AS rlen
            FROM cand c JOIN pre p USING (chosen, rejected)
            WHERE starts_with(c.ctext, p.prefix) AND starts_with(c.rtext, p.prefix))""")
    else:
        ctes.append("""shaped AS (
            SELECT c.*, NULL::VARCHAR AS prefix, NULL::INTEGER AS prefix_tokens, c.cn AS clen, c.rn AS rlen
            FROM cand c)""")
    picked = "shaped"
    if rule.length_match is not None:
        ctes.append("matched AS (SELECT * FROM shaped WHERE abs(clen - rlen) <= ? * greatest(clen, rlen, 1))")
        picked = "matched"
    order = "margin DESC, abs(clen - rlen), chosen, rejected"
    if rule.name == "best_vs_worst":
        ctes.append(f"""bvw AS (
            SELECT * FROM {picked} QUALIFY row_number() OVER (PARTITION BY set_key ORDER BY {order}) = 1)""")
        picked = "bvw"
    if rule.dedupe:  # the same two texts for one prompt: one pair, here and against the stored pairs
        ctes.append(f"""stored AS (
            SELECT p.prompt_id, p.chosen_rollout_id, p.rejected_rollout_id, hash(c.text) AS cth, hash(r.text) AS rth,
                   coalesce(p.prefix, '') AS prefix
            FROM pairs p JOIN rollouts c ON c.rollout_id = p.chosen_rollout_id
            JOIN rollouts r ON r.rollout_id = p.rejected_rollout_id
            WHERE p.prompt_id IN (SELECT prompt_id FROM {picked}))""")
        ctes.append(f"""dd AS (
            SELECT * FROM {picked} x
            WHERE NOT EXISTS (SELECT 1 FROM stored s WHERE s.prompt_id = x.prompt_id
                              AND ((s.cth = x.cth AND s.rth = x.rth) OR (s.cth = x.rth AND s.rth = x.cth))
                              AND s.prefix = coalesce(x.prefix, '')
                              AND NOT (s.chosen_rollout_id = x.chosen AND s.rejected_rollout_id = x.rejected))
            QUALIFY row_number() OVER (PARTITION BY prompt_id, cth, rth, coalesce(prefix, '') ORDER BY {order}) = 1)""")
        picked = "dd"
    if rule.per_prompt_cap is not None:
        ctes.append(f"""capped AS (
            SELECT * FROM {picked} QUALIFY row_number() OVER (PARTITION BY prompt_id ORDER BY {order}) <= ?)""")
        picked = "capped"
    kind = "'completion'" if rule.level == "completion" else "'step'"
    return "WITH " + ",\n".join(c.strip() for c in ctes) + f"""
        SELECT 'pr' || substr(md5({kind} || ':' || chosen || ':' || rejected), 1, 16) AS pair_id,
               prompt_id, chosen AS chosen_rollout_id, rejected AS rejected_rollout_id, {kind} AS kind,
               prefix, prefix_tokens, chosen_reward, rejected_reward, margin
        FROM {picked}"""


def _pair_params(rule: PairRule, vid: str, scope_params: list) -> list:
    """The bound values of :func:`_pairs_sql`, in the order they appear in its text."""
    correct = rule.name == "correct_vs_incorrect"
    rewards = [vid] + ([vid, rule.correct_component] if correct else [])  # the total, and the correct component
    if rule.level == "step":  # forks (the scope twice), then the rewards of their members
        params = list(scope_params) * 2 + rewards
    else:  # the rewards joined, then the scope in the WHERE clause
        params = rewards + list(scope_params)
    if correct:
        params += [float(rule.correct_threshold)] * 2
    margin = rule.min_margin if rule.min_margin is not None else (float("-inf") if correct else 0.0)
    params.append(float(margin))
    if rule.length_match is not None:
        params.append(float(rule.length_match))
    if rule.per_prompt_cap is not None:
        params.append(int(rule.per_prompt_cap))
    return params


def build_pairs(store: Store, rule: PairRule = PairRule(), scope: queries.RolloutFilter | None = None,
                run_ids: Iterable[str] | None = None, rule_version_id: str | None = None) -> BuildResult:
    """Make ``rule``'s pairs over the rollouts of ``scope`` (and/or ``run_ids``; all when
    both are None) under reward version ``rule_version_id`` (default: :func:`default_version`)
    and store the new ones as ``pending``, with one ``pair_builds`` row, in one transaction.
    A stored pair the rule makes again whose rollouts were re-scored under the version since
    (stale) takes the new rewards and goes back to ``pending`` for another look.

    Raises:
        CurationError: a bad rule option, an unknown version, or a correctness component
            the version does not have.
    """
    rule.validate()
    t0 = time.perf_counter()
    vid = rule_version_id or default_version(store, scope, run_ids)
    if not store.scalar("SELECT count(*) FROM rule_versions WHERE rule_version_id = ?", [vid]):
        raise CurationError(f"no reward version {vid!r} in this store (see the rule panel's versions)")
    if rule.name == "correct_vs_incorrect":
        comps = store.df("SELECT DISTINCT component FROM rewards WHERE rule_version_id = ? ORDER BY 1", [vid],
                         timeout_s=0)["component"].tolist()
        if rule.correct_component not in comps:
            raise CurationError(f"version {vid} has no {rule.correct_component!r} component to tell correct "
                                f"from incorrect; it has {', '.join(comps) or 'no components'}. Pick one of "
                                "those as the correctness component")
    cond, sparams, desc = _scope(scope, run_ids, vid)
    sql = _pairs_sql(rule, cond)
    params = _pair_params(rule, vid, sparams)
    created = now()
    with store.transaction() as cur:
        # each pair comes once out of the query (a rollout is in one set; a fork's parent pairs only with
        # its own branches there), so counts need no DISTINCT; stored ids are not added again
        cur.execute(f"CREATE OR REPLACE TEMP TABLE _built AS {sql}", params)
        made = cur.execute("SELECT count(*) FROM _built").fetchall()[0][0]
        # a stored pair of this version whose rewards changed since (re-scored): refreshed, back to pending
        refreshed = cur.execute("""
            UPDATE pairs SET chosen_reward = b.chosen_reward, rejected_reward = b.rejected_reward, margin = b.margin,
                             status = 'pending', reviewer = NULL, decided_at = NULL
            FROM _built b
            WHERE pairs.pair_id = b.pair_id AND pairs.rule_version_id = ?
              AND ((pairs.chosen_reward IS NULL) <> (b.chosen_reward IS NULL)
                   OR (pairs.rejected_reward IS NULL) <> (b.rejected_reward IS NULL)
                   OR abs(pairs.chosen_reward - b.chosen_reward) > 1e-12
                   OR abs(pairs.rejected_reward - b.rejected_reward) > 1e-12)""", [vid]).fetchall()[0][0]
        cur.execute("CREATE OR REPLACE TEMP TABLE _new AS "
                    "SELECT * FROM _built WHERE pair_id NOT IN (SELECT pair_id FROM pairs)")
        new = cur.execute("SELECT count(*) FROM _new").fetchall()[0][0]
        build_id = new_id("b") if new else None
        if new:
            cur.execute("""INSERT INTO pair_builds VALUES (?, ?, ?, ?, ?, ?, ?, ?)""",
                        [build_id, rule.name, rule.level, json.dumps(rule.params()), json.dumps(desc, default=str),
                         vid, created, new])
            cur.execute("""
                INSERT INTO pairs (pair_id, prompt_id, chosen_rollout_id, rejected_rollout_id, kind, prefix,
                                   prefix_tokens, rule, params, build_id, rule_version_id, chosen_reward,
                                   rejected_reward, margin, status, swapped, created_at, source)
                SELECT pair_id, prompt_id, chosen_rollout_id, rejected_rollout_id, kind, prefix, prefix_tokens,
                       ?, ?, ?, ?, chosen_reward, rejected_reward, margin, 'pending', false, ?, 'rule'
                FROM _new""",
                        [rule.name, json.dumps(rule.params()), build_id, vid, created])
        cur.execute("DROP TABLE _built")
        cur.execute("DROP TABLE _new")
    what = f"{rule.name} ({rule.level} level) under {vid}"
    if not made:
        msg = f"{what}: no pairs in scope (no set has two completions that differ as the rule asks)"
    elif not new:
        msg = f"{what}: all {made} pairs are stored already; nothing added"
    else:
        msg = f"{what}: {new} new pairs" + (f" ({made - new} were stored already)" if made > new else "")
    if refreshed:
        msg += (f"; {refreshed} stored pair{'s' if refreshed > 1 else ''} re-scored since refreshed with the new "
                "rewards and back to pending")
    return BuildResult(build_id, rule, vid, int(made), int(new), time.perf_counter() - t0, msg)


# ---------------------------------------------------------------------------- staleness

def _stale_sql(pairs_sql: str) -> str:
    """Rows of ``pairs_sql`` (pairs columns) with ``stale``: NULL, 'deleted' or 'rescored', and
    ``stale_detail`` saying which rollout and what changed; and, read on the way, both
    rollouts' ``c_text`` / ``r_text``, ``c_run`` / ``r_run`` and ``c_policy`` / ``r_policy``
    (as built: before a swap)."""
    return f"""
        WITH ps AS ({pairs_sql}),
        ids AS (SELECT chosen_rollout_id AS rid, rule_version_id AS vid FROM ps WHERE rule_version_id IS NOT NULL
                UNION SELECT rejected_rollout_id, rule_version_id FROM ps WHERE rule_version_id IS NOT NULL),
        cur AS (SELECT rw.rollout_id, rw.rule_version_id, min(rw.value) AS lo, max(rw.value) AS hi,
                       count(rw.value) AS n
                FROM rewards rw JOIN ids ON ids.rid = rw.rollout_id AND ids.vid = rw.rule_version_id
                WHERE rw.component = 'total' GROUP BY ALL),
        j AS (
            SELECT ps.*, c.rollout_id IS NULL AS c_gone, r.rollout_id IS NULL AS r_gone,
                   ps.rule_version_id IS NOT NULL AND NOT (
                       (ps.chosen_reward IS NULL AND coalesce(cc.n, 0) = 0)
                       OR (cc.lo IS NOT NULL AND abs(cc.lo - ps.chosen_reward) <= 1e-12
                           AND abs(cc.hi - ps.chosen_reward) <= 1e-12)) AS c_changed,
                   ps.rule_version_id IS NOT NULL AND NOT (
                       (ps.rejected_reward IS NULL AND coalesce(rc.n, 0) = 0)
                       OR (rc.lo IS NOT NULL AND abs(rc.lo - ps.rejected_reward) <= 1e-12
                           AND abs(rc.hi - ps.rejected_reward) <= 1e-12)) AS r_changed,
                   cc.lo AS c_now, rc.lo AS r_now, c.text AS c_text, r.text AS r_text, c.run_id AS c_run,
                   r.run_id AS r_run, c.policy_version AS c_policy, r.policy_version AS r_policy
            FROM ps LEFT JOIN rollouts c ON c.rollout_id = ps.chosen_rollout_id
            LEFT JOIN rollouts r ON r.rollout_id = ps.rejected_rollout_id
            LEFT JOIN cur cc ON cc.rollout_id = ps.chosen_rollout_id AND cc.rule_version_id = ps.rule_version_id
            LEFT JOIN cur rc ON rc.rollout_id = ps.rejected_rollout_id AND rc.rule_version_id = ps.rule_version_id)
        SELECT * EXCLUDE (c_gone, r_gone, c_changed, r_changed, c_now, r_now),
               CASE WHEN c_gone OR r_gone THEN 'deleted' WHEN c_changed OR r_changed THEN 'rescored' END AS stale,
               CASE WHEN c_gone OR r_gone THEN concat_ws(' and ',
                        CASE WHEN c_gone THEN 'chosen rollout ' || chosen_rollout_id END,
                        CASE WHEN r_gone THEN 'rejected rollout ' || rejected_rollout_id END) || ' deleted'
                    WHEN c_changed OR r_changed THEN concat_ws('; ',
                        CASE WHEN c_changed THEN 'chosen reward ' || coalesce(chosen_reward::VARCHAR, 'none')
                             || ' is now ' || coalesce(c_now::VARCHAR, 'none') END,
                        CASE WHEN r_changed THEN 'rejected reward ' || coalesce(rejected_reward::VARCHAR, 'none')
                             || ' is now ' || coalesce(r_now::VARCHAR, 'none') END) || ' under ' || rule_version_id
               END AS stale_detail
        FROM j"""


def _where(status: str | None = None, build_id: str | None = None, kind: str | None = None,
           pair_ids: Iterable[str] | None = None) -> tuple[str, list]:
    conds, params = [], []
    if status is not None:
        if status not in STATUSES:
            raise CurationError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
        conds.append("status = ?"); params.append(status)
    if build_id is not None:
        conds.append("build_id = ?"); params.append(build_id)
    if kind is not None:
        if kind not in ("completion", "step"):
            raise CurationError(f"kind must be 'completion' or 'step', got {kind!r}")
        conds.append("kind = ?"); params.append(kind)
    if pair_ids is not None:
        conds.append("list_contains(?, pair_id)"); params.append(list(pair_ids))
    return (" AND ".join(conds) or "TRUE"), params


def stale_pairs(store: Store, status: str | None = "accepted", build_id: str | None = None,
                pair_ids: Iterable[str] | None = None) -> pd.DataFrame:
    """Pairs (accepted ones by default) that can no longer be exported as built:
    ``pair_id, status, stale`` ('deleted' / 'rescored') and ``stale_detail``."""
    where, params = _where(status, build_id, None, pair_ids)
    sql = _stale_sql(f"SELECT * FROM pairs WHERE {where}")
    return store.df(f"SELECT pair_id, status, stale, stale_detail FROM ({sql}) WHERE stale IS NOT NULL "
                    "ORDER BY pair_id", params, timeout_s=0)


# ---------------------------------------------------------------------------- review

def _reviewer(reviewer: str | None) -> str:
    if reviewer:
        return reviewer
    try:
        return getpass.getuser()
    except Exception:  # no login name (a container without a user entry)
        return "unknown"


def _update(store: Store, set_sql: str, set_params: list, pair_ids: Iterable[str] | None, build_id: str | None,
            status: str | None = None) -> int:
    if pair_ids is None and build_id is None:
        raise CurationError("say which pairs: give pair ids or a build id")
    ids = None if pair_ids is None else list(dict.fromkeys(pair_ids))
    where, params = _where(status, build_id, None, ids)
    with store.transaction() as cur:
        if ids is not None:
            known = cur.execute("SELECT count(*) FROM pairs WHERE list_contains(?, pair_id)", [ids]).fetchall()[0][0]
            if known < len(ids):
                missing = cur.execute("SELECT unnest(?::VARCHAR[]) AS id EXCEPT SELECT pair_id FROM pairs",
                                      [ids]).fetchall()
                raise CurationError(f"{len(ids) - known} pair id(s) are not in this store: "
                                    f"{', '.join(sorted(m[0] for m in missing)[:5])}")
        n = cur.execute(f"UPDATE pairs SET {set_sql} WHERE {where}", set_params + params).fetchall()[0][0]
    return int(n)


def decide(store: Store, status: str, pair_ids: Iterable[str] | None = None, *, build_id: str | None = None,
           reviewer: str | None = None, only_pending: bool = False) -> int:
    """Set the status (pending / accepted / rejected) of the given pairs, or of every pair of
    ``build_id`` (only its pending ones with ``only_pending``). Returns how many changed."""
    if status not in STATUSES:
        raise CurationError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
    return _update(store, "status = ?, reviewer = ?, decided_at = ?", [status, _reviewer(reviewer), now()],
                   pair_ids, build_id, "pending" if only_pending else None)


def accept(store: Store, pair_ids: Iterable[str] | None = None, *, build_id: str | None = None,
           reviewer: str | None = None, only_pending: bool = False) -> int:
    """Accept pairs: they are what :func:`export` writes."""
    return decide(store, "accepted", pair_ids, build_id=build_id, reviewer=reviewer, only_pending=only_pending)


def reject(store: Store, pair_ids: Iterable[str] | None = None, *, build_id: str | None = None,
           reviewer: str | None = None, only_pending: bool = False) -> int:
    """Reject pairs: kept in the store with the decision, never exported."""
    return decide(store, "rejected", pair_ids, build_id=build_id, reviewer=reviewer, only_pending=only_pending)


def swap(store: Store, pair_ids: Iterable[str], reviewer: str | None = None) -> int:
    """Reverse the preference of pairs (chosen ↔ rejected in exports); a second swap undoes it."""
    return _update(store, "swapped = NOT swapped, reviewer = ?, decided_at = ?", [_reviewer(reviewer), now()],
                   pair_ids, None)


def set_note(store: Store, pair_ids: str | Iterable[str], note: str, reviewer: str | None = None) -> int:
    """Attach a note to pairs ('' clears it); the note travels into the export's provenance."""
    ids = [pair_ids] if isinstance(pair_ids, str) else pair_ids
    return _update(store, "note = ?, reviewer = ?", [note or None, _reviewer(reviewer)], ids, None)


def hand_pick(store: Store, chosen_id: str, rejected_id: str, note: str = "", reviewer: str | None = None,
              rule_version_id: str | None = None, status: str = "accepted") -> str:
    """Store a pair a person picked from the table or the group view; returns its id.

    Both rollouts must answer the same prompt. Fork siblings (a branch and its parent at
    the fork, or two branches of one fork) become a step pair with their shared prefix.
    The rewards kept with it are those of ``rule_version_id`` (default: the newest version
    that scored both). The pair is ``accepted`` unless ``status`` says otherwise; picking a
    stored pair again updates its status and note.
    """
    if status not in STATUSES:
        raise CurationError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
    if chosen_id == rejected_id:
        raise CurationError("a pair needs two different rollouts; the chosen and the rejected one are the same")
    rows = store.df("""SELECT rollout_id, prompt_id, parent_rollout_id, fork_pos, text, n_tokens FROM rollouts
                       WHERE list_contains(?, rollout_id)""", [[chosen_id, rejected_id]]).set_index("rollout_id")
    for rid, side in ((chosen_id, "chosen"), (rejected_id, "rejected")):
        if rid not in rows.index:
            raise CurationError(f"the {side} rollout {rid} is not in this store")
    c, r = rows.loc[chosen_id], rows.loc[rejected_id]
    if c["prompt_id"] != r["prompt_id"]:
        raise CurationError("the two rollouts answer different prompts; a preference pair compares two answers "
                            "to one prompt")
    vid = rule_version_id or store.scalar("""
        SELECT rw.rule_version_id FROM rewards rw JOIN rule_versions v USING (rule_version_id)
        WHERE rw.component = 'total' AND list_contains(?, rw.rollout_id)
        GROUP BY rw.rule_version_id, v.created_at HAVING count(DISTINCT rw.rollout_id) = 2
        ORDER BY v.created_at DESC, 1 LIMIT 1""", [[chosen_id, rejected_id]])
    rw = {} if vid is None else dict(store.df(
        "SELECT rollout_id, value FROM rewards WHERE rule_version_id = ? AND component = 'total' "
        "AND list_contains(?, rollout_id)", [vid, [chosen_id, rejected_id]]).itertuples(index=False))
    same_fork = (pd.notna(c["parent_rollout_id"]) and c["parent_rollout_id"] == r["parent_rollout_id"]
                 and c["fork_pos"] == r["fork_pos"])
    siblings = same_fork or c["parent_rollout_id"] == rejected_id or r["parent_rollout_id"] == chosen_id
    kind, prefix, k = "completion", None, None
    if siblings:
        k, prefix = _common_prefix(store, chosen_id, rejected_id)
        if not (str(c["text"]).startswith(prefix) and str(r["text"]).startswith(prefix)):
            kind, prefix, k = "completion", None, None
        else:
            kind = "step"
    pair_id = "pr" + hashlib.md5(f"{kind}:{chosen_id}:{rejected_id}".encode()).hexdigest()[:16]
    who, at = _reviewer(reviewer), now()
    cr, rr = (None if pd.isna(v) else float(v) for v in (rw.get(chosen_id), rw.get(rejected_id)))
    with store.transaction() as cur:
        if cur.execute("SELECT count(*) FROM pairs WHERE pair_id = ?", [pair_id]).fetchall()[0][0]:
            cur.execute("UPDATE pairs SET status = ?, note = coalesce(?, note), reviewer = ?, decided_at = ? "
                        "WHERE pair_id = ?", [status, note or None, who, at, pair_id])
        else:
            cur.execute("""
                INSERT INTO pairs (pair_id, prompt_id, chosen_rollout_id, rejected_rollout_id, kind, prefix,
                                   prefix_tokens, rule, params, build_id, rule_version_id, chosen_reward,
                                   rejected_reward, margin, status, swapped, note, reviewer, decided_at, created_at,
                                   source)
                VALUES (?, ?, ?, ?, ?, ?, ?, 'hand', '{}', NULL, ?, ?, ?, ?, ?, false, ?, ?, ?, ?, 'hand')""",
                        [pair_id, c["prompt_id"], chosen_id, rejected_id, kind, prefix, k, vid, cr, rr,
                         None if cr is None or rr is None else cr - rr, status, note or None,
                         who if status != "pending" else None, at if status != "pending" else None, at])
    return pair_id


def _common_prefix(store: Store, a: str, b: str) -> tuple[int, str]:
    """(tokens, text) the two rollouts share from the start."""
    row = store.df(f"""
        WITH lcp AS (
            SELECT coalesce(min(ta.pos) FILTER (WHERE ta.token_id IS DISTINCT FROM tb.token_id),
                            least((SELECT count(*) FROM tokens WHERE rollout_id = ?),
                                  (SELECT count(*) FROM tokens WHERE rollout_id = ?))) AS k
            FROM tokens ta JOIN tokens tb ON tb.rollout_id = ? AND tb.pos = ta.pos WHERE ta.rollout_id = ?)
        SELECT lcp.k, coalesce(string_agg(t.token_text, '' ORDER BY t.pos) FILTER (WHERE {NOT_SPECIAL}), '') AS prefix
        FROM lcp LEFT JOIN tokens t ON t.rollout_id = ? AND t.pos < lcp.k GROUP BY lcp.k""", [a, b, b, a, a])
    return (int(row["k"].iloc[0]), str(row["prefix"].iloc[0])) if len(row) else (0, "")


QUEUE_ORDER = "CASE status WHEN 'pending' THEN 0 WHEN 'accepted' THEN 1 ELSE 2 END, created_at, margin DESC, pair_id"


def queue(store: Store, status: str | None = None, build_id: str | None = None, kind: str | None = None,
          limit: int = 50, offset: int = 0) -> pd.DataFrame:
    """A page of the review queue: pending pairs first, then accepted, then rejected.

    One row per pair, as it would be exported (a swap already applied): ``pair_id, status,
    kind, source, rule, build_id, rule_version_id, prompt, prefix, prefix_tokens`` (step pairs: the
    shared start, which a token strip can grey out), ``chosen_rollout_id, rejected_rollout_id,
    chosen_text, rejected_text`` (continuations after the prefix),
    ``chosen_reward, rejected_reward, margin`` (at build time), ``swapped, note, reviewer,
    decided_at, created_at, stale, stale_detail`` and ``chosen_components`` /
    ``rejected_components`` (``{component: value}`` now, under the pair's version).
    """
    where, params = _where(status, build_id, kind)
    sql = _stale_sql(f"SELECT * FROM pairs WHERE {where} ORDER BY {QUEUE_ORDER} LIMIT ? OFFSET ?")
    df = store.df(f"""
        SELECT s.pair_id, s.status, s.kind, s.source, s.rule, s.build_id, s.rule_version_id, pr.text AS prompt,
               s.prefix, s.prefix_tokens,
               CASE WHEN s.swapped THEN s.rejected_rollout_id ELSE s.chosen_rollout_id END AS chosen_rollout_id,
               CASE WHEN s.swapped THEN s.chosen_rollout_id ELSE s.rejected_rollout_id END AS rejected_rollout_id,
               CASE WHEN s.swapped THEN s.r_text ELSE s.c_text END AS chosen_full,
               CASE WHEN s.swapped THEN s.c_text ELSE s.r_text END AS rejected_full,
               CASE WHEN s.swapped THEN s.rejected_reward ELSE s.chosen_reward END AS chosen_reward,
               CASE WHEN s.swapped THEN s.chosen_reward ELSE s.rejected_reward END AS rejected_reward,
               CASE WHEN s.swapped THEN -s.margin ELSE s.margin END AS shown_margin,
               s.swapped, s.note, s.reviewer, s.decided_at, s.created_at, s.stale, s.stale_detail
        FROM ({sql}) s LEFT JOIN prompts pr USING (prompt_id)
        ORDER BY CASE s.status WHEN 'pending' THEN 0 WHEN 'accepted' THEN 1 ELSE 2 END, s.created_at,
                 s.margin DESC, s.pair_id""",
                  params + [int(limit), int(offset)])
    df = df.rename(columns={"shown_margin": "margin"})
    n = df["prefix"].fillna("").str.len()
    df["chosen_text"] = [t[k:] if isinstance(t, str) else None for t, k in zip(df.pop("chosen_full"), n)]
    df["rejected_text"] = [t[k:] if isinstance(t, str) else None for t, k in zip(df.pop("rejected_full"), n)]
    comps = store.df("""
        SELECT rw.rollout_id, rw.rule_version_id, rw.component, rw.value FROM rewards rw
        WHERE list_contains(?, rw.rollout_id) AND list_contains(?, rw.rule_version_id) ORDER BY rw.component""",
                     [df["chosen_rollout_id"].tolist() + df["rejected_rollout_id"].tolist(),
                      df["rule_version_id"].dropna().unique().tolist()])
    by: dict[tuple, dict] = {}
    for rid, vid, comp, val in comps.itertuples(index=False):
        by.setdefault((rid, vid), {})[comp] = val
    df["chosen_components"] = [by.get((r, v), {}) for r, v in zip(df["chosen_rollout_id"], df["rule_version_id"])]
    df["rejected_components"] = [by.get((r, v), {}) for r, v in zip(df["rejected_rollout_id"], df["rule_version_id"])]
    return df


def progress(store: Store, build_id: str | None = None, stale: bool = True) -> dict[str, int]:
    """Counts for the review's progress bar: ``total, pending, accepted, rejected, reviewed``
    and, with ``stale``, ``stale`` (pairs of any status whose rollouts were deleted or
    re-scored: that reads every pair's rewards, about a second for a million pairs)."""
    where, params = _where(None, build_id)
    source = _stale_sql(f"SELECT * FROM pairs WHERE {where}") if stale else f"SELECT * FROM pairs WHERE {where}"
    row = store.df(f"""
        SELECT count(*) AS total, count(*) FILTER (WHERE status = 'pending') AS pending,
               count(*) FILTER (WHERE status = 'accepted') AS accepted,
               count(*) FILTER (WHERE status = 'rejected') AS rejected
               {", count(*) FILTER (WHERE stale IS NOT NULL) AS stale" if stale else ""}
        FROM ({source})""", params, timeout_s=0).iloc[0]
    out = {k: int(v) for k, v in row.items()}
    out["reviewed"] = out["accepted"] + out["rejected"]
    return out


def builds(store: Store) -> pd.DataFrame:
    """Every pair build, newest first, with how many of its pairs are in each status."""
    return store.df("""
        SELECT b.build_id, b.rule, b.level, b.params, b.scope, b.rule_version_id, b.created_at, b.n_pairs,
               count(p.pair_id) FILTER (WHERE p.status = 'pending') AS pending,
               count(p.pair_id) FILTER (WHERE p.status = 'accepted') AS accepted,
               count(p.pair_id) FILTER (WHERE p.status = 'rejected') AS rejected
        FROM pair_builds b LEFT JOIN pairs p USING (build_id)
        GROUP BY ALL ORDER BY b.created_at DESC, b.build_id""")
