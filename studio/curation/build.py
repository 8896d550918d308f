"""Making pairs: :func:`build_pairs` runs one DuckDB query per rule over a scope of rollouts and
one reward version, and stores the new pairs with one ``pair_builds`` row.

- ``level="completion"``: the sets are groups (completions sampled together; or every
  completion of a prompt with ``within="prompt"``). Branch rollouts are left out: their
  text starts with a forced prefix.
- ``level="step"``: the sets are fork siblings, the branches of one rollout at one
  position plus that rollout itself (:mod:`studio.queries.forks`). The pair keeps their longest
  common token prefix as ``prefix`` and the two continuations after it: exported, the
  prompt is the prompt plus that prefix (a step-level pair).
- ``level="turn"``: the sets are fork siblings and groups (agent trajectories; a rollout without
  turns is one assistant turn). A pair is two members that share their turns up to turn k and
  differ from it on, both with an assistant turn at k; it keeps the shared turns' text as
  ``prefix`` and where turn k starts as ``prefix_tokens``. Exported conversational, the prompt is
  the prompt's messages plus the shared turns' (tool calls and tool messages included) and each
  side is its turns from k on (a turn-level pair).

Within a set the rule (:class:`~studio.curation.rules.PairRule`) picks pairs:
``best_vs_worst`` (the pair with the largest reward margin), ``correct_vs_incorrect`` (every
correct × incorrect pair; correct: the rollout's verified answer (``rollouts.correct``), or a
reward component at or above a threshold) or ``all_pairs`` (every pair whose rewards differ). Options: a minimum margin,
length matching (relative token difference), identical completions once and identical pairs
once per prompt (``dedupe``), and a per-prompt cap (largest margins first). A pair's id is a
hash of its kind and its two rollouts, so building a rule twice adds nothing; a stored pair
the rule makes again after its rollouts were re-scored takes the new rewards and goes back to
review. :func:`default_version` picks the reward version pairs compare by default.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace

from studio import queries
from studio.curation.errors import CurationError
from studio.curation.rules import ROLLOUT_CORRECT, PairRule
from studio.rewards import DEFAULT_RULES
from studio.signals.advantages import EQUAL_TOL
from studio.store import Store
from studio.store.records import new_id, now

# a special token's text (<eos>, <pad>) is no part of the completion text (as credit.steps_of)
NOT_SPECIAL = "NOT (t.token_text LIKE '<%>' AND length(t.token_text) > 2)"

DEFAULT_RULE = PairRule()  # frozen: one shared default


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
        conds.append("list_contains(?, ro.run_id)")
        params.append(run_ids)
        desc["run_ids"] = run_ids
    if scope is not None:
        unset = asdict(queries.RolloutFilter())  # the scope is described by what it sets
        desc.update({k: v for k, v in asdict(scope).items() if v != unset[k] and k != "limit"})
        simple = {"run_id": "ro.run_id = ?", "group_id": "ro.group_id = ?", "train_step": "ro.train_step = ?"}
        for name, cond in simple.items():
            if getattr(scope, name) is not None:
                conds.append(cond)
                params.append(getattr(scope, name))
        rest = replace(scope, run_id=None, group_id=None, train_step=None, limit=10**9)
        if rest != queries.RolloutFilter(limit=10**9):  # text, correctness, reward or branch filters
            sql, p = queries.rollout_table_sql(rule_version_id, rest)
            conds.append(f"ro.rollout_id IN (SELECT rollout_id FROM ({sql}))")
            params += p
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
    by_component = correct and rule.correct_component != ROLLOUT_CORRECT
    cc = ("LEFT JOIN rewards cc ON cc.rollout_id = ro.rollout_id AND cc.rule_version_id = ? "
          "AND cc.component = ?") if by_component else ""
    cval = ", cc.value AS cval" if by_component else ", ro.correct::DOUBLE AS cval" if correct else ""
    step, turn = rule.level == "step", rule.level == "turn"
    if rule.level == "completion":  # sets are groups (or prompts); branches start with a forced prefix, left out
        ctes = []
        source = f"""FROM rollouts ro
            JOIN rewards tot ON tot.rollout_id = ro.rollout_id AND tot.rule_version_id = ? AND tot.component = 'total'
            {cc}
            WHERE ro.parent_rollout_id IS NULL AND {cond} AND tot.value IS NOT NULL"""
        set_key = f"ro.{'group_id' if rule.within == 'group' else 'prompt_id'}"
    else:  # a fork: its parent and the branches taken at one position of it (turn level: groups too)
        groups = f"""
            UNION ALL
            SELECT ro.rollout_id, 'group:' || ro.{'group_id' if rule.within == 'group' else 'prompt_id'}
            FROM rollouts ro WHERE ro.parent_rollout_id IS NULL AND {cond}""" if turn else ""
        ctes = [f"""forks AS (
            SELECT DISTINCT b.parent_rollout_id AS parent, b.fork_pos
            FROM rollouts b WHERE b.parent_rollout_id IS NOT NULL AND (
                b.rollout_id IN (SELECT ro.rollout_id FROM rollouts ro WHERE {cond})
                OR b.parent_rollout_id IN (SELECT ro.rollout_id FROM rollouts ro WHERE {cond})))""",
                f"""members AS (
            SELECT b.rollout_id, f.parent || '@' || f.fork_pos AS set_key
            FROM forks f JOIN rollouts b ON b.parent_rollout_id = f.parent AND b.fork_pos = f.fork_pos
            UNION ALL
            SELECT f.parent, f.parent || '@' || f.fork_pos FROM forks f{groups})"""]
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
                   tot.value AS reward{cval}{'' if rule.level == 'completion' else ', ro.text'}
            {source})""")
    if rule.dedupe:  # identical completions of one set count once: the first made stands for them (at a fork:
        # the rollout the branches continue, before a branch that repeats it), then the smallest id
        ctes.append("""u AS (SELECT * FROM sc
                            QUALIFY row_number() OVER (PARTITION BY set_key, th ORDER BY made, rollout_id) = 1)""")
    else:
        ctes.append("u AS (SELECT * FROM sc)")
    texts = "" if rule.level == "completion" else ", a.text AS ctext, b.text AS rtext"
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
    elif turn:
        ctes += _turn_ctes()
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
    kind = f"'{rule.level}'"
    return "WITH " + ",\n".join(c.strip() for c in ctes) + f"""
        SELECT 'pr' || substr(md5({kind} || ':' || chosen || ':' || rejected), 1, 16) AS pair_id,
               prompt_id, chosen AS chosen_rollout_id, rejected AS rejected_rollout_id, {kind} AS kind,
               prefix, prefix_tokens, chosen_reward, rejected_reward, margin
        FROM {picked}"""


