"""Credit under the tokens: per-token advantages by estimator, steps, and step rewards.

- :func:`token_advantages`: one rollout's advantage per token under a
  :class:`~studio.advantages.Credit` (sequence estimators broadcast; KL in the reward and
  GAE vary along the tokens).
- :class:`Segmenter`: steps by delimiter, regex, newline or tag, as character spans;
  :func:`token_spans` maps them onto tokens.
- :func:`rollout_view`: what a click on a rollout reads for the token strip, each thing once.
- Step rewards from several sources (:func:`step_rewards`): a rule's ``step_reward`` or a
  process reward model (stored in ``step_rewards``), information gain (IGPO: the change in
  P(gold answer) step by step, teacher-forced with the policy, :func:`information_gain`),
  and the implicit process reward β·Σ log(π/π_ref) over a step (PRIME, from stored
  reference log-probs).
- :func:`aggregate` and :func:`gated` turn step rewards into an outcome;
  :func:`step_advantages` normalises them within a group (process supervision).
- Group diagnostics: :func:`all_equal_by_step`, :func:`prompt_stats` (variance, pass rate,
  difficulty band).
"""
from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from . import queries
from .advantages import EQUAL_TOL, Credit, gae, kl_in_reward, kl_token_rewards, outcome_rewards
from .store import Store

SEGMENTERS = ("task", "delimiter", "regex", "newline", "tag")
AGGREGATES = ("min", "mean", "sum", "last")
IMPLICIT = "implicit"  # the step-reward source computed from reference log-probs
BANDS = ((0.0, 0.0, "never solved"), (0.0, 0.35, "hard"), (0.35, 0.65, "medium"), (0.65, 1.0, "easy"),
         (1.0, 1.0, "always solved"))


# ---------------------------------------------------------------------------- per-token advantages

@dataclass
class TokenCredit:
    values: np.ndarray | None  # one per token; None when the estimator cannot run here
    sequence: float | None  # the rollout's sequence figure (first-token advantage for token estimators)
    note: str | None = None  # why values are missing


def token_advantages(store: Store, rollout_id: str, credit: Credit, rule_version_id: str | None = None,
                     scored: queries.ScoredGroup | None = None) -> TokenCredit:
    """The rollout's advantage per token under ``credit`` (see :mod:`studio.advantages`).

    ``scored``: the rollout's group as :func:`queries.scored_group` scored it under the same
    ``credit`` and version (the token strip has it from the header); read afresh when not given
    or not that.
    """
    credit.validate()
    if credit.missing:
        return TokenCredit(None, None, credit.missing)
    if (scored is None or scored.credit != credit or scored.rule_version_id != rule_version_id
            or scored.row(rollout_id) is None):
        scored = queries.scored_group(store, rollout_id, rule_version_id, credit)
    row = scored.row(rollout_id)
    if row is None:
        return TokenCredit(None, None, "rollout not in this store")
    n = int(row["n_tokens"])
    seq = None if pd.isna(row["advantage"]) else float(row["advantage"])
    if credit.estimator == "kl":  # every completion of the group: the baseline is their mean return
        members = {m["rollout_id"]: m for m in scored.members}
        parts, ids, gids = [], [], []
        for rid, toks in scored.tokens.items():  # in rollout id order, with the log-probs the header summed
            m = members[rid]
            ref = _floats([t["ref"] for t in toks])
            if np.isnan(ref).any() or pd.isna(m["reward"]):
                continue
            parts.append(kl_token_rewards(_floats([t["logprob"] for t in toks]), ref, float(m["reward"]), credit.beta))
            ids.append(rid)
            gids.append(m["group_id"])
        if rollout_id not in ids:
            return TokenCredit(None, None, f"no reference log-probs from {credit.reference} for this rollout "
                                           "(score it in Compare policies)")
        adv = kl_in_reward(parts, np.array(gids))
        return TokenCredit(adv[ids.index(rollout_id)], seq)
    if credit.estimator == "gae":
        v = _floats([t["value"] for t in scored.tokens.get(rollout_id, [])])  # the critic's values, in position order
        if len(v) != n or np.isnan(v).any() or pd.isna(row["reward"]):
            return TokenCredit(None, None, f"no values from {credit.values} for this rollout (score it with the critic)")
        adv = gae(outcome_rewards(n, float(row["reward"])), v, credit.gamma, credit.lam)
        return TokenCredit(adv, seq)
    return TokenCredit(None if seq is None else np.full(n, seq), seq)


