"""Scoring SQL: the store's rollouts with reward, correctness and advantage, as SQL plus bound values.

Correctness is a fact of the rollout, stored, not derived: ``rollouts.correct`` (its task's
check of the final answer against the gold one, or an import's own correctness field; NULL
when there is nothing to check against), so no reward version, shown or not, changes it
(``accuracy``, 1.0 / 0.0 / NULL, is the same fact as a number, for readers that take
``accuracy >= 1``). Derived, not stored: each rollout's total reward (the ``total`` row of
one rule version in ``rewards``) and its advantage, computed in the query by the
estimator's SQL twin (:mod:`studio.signals.advantages`) with window functions over the
*unfiltered* groups, so filtering the table never changes a rollout's advantage. Which rule
version's rewards are shown is decided per rollout (:func:`versions_sql`): the most recent
version that scored it, unless a version is asked for; every row says which
(``rule_version_id``). Every builder takes a *scope*, a condition on ``rollouts ro`` that
keeps or drops whole groups (``ro.group_id = ?``, :data:`GROUP_OF`), so opening one rollout
reads one group and advantages are unchanged by scoping.

At scale (1M rollouts, 100M tokens; ``benchmarks/bench_scale.py``) the reads lean on ids made
in order: a scope's rewards are read in one pass (:func:`picked_sql`: the ``total`` rows and,
with ``components``, every component of the picked version, grouped per rollout and version)
through the range of the scope's rollout ids, which DuckDB applies inside the rewards scan
(:func:`_scoped_rewards`; a scope whose rollouts span the store joins instead).

User values are always bound parameters, never formatted into SQL.
"""
from __future__ import annotations

from studio.signals.advantages import GROUP_STATS, Credit, estimator_sql, from_stats_sql, group_stats_sql


def versions_sql(rule_version_id: str | None, scope: str = "TRUE") -> tuple[str, list]:
    """``(rollout_id, rule_version_id)``: which rule version's rewards to show per rollout.

    ``None`` means each rollout's most recent scoring, so a newer rule that scored only new
    rollouts never blanks out older ones; a given id shows every rollout under that version.
    ``scope`` is a condition on ``rollouts ro`` limiting which rollouts are looked at; it
    appears once in the SQL (callers bind its values after the returned ones).
    """
    if rule_version_id is not None:
        return f"SELECT ro.rollout_id, ?::VARCHAR AS rule_version_id FROM rollouts ro WHERE {scope}", [rule_version_id]
    return (f"""SELECT rw.rollout_id, arg_max(rw.rule_version_id, v.created_at) AS rule_version_id
               FROM {_scoped_rewards(scope)} JOIN rule_versions v USING (rule_version_id)
               WHERE rw.component = 'total'
               GROUP BY rw.rollout_id""", [])


def _scoped_rewards(scope: str, narrow: bool = True) -> str:
    """``rewards rw`` limited to the rollouts of ``scope`` (a FROM item; ``scope`` appears once).

    ``narrow`` (the scope's rollouts were made close together: a group, a run, the newest
    page): the scope's ids are read once and their range (min, max) becomes a filter that
    DuckDB applies inside the rewards scan, row by row. Ids sort in the order they were
    made, so the scan skips the row groups of other rollouts and decodes only the rows in
    range (one group's ~30 reward rows, not the ~250,000 of the row groups holding them).
    Otherwise (rollouts scattered over the store, e.g. every run's prompts containing some
    text) a plain join: DuckDB then reads every reward row but builds its hash table on the
    scope's ids, where the range form would build it on the (many) reward rows in range.
    """
    if scope.strip() == "TRUE":
        return "rewards rw"
    if not narrow:
        return (f"(SELECT ro.rollout_id FROM rollouts ro WHERE {scope}) sro "
                "JOIN rewards rw ON rw.rollout_id = sro.rollout_id")
    return f"""(WITH sro AS MATERIALIZED (SELECT ro.rollout_id FROM rollouts ro WHERE {scope})
                SELECT rw.* FROM rewards rw
                WHERE rw.rollout_id BETWEEN (SELECT min(rollout_id) FROM sro) AND (SELECT max(rollout_id) FROM sro)
                  AND rw.rollout_id IN (SELECT rollout_id FROM sro)) rw"""