def _turn_ctes() -> list[str]:
    """The turn level's part of :func:`_pairs_sql`: each candidate pair's first differing turn k (a
    rollout without turn rows is one assistant turn), kept when both sides have an assistant turn
    there; the prefix is the text of the turns before k, ``prefix_tokens`` where turn k starts."""
    same = " AND ".join(f"a.{c} IS NOT DISTINCT FROM b.{c}" for c in ("role", "content", "tool_name", "tool_args",
                                                                       "error"))
    return [
        """tr AS (
            SELECT rollout_id, turn_idx, role, start_pos, content, tool_name, tool_args, error FROM turns
            WHERE rollout_id IN (SELECT chosen FROM cand UNION SELECT rejected FROM cand)
            UNION ALL
            SELECT r.rollout_id, 0, 'assistant', 0, r.text, NULL, NULL, NULL FROM rollouts r
            WHERE r.rollout_id IN (SELECT chosen FROM cand UNION SELECT rejected FROM cand)
              AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.rollout_id = r.rollout_id))""",
        f"""diff AS (
            SELECT c.chosen, c.rejected, a.turn_idx FROM cand c JOIN tr a ON a.rollout_id = c.chosen
            LEFT JOIN tr b ON b.rollout_id = c.rejected AND b.turn_idx = a.turn_idx
            WHERE b.rollout_id IS NULL OR NOT ({same})
            UNION ALL
            SELECT c.chosen, c.rejected, b.turn_idx FROM cand c JOIN tr b ON b.rollout_id = c.rejected
            LEFT JOIN tr a ON a.rollout_id = c.chosen AND a.turn_idx = b.turn_idx
            WHERE a.rollout_id IS NULL)""",
        """at_k AS (
            SELECT d.chosen, d.rejected, d.k, a.role AS c_role, a.start_pos AS c_start, b.role AS r_role,
                   b.start_pos AS r_start
            FROM (SELECT chosen, rejected, min(turn_idx) AS k FROM diff GROUP BY chosen, rejected) d
            LEFT JOIN tr a ON a.rollout_id = d.chosen AND a.turn_idx = d.k
            LEFT JOIN tr b ON b.rollout_id = d.rejected AND b.turn_idx = d.k)""",
        """pre AS (
            SELECT x.chosen, x.rejected, any_value(x.c_start) AS c_start, any_value(x.r_start) AS r_start,
                   coalesce(string_agg(t.content, '' ORDER BY t.turn_idx), '') AS prefix
            FROM at_k x LEFT JOIN tr t ON t.rollout_id = x.chosen AND t.turn_idx < x.k
            WHERE x.c_role = 'assistant' AND x.r_role = 'assistant'
            GROUP BY x.chosen, x.rejected)""",
        """shaped AS (
            SELECT c.*, p.prefix, p.c_start AS prefix_tokens, c.cn - coalesce(p.c_start, 0) AS clen,
                   c.rn - coalesce(p.r_start, 0) AS rlen
            FROM cand c JOIN pre p USING (chosen, rejected)
            WHERE starts_with(c.ctext, p.prefix) AND starts_with(c.rtext, p.prefix))"""]


def _pair_params(rule: PairRule, vid: str, scope_params: list) -> list:
    """The bound values of :func:`_pairs_sql`, in the order they appear in its text."""
    correct = rule.name == "correct_vs_incorrect"
    by_component = correct and rule.correct_component != ROLLOUT_CORRECT
    rewards = [vid] + ([vid, rule.correct_component] if by_component else [])  # the total, and the correct component
    if rule.level != "completion":  # forks (the scope twice; turn level: groups, a third time), then the rewards
        params = list(scope_params) * (2 if rule.level == "step" else 3) + rewards
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


def build_pairs(store: Store, rule: PairRule = DEFAULT_RULE, scope: queries.RolloutFilter | None = None,
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
    if rule.name == "correct_vs_incorrect" and rule.correct_component != ROLLOUT_CORRECT:
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
