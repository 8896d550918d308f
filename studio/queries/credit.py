"""Credit under the tokens, as read from the store: per-token advantages, steps, step rewards.

- :func:`token_advantages`: one rollout's advantage per token under a
  :class:`~studio.signals.advantages.Credit` (sequence estimators broadcast; KL in the reward and
  GAE vary along the tokens); :func:`compare_estimators`: every rollout of a run under two.
- :func:`steps_of`: a rollout's steps under a :class:`~studio.signals.steps.Segmenter` (or the
  task's own ``step_idx``), as token ranges.
- :func:`rollout_view`: what a click on a rollout reads for the token strip, each thing once.
- :func:`step_rewards`: one rollout's step rewards from a stored source (a rule's
  ``step_reward``, a process reward model, information gain: ``studio.runs.credit_models``
  writes the last two) or :data:`IMPLICIT`, the implicit process reward β·Σ log(π/π_ref) over a
  step (PRIME, from stored reference log-probs); :func:`group_step_advantages` normalises them
  within the rollout's group (process supervision).
- :func:`turn_advantages`: an agent trajectory's per-turn rewards from a stored source (a rule's
  ``turn_reward``, an import's per-turn scores, information gain per turn) made advantages over
  its group (:mod:`studio.signals.turns`: normalisation, discount, the G-RA gate);
  :func:`turn_token_advantages` spreads them over the tokens (a tool response's: 0).
- Group diagnostics: :func:`all_equal_by_step`, :func:`prompt_stats` (variance, pass rate,
  difficulty band).

Tokens the policy did not write (``tokens.trained`` false: a tool's response) get no credit
under any estimator: their advantage is 0.

The formulas are :mod:`studio.signals`' pure functions (:mod:`~studio.signals.advantages`,
:mod:`~studio.signals.steps`, :mod:`~studio.signals.turns`); this module reads what they need.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from studio.queries.ahead import read_ahead, settled
from studio.queries.points import ScoredGroup, scored_group
from studio.queries.reads import tokens as read_tokens
from studio.queries.scoring import scored_rollouts_sql
from studio.queries.table import RolloutFilter, rollout_table
from studio.signals.advantages import (
    EQUAL_TOL,
    Credit,
    gae,
    kl_in_reward,
    kl_token_rewards,
    outcome_rewards,
    spread_sql,
)
from studio.signals.steps import Segmenter, band, step_advantages, token_spans
from studio.signals.turns import TurnCredit, gate_turns
from studio.signals.turns import turn_advantages as turn_credit
from studio.store import Store

IMPLICIT = "implicit"  # the step-reward source computed from reference log-probs
PRM_PREFIX, VALUE_PREFIX = "prm-", "value-"  # step-reward source / token_scores version of process models


# ---------------------------------------------------------------------------- per-token advantages

@dataclass
class TokenCredit:
    values: np.ndarray | None  # one per token; None when the estimator cannot run here
    sequence: float | None  # the rollout's sequence figure (first-token advantage for token estimators)
    note: str | None = None  # why values are missing


def token_advantages(store: Store, rollout_id: str, credit: Credit, rule_version_id: str | None = None,
                     scored: ScoredGroup | None = None, trained: np.ndarray | None = None) -> TokenCredit:
    """The rollout's advantage per token under ``credit`` (see :mod:`studio.signals.advantages`);
    0 on the tokens the policy did not write (a tool's response: not trained), under every
    estimator (KL in the reward counts no KL term there either).

    ``scored``: the rollout's group as :func:`scored_group` scored it under the same
    ``credit`` and version (the token strip has it from the header); read afresh when not given
    or not that. ``trained``: the rollout's loss mask ([T] bool), read when not given.
    """
    credit.validate()
    if credit.missing:
        return TokenCredit(None, None, credit.missing)
    if (scored is None or scored.credit != credit or scored.rule_version_id != rule_version_id
            or scored.row(rollout_id) is None):
        scored = scored_group(store, rollout_id, rule_version_id, credit)
    row = scored.row(rollout_id)
    if row is None:
        return TokenCredit(None, None, "rollout not in this store")
    seq = None if pd.isna(row["advantage"]) else float(row["advantage"])
    if pd.isna(row["n_tokens"]):  # imported as text only: no token rows until Enrich fills them
        return TokenCredit(None, seq, "no token rows: enrich this rollout to see its tokens")
    n = int(row["n_tokens"])
    if credit.estimator == "kl":  # every completion of the group: the baseline is their mean return
        members = {m["rollout_id"]: m for m in scored.members}
        masks = _trained_of(store, list(scored.tokens))
        parts, ids, gids = [], [], []
        for rid, toks in scored.tokens.items():  # in rollout id order, with the log-probs the header summed
            m = members[rid]
            on = masks.get(rid, np.ones(len(toks), dtype=bool))
            lp, ref = _floats([t["logprob"] for t in toks]), _floats([t["ref"] for t in toks])
            if np.isnan(ref[on]).any() or pd.isna(m["reward"]):
                continue
            lp[~on], ref[~on] = 0.0, 0.0  # a tool's tokens: not the policy's, no KL term
            parts.append(kl_token_rewards(lp, ref, float(m["reward"]), credit.beta))
            ids.append(rid)
            gids.append(m["group_id"])
        if rollout_id not in ids:
            return TokenCredit(None, None, f"no reference log-probs from {credit.reference} for this rollout "
                                           "(score it in Compare policies)")
        adv = kl_in_reward(parts, np.array(gids))
        return TokenCredit(_untrained_zero(adv[ids.index(rollout_id)], masks.get(rollout_id)), seq)
    if trained is None:
        trained = _trained_of(store, [rollout_id]).get(rollout_id)
    if credit.estimator == "gae":
        v = _floats([t["value"] for t in scored.tokens.get(rollout_id, [])])  # the critic's values, in position order
        if len(v) != n or np.isnan(v).any() or pd.isna(row["reward"]):
            return TokenCredit(None, None,
                               f"no values from {credit.values} for this rollout (score it with the critic)")
        adv = gae(outcome_rewards(n, float(row["reward"])), v, credit.gamma, credit.lam)
        return TokenCredit(_untrained_zero(adv, trained), seq)
    return TokenCredit(None if seq is None else _untrained_zero(np.full(n, seq), trained), seq)


def _trained_of(store: Store, rollout_ids: list[str]) -> dict[str, np.ndarray]:
    """The loss mask ([T] bool) of each rollout that has untrained tokens (the others: every token trained)."""
    if not rollout_ids:
        return {}
    rows = store.df(f"""SELECT rollout_id, list(coalesce(trained, true) ORDER BY pos) AS trained
                        FROM {store.tokens_between(min(rollout_ids), max(rollout_ids))}
                        WHERE rollout_id BETWEEN ? AND ? AND rollout_id IN (SELECT unnest(?::VARCHAR[]))
                        GROUP BY rollout_id HAVING bool_or(NOT coalesce(trained, true))""",
                    [min(rollout_ids), max(rollout_ids), list(rollout_ids)])
    return {r: np.asarray(m, dtype=bool) for r, m in zip(rows["rollout_id"], rows["trained"], strict=True)}


def _untrained_zero(values: np.ndarray, trained: np.ndarray | None) -> np.ndarray:
    """``values`` with 0 on the tokens the loss does not see."""
    if trained is None or len(trained) != len(values):
        return values
    return np.where(np.asarray(trained, dtype=bool), values, 0.0)


def _floats(xs: list) -> np.ndarray:
    """Read values as float64 (NULL as NaN)."""
    return np.array([np.nan if x is None else x for x in xs], dtype=np.float64)


def compare_estimators(store: Store, a: Credit, b: Credit, run_id: str | None = None,
                       rule_version_id: str | None = None) -> pd.DataFrame:
    """Every rollout of the scope under two estimators: ``adv_a``, ``adv_b``, their
    difference, whether the sign flips, and the rank of each within its group."""
    f = RolloutFilter(run_id=run_id, limit=10**9)
    ta = rollout_table(store, f, rule_version_id, a)[["rollout_id", "prompt", "group_id", "reward", "advantage"]]
    tb = rollout_table(store, f, rule_version_id, b)[["rollout_id", "advantage"]]
    df = ta.rename(columns={"advantage": "adv_a"}).merge(tb.rename(columns={"advantage": "adv_b"}), on="rollout_id")
    df["diff"] = df["adv_b"] - df["adv_a"]
    df["sign_flip"] = (np.sign(df["adv_a"].round(9)) * np.sign(df["adv_b"].round(9))) < 0
    df["rank_a"] = df.groupby("group_id")["adv_a"].rank(method="min", ascending=False)
    df["rank_b"] = df.groupby("group_id")["adv_b"].rank(method="min", ascending=False)
    df["rank_change"] = df["rank_a"] != df["rank_b"]
    return df.sort_values("diff", key=lambda s: -s.abs()).reset_index(drop=True)


# ---------------------------------------------------------------------------- steps


def steps_of(store: Store, rollout_id: str, seg: Segmenter = Segmenter(),  # noqa: B008  (a frozen dataclass)
             tokens: pd.DataFrame | None = None) -> pd.DataFrame:
    """The rollout's steps: ``step_idx``, ``start_pos``, ``end_pos`` (token range), ``text``
    and ``char_end`` (where the step ends in the completion). Special tokens (``<eos>``)
    count as no text. ``tokens``: the rollout's tokens in order (``token_text``, ``step_idx``),
    when the caller has read them (:func:`~studio.queries.reads.tokens`)."""
    if tokens is None:
        tokens = store.df(f"SELECT token_text, step_idx FROM {store.tokens_between(rollout_id, rollout_id)} "
                          "WHERE rollout_id = ? ORDER BY pos", [rollout_id])
    # a token with no text (imported ids alone, before enriching) counts as no text; read as plain
    # objects (iterating an Arrow-backed string column costs ~1 ms per hundred tokens)
    raw = tokens["token_text"].to_numpy(dtype=object, na_value=None)
    texts = ["" if t is None or t != t or _special(t) else t for t in raw]
    text = "".join(texts)
    if seg.kind == "task":
        starts = np.cumsum([0] + [len(t) for t in texts])
        rows = []
        step = tokens["step_idx"].to_numpy(dtype=np.float64, na_value=np.nan)  # [T], NaN: no step
        for k in np.unique(step[~np.isnan(step)]):  # each step: its first and last token
            where = np.flatnonzero(step == k)
            a, b = int(where[0]), int(where[-1])
            body = "".join(texts[a:b + 1])
            trimmed = body.rstrip(";").rstrip()  # the separator (';', a line break) closes its step, not part of it
            rows.append((int(k), a, b, trimmed, int(starts[a]) + len(trimmed)))
        return pd.DataFrame(rows, columns=["step_idx", "start_pos", "end_pos", "text", "char_end"])
    spans = seg.spans(text)
    tspans = token_spans(texts, spans)
    return pd.DataFrame({"step_idx": range(len(spans)), "start_pos": [s for s, _ in tspans],
                         "end_pos": [e for _, e in tspans], "text": [text[a:b] for a, b in spans],
                         "char_end": [b for _, b in spans]})


def _special(text: str | None) -> bool:
    return text is not None and text.startswith("<") and text.endswith(">") and len(text) > 2


# ---------------------------------------------------------------------------- one click

@dataclass
class RolloutView:
    """What the token strip shows of one rollout, each thing read once."""

    rollout: dict  # the header row (queries.rollout): prompt, reward, advantage, components, run, policy
    tokens: pd.DataFrame  # queries.tokens
    credit: TokenCredit  # per-token advantages under the view's estimator
    steps: pd.DataFrame  # steps_of under the view's segmentation
    group: ScoredGroup  # the rollout's group, scored as the header was (the group view can draw it)


def rollout_view(store: Store, rollout_id: str, credit: Credit, rule_version_id: str | None = None,
                 seg: Segmenter = Segmenter()) -> RolloutView | None:  # noqa: B008  (a frozen dataclass)
    """Everything a click on a rollout reads for the token strip (None when the rollout is not in
    the store): its group scored once (:func:`scored_group`) gives the header and the
    per-token advantages, and its tokens read once give the strip and the steps. Settings that
    are wrong raise ``ValueError`` (an estimator's, a segmentation's)."""
    ahead = read_ahead(read_tokens, store, rollout_id)  # read beside the group: it needs nothing from it
    with settled(lambda: ahead):
        scored = scored_group(store, rollout_id, rule_version_id, credit)
    ro = scored.row(rollout_id)
    toks = ahead.result()
    if ro is None:
        return None
    mask = toks["trained"].to_numpy(dtype=bool, na_value=True) if "trained" in toks else None
    tc = token_advantages(store, rollout_id, credit, rule_version_id, scored, mask)
    return RolloutView(dict(ro), toks, tc, steps_of(store, rollout_id, seg, toks), scored)


# ---------------------------------------------------------------------------- step rewards

def step_sources(store: Store) -> list[str]:
    """Stored step-reward sources (rule versions with a step rule, PRMs, information gain)."""
    return [r[0] for r in store.cursor().execute(
        "SELECT DISTINCT source FROM step_rewards ORDER BY 1").fetchall()]


def step_rewards(store: Store, rollout_id: str, source: str, seg: Segmenter = Segmenter(),  # noqa: B008  (a frozen dataclass)
                 reference: str | None = None, beta: float = 0.05) -> pd.DataFrame:
    """One rollout's step rewards from ``source``: ``step_idx, start_pos, end_pos, value``.

    ``source`` is a stored source id or :data:`IMPLICIT`: β·Σ_{t in step}(log π - log π_ref)
    with the reference's stored log-probs (PRIME's implicit process reward), over the
    segmenter's steps. Empty when the source has nothing for this rollout.
    """
    if source == IMPLICIT:
        steps = steps_of(store, rollout_id, seg)
        if not reference or steps.empty:
            return steps.assign(value=np.nan).iloc[:0]
        t = store.df("""SELECT t.pos, t.logprob - sc.logprob AS lr FROM tokens t
                        JOIN token_scores sc ON sc.rollout_id = t.rollout_id AND sc.pos = t.pos
                             AND sc.policy_version = ?
                        WHERE t.rollout_id = ? ORDER BY t.pos""", [reference, rollout_id])
        if t.empty:
            return steps.assign(value=np.nan).iloc[:0]
        lr = dict(zip(t["pos"], t["lr"], strict=True))
        steps["value"] = [beta * sum(lr.get(p, 0.0) for p in range(a, b + 1))
                          for a, b in zip(steps["start_pos"], steps["end_pos"], strict=True)]
        return steps
    return store.df("""SELECT step_idx, start_pos, end_pos, value FROM step_rewards
                       WHERE rollout_id = ? AND source = ? ORDER BY step_idx""", [rollout_id, source])


def _group_of(store: Store, rollout_id: str) -> str:
    return store.scalar("SELECT group_id FROM rollouts WHERE rollout_id = ?", [rollout_id]) or ""


def group_step_advantages(store: Store, rollout_id: str, source: str, seg: Segmenter = Segmenter(),  # noqa: B008  (a frozen dataclass)
                          reference: str | None = None, beta: float = 0.05) -> dict[int, float]:
    """The per-step advantages of one rollout under :func:`step_advantages`, normalised over
    the step rewards from ``source`` of every completion in its group (those without step
    rewards from the source are left out). ``{step_idx: advantage}``; empty when the
    rollout has no step rewards from the source."""
    gid = _group_of(store, rollout_id)
    rids = store.df("SELECT rollout_id FROM rollouts WHERE group_id = ? ORDER BY rollout_id", [gid])["rollout_id"]
    if source == IMPLICIT:
        per = {r: step_rewards(store, r, source, seg, reference, beta) for r in rids}
    else:
        rows = store.df("""SELECT rollout_id, step_idx, value FROM step_rewards
                           WHERE source = ? AND rollout_id IN (SELECT rollout_id FROM rollouts WHERE group_id = ?)
                           ORDER BY rollout_id, step_idx""", [source, gid])
        per = {r: g for r, g in rows.groupby("rollout_id", sort=False)}
    per = {r: g for r, g in per.items() if len(g)}
    if rollout_id not in per:
        return {}
    order = list(per)
    adv = step_advantages([per[r]["value"].to_numpy(dtype=np.float64) for r in order])
    mine = per[rollout_id]
    return dict(zip(mine["step_idx"].astype(int), adv[order.index(rollout_id)].tolist(), strict=True))


# ---------------------------------------------------------------------------- turn credit

TURN_ADVANTAGE_COLUMNS = ["turn_idx", "role", "start_pos", "end_pos", "reward", "advantage"]


def turn_advantages(store: Store, rollout_id: str, source: str, how: TurnCredit = TurnCredit(),  # noqa: B008  (a frozen dataclass)
                    rule_version_id: str | None = None) -> pd.DataFrame:
    """One rollout's turns with their reward from ``source`` and their advantage over its group.

    ``source``: a ``turn_rewards`` source (a rule version's ``turn_reward``, an import's per-turn
    scores, ``ig-<policy version>``). Each assistant turn's reward is normalised over the turn
    rewards of every trajectory of the group that has some from the source, then discounted to go
    (:func:`studio.signals.turns.turn_advantages`, settings ``how``); with ``how.tau`` set the
    G-RA gate applies first, with each trajectory's outcome read under ``rule_version_id`` (its
    newest reward when None). Returns :data:`TURN_ADVANTAGE_COLUMNS`, one row per turn in order:
    ``reward`` NaN where the source has none, ``advantage`` 0 on the turns the policy did not
    write (tool, user, system). Empty when the rollout has no reward from the source (a rollout
    without stored turns is one assistant turn).
    """
    how.validate()
    from studio.queries.turns import turn_rewards_of, turns_of

    gid = _group_of(store, rollout_id)
    rids = store.df("SELECT rollout_id FROM rollouts WHERE group_id = ? ORDER BY rollout_id", [gid])["rollout_id"]
    rewards = turn_rewards_of(store, rids.tolist(), [source])
    have = set(rewards["rollout_id"])
    if rollout_id not in have:
        return pd.DataFrame(columns=TURN_ADVANTAGE_COLUMNS)
    turns = turns_of(store, sorted(have))
    value = {(r, int(k)): float(v) for r, k, v in zip(rewards["rollout_id"], rewards["turn_idx"], rewards["value"],
                                                       strict=True) if v is not None and v == v}
    per = {r: g.reset_index(drop=True) for r, g in turns.groupby("rollout_id", sort=True)}
    acting = {r: g.index[g["role"] == "assistant"].to_numpy() for r, g in per.items()}
    vals = {r: np.array([value.get((r, int(per[r]["turn_idx"][i])), np.nan) for i in acting[r]]) for r in per}
    if how.tau is not None:
        outcome = {m["rollout_id"]: m["reward"] for m in scored_group(store, rollout_id, rule_version_id).members}
        vals = {r: gate_turns(v, outcome.get(r), how.tau) for r, v in vals.items()}
    order = [r for r in per if np.isfinite(vals[r]).any()]
    if rollout_id not in order:
        return pd.DataFrame(columns=TURN_ADVANTAGE_COLUMNS)
    adv = turn_credit([vals[r] for r in order], how.norm, how.gamma)[order.index(rollout_id)]
    mine = per[rollout_id]
    out = mine[["turn_idx", "role", "start_pos", "end_pos"]].copy()
    out["reward"], out["advantage"] = np.nan, 0.0
    out.loc[acting[rollout_id], "reward"] = vals[rollout_id]
    out.loc[acting[rollout_id], "advantage"] = adv
    return out.astype({"turn_idx": "int64", "reward": "float64", "advantage": "float64"})[TURN_ADVANTAGE_COLUMNS]


def turn_token_advantages(turns: pd.DataFrame, n_tokens: int) -> np.ndarray:
    """Per-token advantages of a trajectory from :func:`turn_advantages`' rows: every token of
    assistant turn k gets A_k; the tokens of other turns (a tool's response: masked) get 0.

    >>> t = pd.DataFrame({"role": ["assistant", "tool", "assistant"], "start_pos": [0, 2, 3],
    ...                   "end_pos": [2, 3, 5], "advantage": [0.5, 0.0, -1.0]})
    >>> turn_token_advantages(t, 5).tolist()
    [0.5, 0.5, 0.0, -1.0, -1.0]
    """
    out = np.zeros(n_tokens)
    for role, a, b, adv in zip(turns["role"], turns["start_pos"], turns["end_pos"], turns["advantage"], strict=True):
        if role == "assistant" and not pd.isna(a) and not pd.isna(b):
            out[int(a):int(b)] = adv
    return out


# ---------------------------------------------------------------------------- group diagnostics

def all_equal_by_step(store: Store, run_id: str, rule_version_id: str | None = None) -> pd.DataFrame:
    """Per training step of a run: groups, the share whose rewards are all equal (no
    learning signal), and the mean reward. Runs without steps read as one step (0)."""
    base, params = scored_rollouts_sql(rule_version_id, "ro.run_id = ?", [run_id])
    return store.df(f"""
        SELECT step, count(*) AS groups, avg(CASE WHEN all_equal THEN 1.0 ELSE 0.0 END) AS all_equal_share,
               avg(mean_reward) AS mean_reward
        FROM (SELECT coalesce(any_value(train_step), 0) AS step, group_id,
                     coalesce(max(reward) - min(reward) <= {EQUAL_TOL!r}, true) AS all_equal, avg(reward) AS mean_reward
              FROM ({base}) GROUP BY group_id)
        GROUP BY step ORDER BY step""", params)


def prompt_stats(store: Store, run_id: str | None = None, rule_version_id: str | None = None) -> pd.DataFrame:
    """Per prompt: completions, pass rate, reward mean and variance (sample), and its band."""
    base, params = scored_rollouts_sql(rule_version_id, "ro.run_id = ?" if run_id else "TRUE",
                                               [run_id] if run_id else [])
    df = store.df(f"""
        SELECT p.text AS prompt, count(*) AS n, avg(CASE WHEN s.accuracy >= 1 THEN 1.0 ELSE 0.0 END) AS pass_rate,
               avg(s.reward) AS mean_reward, coalesce({spread_sql('var_samp', 's.reward')}, 0) AS reward_var
        FROM ({base}) s JOIN prompts p USING (prompt_id) GROUP BY p.text ORDER BY reward_var DESC, p.text""", params)
    df["band"] = [band(x) for x in df["pass_rate"]]
    return df