def _floats(xs: list) -> np.ndarray:
    """Read values as float64 (NULL as NaN)."""
    return np.array([np.nan if x is None else x for x in xs], dtype=np.float64)


def _group_of(store: Store, rollout_id: str) -> str:
    return store.scalar("SELECT group_id FROM rollouts WHERE rollout_id = ?", [rollout_id]) or ""


def compare_estimators(store: Store, a: Credit, b: Credit, run_id: str | None = None,
                       rule_version_id: str | None = None) -> pd.DataFrame:
    """Every rollout of the scope under two estimators: ``adv_a``, ``adv_b``, their
    difference, whether the sign flips, and the rank of each within its group."""
    f = queries.RolloutFilter(run_id=run_id, limit=10**9)
    ta = queries.rollout_table(store, f, rule_version_id, a)[["rollout_id", "prompt", "group_id", "reward", "advantage"]]
    tb = queries.rollout_table(store, f, rule_version_id, b)[["rollout_id", "advantage"]]
    df = ta.rename(columns={"advantage": "adv_a"}).merge(tb.rename(columns={"advantage": "adv_b"}), on="rollout_id")
    df["diff"] = df["adv_b"] - df["adv_a"]
    df["sign_flip"] = (np.sign(df["adv_a"].round(9)) * np.sign(df["adv_b"].round(9))) < 0
    df["rank_a"] = df.groupby("group_id")["adv_a"].rank(method="min", ascending=False)
    df["rank_b"] = df.groupby("group_id")["adv_b"].rank(method="min", ascending=False)
    df["rank_change"] = df["rank_a"] != df["rank_b"]
    return df.sort_values("diff", key=lambda s: -s.abs()).reset_index(drop=True)


# ---------------------------------------------------------------------------- steps

@dataclass(frozen=True)
class Segmenter:
    """How a completion splits into steps.

    - ``task`` (default): the task's own steps, as stored with the tokens (the sample
      task: each ``a op b = c`` before a ``;``; the final ``A:`` answer is not a step).
    - ``delimiter``: split at every occurrence of ``pattern`` (default ``;``, the sample
      task's); the delimiter closes its step and is not part of it.
    - ``regex``: split at every match of the regular expression ``pattern``.
    - ``newline``: split at line breaks.
    - ``tag``: each ``<pattern>…</pattern>`` is a step (text outside tags is not).

    Empty or blank steps are dropped; a completion with no delimiter is one step.
    """

    kind: str = "task"
    pattern: str = ";"

    def validate(self) -> None:
        if self.kind not in SEGMENTERS:
            raise ValueError(f"unknown segmentation {self.kind!r}; choose from {', '.join(SEGMENTERS)}")
        if self.kind in ("delimiter", "tag") and not self.pattern:
            raise ValueError(f"a {self.kind} segmentation needs a non-empty pattern")
        if self.kind == "regex":
            try:
                if re.compile(self.pattern).match(""):
                    raise ValueError(f"regex {self.pattern!r} matches the empty string: it would split everywhere")
            except re.error as exc:
                raise ValueError(f"regex {self.pattern!r} does not compile: {exc}") from None

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Character spans ``[start, end)`` of the steps of ``text``.

        >>> Segmenter("delimiter").spans("2+3=5;5*2=10;A:10")
        [(0, 5), (6, 12), (13, 17)]
        >>> Segmenter("delimiter").spans(";;2+3=5;")  # empty steps are dropped
        [(2, 7)]
        >>> Segmenter("tag", "step").spans("<step>a</step> x <step>bc</step>")
        [(6, 7), (23, 25)]
        >>> Segmenter("newline").spans("no line break")  # missing delimiter: one step
        [(0, 13)]
        """
        self.validate()
        if self.kind == "task":
            raise ValueError("task steps come from the store: use steps_of()")
        if self.kind == "tag":
            tag = re.escape(self.pattern)
            raw = [(m.start(1), m.end(1)) for m in re.finditer(f"<{tag}>(.*?)</{tag}>", text, flags=re.S)]
        else:
            sep = {"delimiter": re.escape(self.pattern), "regex": self.pattern, "newline": r"\r?\n"}[self.kind]
            raw, start = [], 0
            for m in re.finditer(sep, text):
                raw.append((start, m.start()))
                start = m.end()
            raw.append((start, len(text)))
        return [(a, b) for a, b in raw if text[a:b].strip()]


def token_spans(token_texts: list[str], char_spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Token index ranges ``(first, last)`` (inclusive) covering each character span.

    Each token belongs to the first step whose characters it overlaps, so a step split
    mid-token (a token holding the end of one step and the start of the next) starts at the
    next token; a step that lies wholly inside one token gets that token. Offsets come from
    the tokens' texts, whose concatenation is the completion.

    >>> token_spans(["2+", "3=5", ";5", "*2"], [(0, 5), (6, 10)])  # ";5" opens step 2
    [(0, 1), (2, 3)]
    >>> token_spans(["2+3", "=5;5", "*2"], [(0, 5), (6, 10)])  # "=5;5" ends step 1: step 2 starts after it
    [(0, 1), (2, 2)]
    >>> token_spans(["ab;cd"], [(0, 2), (3, 5)])  # both steps inside one token
    [(0, 0), (0, 0)]
    """
    starts = np.cumsum([0] + [len(t) for t in token_texts])
    owner: list[int | None] = []
    for i in range(len(token_texts)):
        s, e = starts[i], starts[i + 1]
        owner.append(next((k for k, (a, b) in enumerate(char_spans) if s < b and a < e), None))
    out = []
    for k, (a, b) in enumerate(char_spans):
        mine = [i for i, o in enumerate(owner) if o == k]
        if not mine:  # wholly inside a token that an earlier step owns
            mine = [next((i for i in range(len(token_texts)) if starts[i] < b and a < starts[i + 1]),
                         max(len(token_texts) - 1, 0))]
        out.append((int(mine[0]), int(mine[-1])))
    return out