def picked_sql(rule_version_id: str | None, scope: str = "TRUE", scope_params: list | None = None,
               components: bool = False, narrow: bool = True) -> tuple[str, list]:
    """``(rollout_id, rule_version_id, reward)`` of the scope's rollouts that have rewards under the
    version :func:`versions_sql` picks, in one pass over ``rewards``.

    The same as :func:`versions_sql` joined to the ``total`` rows, but the rewards are read once
    instead of twice: one GROUP BY gathers each (rollout, version) pair's ``total``, then the newest
    version with a ``total`` wins. With ``components``, also ``comps``: every component of the
    picked version as a list of ``{'c': name, 'v': value}`` in name order (see :func:`components`).
    ``narrow``: see :func:`_scoped_rewards`.
    """
    pair = "max(rw.value) FILTER (WHERE rw.component = 'total') AS reward"
    if components:
        pair += ",\n              list({'c': rw.component, 'v': rw.value} ORDER BY rw.component) AS comps"
    which = "TRUE" if components else "rw.component = 'total'"
    params = list(scope_params or [])
    if rule_version_id is not None:
        return (f"""SELECT rw.rollout_id, any_value(rw.rule_version_id) AS rule_version_id, {pair}
                    FROM {_scoped_rewards(scope, narrow)}
                    WHERE {which} AND rw.rule_version_id = ?
                    GROUP BY rw.rollout_id""", params + [rule_version_id])
    k, kcol = (", 'k': pv.comps", ", _p.k AS comps") if components else ("", "")
    return (f"""SELECT rollout_id, _p.v AS rule_version_id, _p.r AS reward{kcol}
                FROM (SELECT pv.rollout_id,
                             arg_max({{'v': pv.rule_version_id, 'r': pv.reward{k}}}, v.created_at) AS _p
                      FROM (SELECT rw.rollout_id, rw.rule_version_id, {pair},
                                   bool_or(rw.component = 'total') AS _has_total
                            FROM {_scoped_rewards(scope, narrow)}
                            WHERE {which}
                            GROUP BY rw.rollout_id, rw.rule_version_id) pv
                      JOIN rule_versions v USING (rule_version_id)
                      WHERE pv._has_total
                      GROUP BY pv.rollout_id)""", params)


SCORED_COLUMNS = ("ro.rollout_id, ro.run_id, ro.group_id, ro.prompt_id, ro.sample_idx, ro.text, ro.n_tokens, "
                  "ro.finish_reason, ro.created_at, ro.train_step, ro.parent_rollout_id, ro.fork_pos, "
                  "ro.forced_token_id, ro.correct, ro.answer, ro.n_turns, ro.n_tool_calls, ro.n_tool_errors")
# correctness as a number (1.0 / 0.0; NULL: unchecked), for readers that take `accuracy >= 1`
ACCURACY = "CASE WHEN ro.correct THEN 1.0 WHEN NOT ro.correct THEN 0.0 END"
SCORED_NAMES = tuple(c.strip().split(".", 1)[1] for c in SCORED_COLUMNS.split(","))


