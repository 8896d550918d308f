"""One group scored from point reads (:func:`scored_group`): the scoring SQL's values in a fraction of its time.

Scoring one group in SQL (:func:`~studio.queries.scoring.scored_rollouts_sql` over
``ro.group_id = ?``) costs ~30 ms of planning and small operators, whatever the store's size.
A click on a rollout needs only its group: :func:`scored_group` reads the rollout's group id
(the primary key's index), the group's rows and their rewards in point reads whose filters
are constants (ids sort in the order they were made, so DuckDB's min/max statistics skip all
but the row groups holding them; rows come back as tuples, as building a DataFrame costs more
than such a read) while a reader thread (:func:`~studio.queries.ahead.read_ahead`) looks up
their prompt, run and the rule versions' times, plus what a token-level estimator or
REINFORCE++'s batches need, and scores them with the numpy twins of the estimators under the
SQL's rules: NULL and NaN rewards, the version picked per rollout, batches. The values equal
the SQL path's (``tests/test_fast_header.py`` compares them, case by case); per-token terms
whose float types matter (FLOAT log-probs and values) are still DuckDB's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from studio.queries.ahead import read_ahead, settled
from studio.queries.scoring import SCORED_COLUMNS, SCORED_NAMES
from studio.signals.advantages import GROUP_STATS, SEQUENCE_FNS, Credit, whiten
from studio.store import Store


@dataclass
class ScoredGroup:
    """One group scored as :func:`~studio.queries.scoring.scored_rollouts_sql` scores the scope ``ro.group_id = ?``.

    ``rows``: the group's rollouts in ``(sample_idx, rollout_id)`` order, each a dict of the
    scored columns (``correct`` and ``answer`` among them: the rollout's own), ``rule_version_id``
    (the version its reward comes from), ``reward``, ``accuracy`` (``correct`` as 1.0 / 0.0),
    ``advantage`` (NULL as NaN for these three), ``prompt``, ``gold``, ``task``, ``run``, ``policy`` and ``components``, as
    :func:`~studio.queries.reads.rollout` returns them; a rollout whose prompt or run row is missing is scored with its
    group (``members``) but not listed, as the SQL joins them. ``tokens``: what a token-level
    estimator read per rollout, in position order (KL: ``pos, logprob, ref``; GAE: ``pos, value``),
    for :func:`studio.queries.credit.token_advantages`.
    """

    group_id: str | None
    rule_version_id: str | None
    credit: Credit
    members: list[dict]
    rows: list[dict]
    tokens: dict[str, list[dict]]

    def row(self, rollout_id: str) -> dict | None:
        """The listed row of ``rollout_id`` (None when it is not one)."""
        return next((r for r in self.rows if r["rollout_id"] == rollout_id), None)


def scored_group(store: Store, rollout_id: str | None = None, rule_version_id: str | None = None,
                 credit: Credit | None = None, group_id: str | None = None) -> ScoredGroup:
    """The group of ``rollout_id`` (or ``group_id``) with rewards and advantages under ``credit``:
    the rows :func:`~studio.queries.scoring.scored_rollouts_sql` gives for ``ro.group_id = ?`` with ``components``, joined to
    their prompt and run, from point reads (see :class:`ScoredGroup`)."""
    credit = credit or Credit()
    if group_id is None:
        # the group id first, through the rollouts' primary key index: the group's read then filters on a
        # constant, which DuckDB prunes the scan with as it plans it (a subquery's value, known only as the
        # query runs, scanned ~2.5x longer on a 1M-rollout store)
        head = _fetch(store, "SELECT group_id, prompt_id, run_id FROM rollouts WHERE rollout_id = ?", [rollout_id])
        if not head:
            return ScoredGroup(None, rule_version_id, credit, [], [], {})
        group_id, hint = head[0][0], ([head[0][1]], [head[0][2]])
    else:
        hint = None
    # the prompt and run rows (and the versions' times, to pick each rollout's newest scoring) are looked up
    # beside the group's read: the clicked rollout's own, known now (a group's rollouts share them), then
    # any other that a member names
    times = rule_version_id is None
    lookup = read_ahead(_lookups, store, *hint, times) if hint else None
    with settled(lambda: lookup):
        members = _rollout_rows(store, group_id)
        if not members:
            if lookup is not None:
                lookup.result()
            return ScoredGroup(None if hint else group_id, rule_version_id, credit, [], [], {})
        if lookup is None:
            lookup = read_ahead(_lookups, store, *_prompt_run_ids(members), times)
        scope = members
        if credit.estimator == "reinforce_pp":  # whitened over whole batches: read the batches' groups too
            scope = _batch_rows(store, members)
        reward_rows = _reward_rows(store, [m["rollout_id"] for m in scope], rule_version_id)
    prompts, runs, created = lookup.result()
    gid, key, tokens = members[0]["group_id"], credit.estimator, {}
    picked = _picked([r + (created.get(r[1]),) for r in reward_rows], rule_version_id)
    empty = {"rule_version_id": rule_version_id, "reward": None, "components": {}}
    for m in scope:
        m.update(picked.get(m["rollout_id"], empty))
        ok = m.get("correct")  # (a REINFORCE++ batch's other rows carry only what batches them)
        m["accuracy"] = None if ok is None else float(bool(ok))  # scoring.ACCURACY
    rewards, groups = [m["reward"] for m in scope], [m["group_id"] for m in scope]
    if key == "reinforce_pp":
        adv = _sequence_sql(key, rewards, groups, [(m["run_id"], m["train_step"]) for m in scope])
        adv = adv[:len(members)]  # _batch_rows lists the group's own rows first
    elif key == "kl":
        adv, tokens = _kl_first(store, members, credit)
    elif key == "gae":
        adv, tokens = _gae_first(store, members, credit)
    else:  # GRPO, Dr. GRPO, RLOO (anything else reads as GRPO, as in the SQL)
        adv = _sequence_sql(key if key in GROUP_STATS else "grpo", rewards, groups)
    for m, a in zip(members, adv, strict=True):
        m["advantage"] = a
    pids, rids = _prompt_run_ids(members)
    missing = ([p for p in pids if p not in prompts], [r for r in rids if r not in runs])
    if missing[0] or missing[1]:  # members with another prompt or run than the clicked rollout (or none stored)
        more = _lookups(store, *missing)
        prompts, runs = {**prompts, **more[0]}, {**runs, **more[1]}
    for m in members:
        m["_prompt"], m["_run"] = prompts.get(m["prompt_id"]), runs.get(m["run_id"])
    return ScoredGroup(gid, rule_version_id, credit, members, _listed(members), tokens)


def _fetch(store: Store, sql: str, params: list) -> list[tuple]:
    """Rows as tuples, through the store's reader (its time limit, a cursor per call): for point
    reads, where building a DataFrame (:meth:`Store.df`) costs more than the read itself."""
    return store._read(sql, params, None, lambda cur: cur.fetchall())


def _rollout_rows(store: Store, group_id: str) -> list[dict]:
    """The group's rollouts as dicts of the scored columns."""
    rows = _fetch(store, f"SELECT {SCORED_COLUMNS} FROM rollouts ro WHERE ro.group_id = ?", [group_id])
    return [dict(zip(SCORED_NAMES, r, strict=True)) for r in rows]


def _prompt_run_ids(members: list[dict]) -> tuple[list, list]:
    """The distinct prompt and run ids the members name."""
    return list(dict.fromkeys(m["prompt_id"] for m in members)), list(dict.fromkeys(m["run_id"] for m in members))


def _marks(values: list) -> str:
    """One bound parameter per value, for ``IN (...)`` (NULL when there are none: no row matches)."""
    return ", ".join(["?"] * len(values)) or "NULL"


def _lookups(store: Store, prompt_ids: list, run_ids: list, times: bool = False) -> tuple[dict, dict, dict]:
    """``({prompt_id: (text, gold, task)}, {run_id: (name, policy)}, {rule_version_id: created_at})``
    of the rows that exist, in one read: the prompts and runs through their primary keys' indexes (ids
    as a list of bound values: an index lookup each), with ``times`` every rule version's time."""
    rows = _fetch(store, f"""
        SELECT 0, prompt_id, text, gold::VARCHAR, task, NULL::TIMESTAMP FROM prompts
        WHERE prompt_id IN ({_marks(prompt_ids)})
        UNION ALL
        SELECT 1, run_id, name, policy, NULL, NULL FROM runs WHERE run_id IN ({_marks(run_ids)})
        UNION ALL
        SELECT 2, rule_version_id, NULL, NULL, NULL, created_at FROM rule_versions WHERE ?""",
                  list(prompt_ids) + list(run_ids) + [bool(times)])
    out: tuple[dict, dict, dict] = ({}, {}, {})
    for r in rows:
        out[r[0]][r[1]] = r[2:5] if r[0] == 0 else r[2:4] if r[0] == 1 else r[5]
    return out


def _batch_keys(store: Store, where: str, params: list) -> list[dict]:
    """Rollouts matching ``where`` with only what REINFORCE++ groups and batches them by."""
    keys = ("rollout_id", "group_id", "run_id", "train_step")
    rows = _fetch(store, f"SELECT {', '.join(keys)} FROM rollouts ro WHERE {where}", params)
    return [dict(zip(keys, r, strict=True)) for r in rows]


def _batch_rows(store: Store, members: list[dict]) -> list[dict]:
    """The group's rows, then every other rollout REINFORCE++ whitens them with: the rest of each
    member's batch (same run and training step; NULL steps are one batch) and, so that each of those
    gets its whole group's mean, the rest of their groups within the group's runs (the SQL's scope)."""
    runs = sorted({m["run_id"] for m in members})
    out, seen = list(members), {m["rollout_id"] for m in members}

    def add(rows):
        for r in rows:
            if r["rollout_id"] not in seen:
                seen.add(r["rollout_id"])
                out.append(r)
    for run_id, step in dict.fromkeys((m["run_id"], m["train_step"]) for m in members):
        if step is None:
            add(_batch_keys(store, "ro.run_id = ? AND ro.train_step IS NULL", [run_id]))
        else:
            add(_batch_keys(store, "ro.run_id = ? AND ro.train_step = ?", [run_id, step]))
    gids = sorted({r["group_id"] for r in out})
    add(_batch_keys(store, "ro.group_id BETWEEN ? AND ? AND ro.group_id IN (SELECT unnest(?::VARCHAR[])) "
                           "AND ro.run_id IN (SELECT unnest(?::VARCHAR[]))", [gids[0], gids[-1], gids, runs]))
    return out


REWARD_ROWS_PER_ROLLOUT = 64  # a range read returning more than this per rollout asks for the ids instead


def _reward_rows(store: Store, ids: list[str], rule_version_id: str | None) -> list[tuple]:
    """``(rollout_id, rule_version_id, component, value)`` of these rollouts (only the version's, if
    one is given). Read through their id range: ids sort in the order they were made, so a group's
    range holds little but its own rewards, and DuckDB skips the other row groups. Should the range
    hold many other rollouts' rewards (a group made far apart), the read stops there and asks for the
    ids instead."""
    if not ids:
        return []
    ver, vparams = ("", []) if rule_version_id is None else (" AND rw.rule_version_id = ?", [rule_version_id])
    sql = f"""SELECT rw.rollout_id, rw.rule_version_id, rw.component, rw.value FROM rewards rw
              WHERE rw.rollout_id BETWEEN ? AND ?{ver}"""
    cap = REWARD_ROWS_PER_ROLLOUT * len(ids)
    rows = _fetch(store, sql + " LIMIT ?", [min(ids), max(ids)] + vparams + [cap + 1])
    if len(rows) > cap:
        rows = _fetch(store, sql + " AND rw.rollout_id IN (SELECT unnest(?::VARCHAR[]))",
                      [min(ids), max(ids)] + vparams + [list(ids)])
    keep = set(ids)
    return [r for r in rows if r[0] in keep]


def _picked(rewards: list[tuple], rule_version_id: str | None) -> dict[str, dict]:
    """``{rollout_id: {rule_version_id, reward, components}}``: what :func:`~studio.queries.scoring.picked_sql` (with
    ``components``) picks from these reward rows (:func:`_reward_rows`'s, each with its version's
    ``created_at`` after them: NULL for a version missing from ``rule_versions``)."""
    per: dict[tuple, list[tuple]] = {}
    for r in rewards:
        per.setdefault((r[0], r[1]), []).append(r)
    out: dict[str, dict] = {}
    newest: dict = {}
    for (rid, v), rs in per.items():
        total = [r[3] for r in rs if r[2] == "total"]
        if rule_version_id is None:
            # the newest version with a total row: a version missing from rule_versions (the SQL joins it)
            # or without a time is skipped, as arg_max skips it; of equal times the first read wins (so
            # does arg_max, in an order SQL leaves open)
            t = rs[0][4]
            if not total or t is None or (rid in newest and newest[rid] >= t):
                continue
            newest[rid] = t
        out[rid] = {"rule_version_id": v, "reward": _sql_max(total),
                    "components": {r[2]: math.nan if r[3] is None else float(r[3])
                                   for r in sorted(rs, key=lambda r: r[2])}}
    return out


def _sql_max(xs: list) -> float | None:
    """``max`` as SQL takes it: NULLs skipped, NaN above every number, NULL when nothing is left."""
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return math.nan if any(math.isnan(x) for x in xs) else max(xs)


def _sql_sum(xs: list) -> float | None:
    """``sum`` as SQL takes it, in the order given: NULLs skipped, NULL when nothing is left."""
    xs = [x for x in xs if x is not None]
    return sum(xs) if xs else None


def _codes(values: list) -> np.ndarray:
    """Integer codes of hashable values (equal values, equal codes)."""
    index: dict = {}
    return np.array([index.setdefault(v, len(index)) for v in values], dtype=np.int64)


def _sequence_sql(key: str, rewards: list, groups: list, batches: list | None = None) -> np.ndarray:
    """A sequence estimator's numpy twin under the SQL twins' rules: a NULL reward (None) is left
    out of its group's statistics and gets 0 (here: a group of its own, which the twins give 0), and
    a NaN reward makes its group's other advantages NaN (it propagates through SQL's avg, and a NaN
    spread is not "all equal"). REINFORCE++ then whitens per batch (:func:`~studio.signals.advantages.whiten`)."""
    null = np.array([x is None for x in rewards], dtype=bool)
    r = np.array([0.0 if x is None else x for x in rewards], dtype=np.float64)
    g = _codes(groups)
    g[null] = -1 - np.arange(int(null.sum()))
    with np.errstate(invalid="ignore"):
        a = SEQUENCE_FNS["dr_grpo" if key == "reinforce_pp" else key](r, g)
    a[np.isin(g, g[np.isnan(r)])] = np.nan
    return whiten(a, _codes(batches)) if key == "reinforce_pp" else a


def _token_rows(store: Store, sql: str, params: list) -> dict[str, list[dict]]:
    """``{rollout_id: rows in position order}`` of a per-token read (one list of structs)."""
    out: dict[str, list[dict]] = {}
    for t in store.scalar(sql, params) or []:
        out.setdefault(t["rollout_id"], []).append(t)
    return out


def _kl_first(store: Store, members: list[dict], credit: Credit) -> tuple[list, dict]:
    """KL in the reward, first token, as :func:`~studio.queries.scoring.scored_rollouts_sql`: G_0 = R - β·Σ_t (log π - log π_ref)
    when every token has a reference log-prob (the FLOAT difference taken by DuckDB, as there), and
    A_0 = G_0 - mean over the group of G_0. Also returns the tokens read."""
    ids = [m["rollout_id"] for m in members]
    toks = _token_rows(store, """
        SELECT list({'rollout_id': t.rollout_id, 'pos': t.pos, 'logprob': t.logprob, 'ref': sc.logprob,
                     'd': t.logprob - sc.logprob} ORDER BY t.rollout_id, t.pos)
        FROM tokens t LEFT JOIN token_scores sc ON sc.rollout_id = t.rollout_id AND sc.pos = t.pos
             AND sc.policy_version = ?
        WHERE t.rollout_id IN (SELECT unnest(?::VARCHAR[]))""", [credit.reference or "", ids])
    g0 = []
    for m in members:
        ts = toks.get(m["rollout_id"])
        kl = _sql_sum([t["d"] for t in ts]) if ts and all(t["ref"] is not None for t in ts) else None
        g0.append(None if kl is None or m["reward"] is None else m["reward"] - float(credit.beta) * kl)
    known = [x for x in g0 if x is not None]
    base = sum(known) / len(known) if known else None
    return [math.nan if x is None else x - base for x in g0], toks


def _gae_first(store: Store, members: list[dict], credit: Credit) -> tuple[list, dict]:
    """GAE's first-token advantage, as :func:`~studio.queries.scoring.scored_rollouts_sql`: A_0 = Σ_t (γλ)^t δ_t + (γλ)^T·R over
    the critic's values (each term taken by DuckDB, in its types), NULL unless every token has a value.
    Also returns the values read."""
    ids = [m["rollout_id"] for m in members]
    gl = float(credit.gamma) * float(credit.lam)
    vals = _token_rows(store, f"""
        SELECT list({{'rollout_id': rollout_id, 'pos': pos, 'value': value, 'term': term}} ORDER BY rollout_id, pos)
        FROM (SELECT rollout_id, pos, value,
                     pow({gl!r}, pos) * ({float(credit.gamma)!r}
                                         * lead(value, 1, 0.0) OVER (PARTITION BY rollout_id ORDER BY pos)
                                         - value) AS term
              FROM token_scores WHERE policy_version = ? AND rollout_id IN (SELECT unnest(?::VARCHAR[])))""",
                       [credit.values or "", ids])
    out = []
    for m in members:
        ts = vals.get(m["rollout_id"])
        part = _sql_sum([t["term"] for t in ts]) if ts else None
        n = sum(t["value"] is not None for t in ts) if ts else None
        if part is None or m["reward"] is None or m["n_tokens"] is None or n != m["n_tokens"]:
            out.append(math.nan)
        else:
            out.append(part + math.pow(gl, max(t["pos"] for t in ts)) * m["reward"])
    return out, vals


def _listed(members: list[dict]) -> list[dict]:
    """The members with a prompt and a run row, as :func:`~studio.queries.reads.rollout` returns them, in sample order."""
    rows = []
    for m in members:
        if m["_prompt"] is None or m["_run"] is None:
            continue
        row = {n: m[n] for n in SCORED_NAMES}
        row["rule_version_id"] = m["rule_version_id"]
        for k in ("reward", "accuracy", "advantage"):
            row[k] = math.nan if m[k] is None else float(m[k])
        (row["prompt"], row["gold"], row["task"]), (row["run"], row["policy"]) = m["_prompt"], m["_run"]
        row["components"] = m["components"]
        rows.append(row)
    return sorted(rows, key=lambda r: (r["sample_idx"] is None, r["sample_idx"] or 0, r["rollout_id"]))