def steps_of(store: Store, rollout_id: str, seg: Segmenter = Segmenter(),
             tokens: pd.DataFrame | None = None) -> pd.DataFrame:
    """The rollout's steps: ``step_idx``, ``start_pos``, ``end_pos`` (token range), ``text``
    and ``char_end`` (where the step ends in the completion). Special tokens (``<eos>``)
    count as no text. ``tokens``: the rollout's tokens in order (``token_text``, ``step_idx``),
    when the caller has read them (:func:`queries.tokens`)."""
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
            trimmed = body.rstrip(";")  # the separator closes its step but is not part of its text
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
    group: queries.ScoredGroup  # the rollout's group, scored as the header was (the group view can draw it)


def rollout_view(store: Store, rollout_id: str, credit: Credit, rule_version_id: str | None = None,
                 seg: Segmenter = Segmenter()) -> RolloutView | None:
    """Everything a click on a rollout reads for the token strip (None when the rollout is not in
    the store): its group scored once (:func:`queries.scored_group`) gives the header and the
    per-token advantages, and its tokens read once give the strip and the steps. Settings that
    are wrong raise ``ValueError`` (an estimator's, a segmentation's)."""
    ahead = queries.read_ahead(queries.tokens, store, rollout_id)  # read beside the group: it needs nothing from it
    with queries.settled(lambda: ahead):
        scored = queries.scored_group(store, rollout_id, rule_version_id, credit)
    ro = scored.row(rollout_id)
    toks = ahead.result()
    if ro is None:
        return None
    tc = token_advantages(store, rollout_id, credit, rule_version_id, scored)
    return RolloutView(dict(ro), toks, tc, steps_of(store, rollout_id, seg, toks), scored)


# ---------------------------------------------------------------------------- step rewards

def step_sources(store: Store) -> list[str]:
    """Stored step-reward sources (rule versions with a step rule, PRMs, information gain)."""
    return [r[0] for r in store.cursor().execute(
        "SELECT DISTINCT source FROM step_rewards ORDER BY 1").fetchall()]