def scored_rollouts_sql(rule_version_id: str | None = None, scope: str = "TRUE",
                        scope_params: list | None = None, credit: Credit | None = None,
                        components: bool = False, narrow: bool = True) -> tuple[str, list]:
    """Rollouts with total reward (and ``rule_version_id``, the version it comes from), correctness
    (``correct``, ``answer`` and ``accuracy``: the rollout's own, whatever version is shown) and
    advantage (see :func:`versions_sql`).

    ``scope`` (a condition on ``rollouts ro`` with ``scope_params``) must keep or drop
    whole groups, like ``ro.group_id = ?`` or ``ro.run_id = ?``: advantages are computed
    over what it keeps (REINFORCE++ whitens over whole batches, so its scope is widened to
    the runs the scope touches and the rows cut back to the scope afterwards).

    ``credit`` picks the estimator (GRPO when None). Token-level estimators give the
    advantage of the first token here: KL in the reward, A_0 = G_0 - mean_g G_0 with
    G_0 = R - β·Σ_t (log π - log π_ref); GAE, A_0 = Σ_t (γλ)^t δ_t. Either is NULL for a
    rollout whose reference log-probs or values are not all stored.

    ``components`` adds ``_components``, the shown version's components of each rollout as
    ``[{'c': name, 'v': value}, …]`` (read in the same pass over the rewards). ``narrow``:
    how the scope's rewards are read (see :func:`_scoped_rewards`); the result is the same.
    """
    credit = credit or Credit()
    scope_params = list(scope_params or [])
    key = credit.estimator
    inner, inner_params = scope, scope_params
    if key == "reinforce_pp":
        inner = f"ro.run_id IN (SELECT ro.run_id FROM rollouts ro WHERE {scope})"
    picked, params = picked_sql(rule_version_id, inner, inner_params, components, narrow)
    ctes = [f"picked AS ({picked})"]
    rv = "pk.rule_version_id"
    if rule_version_id is not None:  # every rollout shows the version asked for, scored by it or not
        rv = "?::VARCHAR"
        params.append(rule_version_id)
    ctes.append(f"""scored AS (
            SELECT {SCORED_COLUMNS}, {rv} AS rule_version_id,
                   pk.reward, {ACCURACY} AS accuracy{", pk.comps AS _components" if components else ""}{
                   ", (" + scope + ") AS _in_scope" if key == "reinforce_pp" else ""}
            FROM rollouts ro
            LEFT JOIN picked pk ON pk.rollout_id = ro.rollout_id
            WHERE {inner})""")
    if key == "reinforce_pp":
        params += scope_params
    params += inner_params
    if key == "kl":
        ctes.append("""kl AS (
            SELECT t.rollout_id, sum(t.logprob - sc.logprob) AS kl_sum, count(sc.logprob) = count(*) AS complete
            FROM tokens t LEFT JOIN token_scores sc ON sc.rollout_id = t.rollout_id AND sc.pos = t.pos
                 AND sc.policy_version = ?
            WHERE t.rollout_id IN (SELECT rollout_id FROM scored) GROUP BY t.rollout_id)""")
        params.append(credit.reference or "")
        ctes.append(f"""g0 AS (
            SELECT s.*, CASE WHEN kl.complete THEN s.reward - {float(credit.beta)!r} * kl.kl_sum END AS _g0
            FROM scored s LEFT JOIN kl USING (rollout_id))""")
        final = "SELECT * EXCLUDE (_g0), _g0 - avg(_g0) OVER (PARTITION BY group_id) AS advantage FROM g0"
    elif key == "gae":
        gl = float(credit.gamma) * float(credit.lam)
        ctes.append("""v AS (
            SELECT rollout_id, pos, value,
                   lead(value, 1, 0.0) OVER (PARTITION BY rollout_id ORDER BY pos) AS v_next
            FROM token_scores WHERE policy_version = ? AND rollout_id IN (SELECT rollout_id FROM scored))""")
        params.append(credit.values or "")
        ctes.append(f"""a0 AS (
            SELECT rollout_id, sum(pow({gl!r}, pos) * ({float(credit.gamma)!r} * v_next - value)) AS part,
                   max(pos) AS last, count(value) AS n
            FROM v GROUP BY rollout_id)""")
        final = (f"SELECT s.*, CASE WHEN a0.n = s.n_tokens THEN a0.part + pow({gl!r}, a0.last) * s.reward END "
                 "AS advantage FROM scored s LEFT JOIN a0 USING (rollout_id)")
    elif key == "reinforce_pp":
        pre, expr = estimator_sql(key)
        ctes.append(f"pre AS (SELECT *{pre} FROM scored)")
        final = f"SELECT * EXCLUDE (_a, _in_scope) FROM (SELECT *, {expr} AS advantage FROM pre) WHERE _in_scope"
    else:  # GRPO, Dr. GRPO, RLOO (and token estimators' fallback, GRPO): one GROUP BY joined back
        ctes.append(f"gs AS (SELECT group_id, {group_stats_sql()} FROM scored GROUP BY group_id)")
        final = (f"SELECT s.*, {from_stats_sql(key if key in GROUP_STATS else 'grpo', 's.reward')} AS advantage "
                 "FROM scored s JOIN gs USING (group_id)")
    return "WITH " + ",\n".join(ctes) + "\n" + final, params


# the scope of one rollout's group (one bound parameter: the rollout id)
GROUP_OF = "ro.group_id = (SELECT group_id FROM rollouts WHERE rollout_id = ?)"


def _components_dict(items) -> dict[str, float]:
    """``{component: value}`` from a ``_components`` cell of :func:`scored_rollouts_sql` (NULL values
    as NaN, as :func:`~studio.queries.reads.components` gives them)."""
    if not hasattr(items, "__len__"):  # NULL: no components (None or pd.NA)
        return {}
    return {it["c"]: float("nan") if it["v"] is None else float(it["v"]) for it in items}