def step_rewards(store: Store, rollout_id: str, source: str, seg: Segmenter = Segmenter(),
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
                        JOIN token_scores sc ON sc.rollout_id = t.rollout_id AND sc.pos = t.pos AND sc.policy_version = ?
                        WHERE t.rollout_id = ? ORDER BY t.pos""", [reference, rollout_id])
        if t.empty:
            return steps.assign(value=np.nan).iloc[:0]
        lr = dict(zip(t["pos"], t["lr"]))
        steps["value"] = [beta * sum(lr.get(p, 0.0) for p in range(a, b + 1))
                          for a, b in zip(steps["start_pos"], steps["end_pos"])]
        return steps
    return store.df("""SELECT step_idx, start_pos, end_pos, value FROM step_rewards
                       WHERE rollout_id = ? AND source = ? ORDER BY step_idx""", [rollout_id, source])


def aggregate(values: np.ndarray, how: str = "min") -> float | None:
    """Step rewards to one outcome: ``min`` (a chain is as good as its worst step, the PRM
    convention), ``mean``, ``sum`` or ``last``. None for no steps.

    >>> aggregate([1.0, 0.0, 1.0], "min"), aggregate([1.0, 0.0, 1.0], "mean"), aggregate([1, 0, 1], "last")
    (0.0, 0.6666666666666666, 1.0)
    """
    v = np.asarray(values, dtype=np.float64)
    if how not in AGGREGATES:
        raise ValueError(f"unknown aggregation {how!r}; choose from {', '.join(AGGREGATES)}")
    if v.size == 0:
        return None
    return float({"min": v.min, "mean": v.mean, "sum": v.sum, "last": lambda: v[-1]}[how]())


def gated(outcome: float, step_values, tau: float) -> float:
    """Gated reward accumulation (G-RA): R = R_out + 1[R_out >= τ]·Σ_k r_k — step rewards
    count only when the outcome reaches τ, so they cannot be farmed by a failing chain.

    >>> gated(1.0, [0.2, 0.3], tau=1.0), gated(0.0, [0.2, 0.3], tau=1.0)
    (1.5, 0.0)
    """
    return float(outcome) + (float(np.sum(step_values)) if outcome >= tau else 0.0)


def step_advantages(step_values: list[np.ndarray], eps: float = 1e-4) -> list[np.ndarray]:
    """Step-level advantages normalised within a group (DeepSeekMath process supervision):
    every step reward of the group's completions is normalised by the mean and std of all of
    them, r̃ = (r - mean) / (std + eps); a token's advantage is the sum of r̃ over its step
    and the steps after it. Returns each completion's per-step advantage (that suffix sum).
    All-equal step rewards give 0.

    >>> # all four: mean 0.75, std 0.5, so r̃ = 0.5 for a 1 and -1.5 for a 0; then suffix sums
    >>> [a.round(3).tolist() for a in step_advantages([np.array([1.0, 0.0]), np.array([1.0, 1.0])])]
    [[-1.0, -1.5], [1.0, 0.5]]
    """
    allv = np.concatenate([np.asarray(v, dtype=np.float64) for v in step_values]) if step_values else np.array([])
    if allv.size < 2 or np.ptp(allv) <= EQUAL_TOL:
        return [np.zeros(len(v)) for v in step_values]
    mu, sd = allv.mean(), allv.std(ddof=1)
    return [np.cumsum(((np.asarray(v, dtype=np.float64) - mu) / (sd + eps))[::-1])[::-1] for v in step_values]


def group_step_advantages(store: Store, rollout_id: str, source: str, seg: Segmenter = Segmenter(),
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
    return dict(zip(mine["step_idx"].astype(int), adv[order.index(rollout_id)].tolist()))


def answer_text(task: str, gold: dict) -> str:
    """What the policy writes to give the gold answer (the sample task: ``A:<answer>``)."""
    return f"A:{gold['answer']}" if task == "arithmetic" else str(gold.get("answer", ""))


async def information_gain(store: Store, policy_path: str | Path, rollout_ids: list[str],
                           seg: Segmenter = Segmenter()) -> str:
    """IGPO step rewards: IG_k = P(gold | prefix through step k) - P(gold | through k-1),
    with P(gold | prefix) teacher-forced by the policy itself: the probability that the
    policy writes the gold answer right after the prefix (and, after step k, the step's
    delimiter). Stored in ``step_rewards`` under ``ig-<policy version>``; returns that id.
    Rollouts it already covers are skipped.
    """
    from . import workers

    rows = store.df("""SELECT ro.rollout_id, ro.text, p.text AS prompt, p.gold, p.task FROM rollouts ro
                       JOIN prompts p USING (prompt_id) WHERE list_contains(?, ro.rollout_id)""", [rollout_ids])
    jobs = []
    for r in rows.itertuples(index=False):
        steps = steps_of(store, r.rollout_id, seg)
        gold = queries.prompt_of_row({"prompt": r.prompt, "gold": r.gold}).gold
        sep = ";" if seg.kind == "task" and r.task == "arithmetic" else seg.pattern if seg.kind == "delimiter" else ""
        prefixes = [""] + [r.text[:e] + sep for e in steps["char_end"]]
        jobs.append((r.rollout_id, steps, r.prompt, prefixes, answer_text(r.task, gold)))
    ex = workers.pool()
    loop = asyncio.get_running_loop()
    flat_prompts = [j[2] for j in jobs for _ in j[3]]
    flat_prefix = [p for j in jobs for p in j[3]]
    flat_answer = [j[4] for j in jobs for _ in j[3]]
    probs, version = await loop.run_in_executor(None, lambda: ex.submit(
        workers.answer_prob_job, str(policy_path), flat_prompts, flat_prefix, flat_answer).result())
    source = f"ig-{version}"
    done = set(store.df("SELECT DISTINCT rollout_id FROM step_rewards WHERE source = ?", [source])["rollout_id"])
    out, i = [], 0
    for rid, steps, _, prefixes, _ in jobs:
        p = np.array(probs[i:i + len(prefixes)])
        i += len(prefixes)
        if rid in done:
            continue
        for k, (a, b) in enumerate(zip(steps["start_pos"], steps["end_pos"])):
            out.append((rid, k, int(a), int(b), source, float(p[k + 1] - p[k])))
    if out:
        store.write({"step_rewards": pd.DataFrame(out, columns=["rollout_id", "step_idx", "start_pos", "end_pos",
                                                                 "source", "value"])})
    return source


PRM_PREFIX, VALUE_PREFIX = "prm-", "value-"  # step-reward source / token_scores version of process models


def _model_version(folder: Path, what: str) -> str:
    """``folder@weights-hash`` after the folder checks, worded for ``what`` (no torch here: the
    worker loads the model and says what else is wrong with it)."""
    from backends.types import PolicyLoadError, check_policy_folder, weights_version

    try:
        check_policy_folder(folder)
    except PolicyLoadError as exc:
        msg = str(exc)
        raise PolicyLoadError(what + msg[len("policy"):] if msg.startswith("policy ") else msg) from None
    return weights_version(folder)


def _todo(store: Store, table: str, col: str, key: str, rollout_ids: list[str]) -> list[str]:
    done = set(store.df(f"SELECT DISTINCT rollout_id FROM {table} WHERE {col} = ? AND list_contains(?, rollout_id)",
                        [key, rollout_ids])["rollout_id"])
    return [r for r in rollout_ids if r not in done]


async def prm_steps(store: Store, prm_path: str | Path, rollout_ids: list[str], seg: Segmenter = Segmenter(),
                    batch: int = 512) -> str:
    """Score every step of the rollouts with a process reward model: the PRM's P(step k is
    correct) on the prompt plus the completion through step k (``backends.process_models``),
    in a worker. Stored in ``step_rewards`` under ``prm-<folder@weights hash>``; returns
    that id. Rollouts it already covers are skipped."""
    from . import workers

    folder = Path(prm_path).expanduser().resolve()
    source = PRM_PREFIX + _model_version(folder, "process reward model")
    todo = _todo(store, "step_rewards", "source", source, rollout_ids)
    for lo in range(0, len(todo), batch):
        rows = store.df("""SELECT ro.rollout_id, ro.text, p.text AS prompt FROM rollouts ro JOIN prompts p
                           USING (prompt_id) WHERE list_contains(?, ro.rollout_id)""", [todo[lo:lo + batch]])
        steps = [steps_of(store, r, seg) for r in rows["rollout_id"]]
        fut = workers.pool().submit(workers.prm_job, str(folder), rows["prompt"].tolist(), rows["text"].tolist(),
                                    [[int(e) for e in st["char_end"]] for st in steps])
        scores, _ = await asyncio.wrap_future(fut)
        out = [(rid, k, int(a), int(b), source, float(v))
               for rid, st, sc in zip(rows["rollout_id"], steps, scores)
               for k, (a, b, v) in enumerate(zip(st["start_pos"], st["end_pos"], sc))]
        if out:
            store.write({"step_rewards": pd.DataFrame(out, columns=["rollout_id", "step_idx", "start_pos", "end_pos",
                                                                     "source", "value"])})
    return source


async def critic_values(store: Store, value_path: str | Path, rollout_ids: list[str], batch: int = 512) -> str:
    """Per-token values V(s_t) of a value model (critic) for the rollouts, in a worker,
    stored in ``token_scores.value`` under ``value-<folder@weights hash>`` (what GAE's
    "critic values" reads); returns that id. Rollouts it already covers are skipped; a
    critic whose tokenizer does not read the stored token ids as the rollout's text is
    refused (``workers.TokenizerMismatch``)."""
    from . import workers

    folder = Path(value_path).expanduser().resolve()
    version = VALUE_PREFIX + _model_version(folder, "value model")
    todo = _todo(store, "token_scores", "policy_version", version, rollout_ids)
    for lo in range(0, len(todo), batch):
        rows = store.df("""SELECT ro.rollout_id, ro.text, p.text AS prompt, list(t.token_id ORDER BY t.pos) AS ids
                           FROM rollouts ro JOIN prompts p USING (prompt_id) JOIN tokens t USING (rollout_id)
                           WHERE list_contains(?, ro.rollout_id) GROUP BY ALL""", [todo[lo:lo + batch]])
        ids = [[int(i) for i in x] for x in rows["ids"]]
        fut = workers.pool().submit(workers.value_job, str(folder), rows["prompt"].tolist(), ids,
                                    rows["text"].tolist())
        values, _ = await asyncio.wrap_future(fut)
        n = [len(v) for v in values]
        store.write({"token_scores": pd.DataFrame({
            "rollout_id": np.repeat(rows["rollout_id"].to_numpy(), n),
            "pos": np.concatenate([np.arange(k) for k in n]) if n else [],
            "policy_version": version,  # logprob and entropy stay NULL: a critic has none
            "value": np.concatenate([np.asarray(v, dtype=np.float64) for v in values]) if n else []})})
    return version


# ---------------------------------------------------------------------------- group diagnostics

def all_equal_by_step(store: Store, run_id: str, rule_version_id: str | None = None) -> pd.DataFrame:
    """Per training step of a run: groups, the share whose rewards are all equal (no
    learning signal), and the mean reward. Runs without steps read as one step (0)."""
    base, params = queries.scored_rollouts_sql(rule_version_id, "ro.run_id = ?", [run_id])
    return store.df(f"""
        SELECT step, count(*) AS groups, avg(CASE WHEN all_equal THEN 1.0 ELSE 0.0 END) AS all_equal_share,
               avg(mean_reward) AS mean_reward
        FROM (SELECT coalesce(any_value(train_step), 0) AS step, group_id,
                     coalesce(max(reward) - min(reward) <= {EQUAL_TOL!r}, true) AS all_equal, avg(reward) AS mean_reward
              FROM ({base}) GROUP BY group_id)
        GROUP BY step ORDER BY step""", params)


def band(pass_rate: float) -> str:
    """Difficulty band of a prompt by its pass rate.

    >>> band(0.0), band(0.2), band(0.5), band(0.9), band(1.0)
    ('never solved', 'hard', 'medium', 'easy', 'always solved')
    """
    if pass_rate <= 0.0:
        return "never solved"
    if pass_rate >= 1.0:
        return "always solved"
    return "hard" if pass_rate < 0.35 else "medium" if pass_rate < 0.65 else "easy"


def prompt_stats(store: Store, run_id: str | None = None, rule_version_id: str | None = None) -> pd.DataFrame:
    """Per prompt: completions, pass rate, reward mean and variance (sample), and its band."""
    base, params = queries.scored_rollouts_sql(rule_version_id, "ro.run_id = ?" if run_id else "TRUE",
                                               [run_id] if run_id else [])
    df = store.df(f"""
        SELECT p.text AS prompt, count(*) AS n, avg(CASE WHEN s.accuracy >= 1 THEN 1.0 ELSE 0.0 END) AS pass_rate,
               avg(s.reward) AS mean_reward, coalesce(var_samp(s.reward), 0) AS reward_var
        FROM ({base}) s JOIN prompts p USING (prompt_id) GROUP BY p.text ORDER BY reward_var DESC, p.text""", params)
    df["band"] = [band(x) for x in df["pass_rate"]]
    return df
