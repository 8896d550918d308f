"""Step credit computed by a model in the worker: information gain, PRM step scores, critic values.

- :func:`information_gain` (IGPO): the change in P(gold answer) step by step, teacher-forced
  with the policy → ``step_rewards`` (source ``ig-<policy version>``).
- :func:`turn_information_gain` (IGPO over an agent trajectory's turns): the change in
  P(gold answer) turn by turn → ``turn_rewards`` (source ``ig-<policy version>``).
- :func:`prm_steps`: a process reward model's score of each step prefix → ``step_rewards``
  (source ``prm-<version>``).
- :func:`critic_values`: a critic's V(s_t) for every completion token → ``token_scores.value``
  (version ``value-<version>``), the values GAE reads.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pandas as pd

from studio import queries
from studio.queries.credit import PRM_PREFIX, VALUE_PREFIX, steps_of
from studio.signals.steps import Segmenter
from studio.store import Store
from studio.tasks import get_task, seen_prompt


def answer_text(task: str, gold: dict, prefix: str = "") -> str:
    """What the policy writes to give the gold answer right after ``prefix``, in the task's own
    format (``A:72`` for the sample task, ``\\boxed{72}`` for a word problem); inside an open
    ``<think>`` block the block is closed first, as the policy would."""
    text = get_task(task).answer_text(str(gold.get("answer", "")))
    return f"</think>\n{text}" if "<think>" in prefix and "</think>" not in prefix else text


async def information_gain(store: Store, policy_path: str | Path, rollout_ids: list[str],
                           seg: Segmenter = Segmenter()) -> str:  # noqa: B008  (a frozen dataclass)
    """IGPO step rewards: IG_k = P(gold | prefix through step k) - P(gold | through k-1),
    with P(gold | prefix) teacher-forced by the policy itself: the probability that the
    policy writes the gold answer right after the prefix (and, after step k, the step's
    delimiter). Stored in ``step_rewards`` under ``ig-<policy version>``; returns that id.
    Rollouts it already covers are skipped.
    """
    from studio import workers

    rows = store.df("""SELECT ro.rollout_id, ro.text, ro.prompt_text, p.text AS prompt, p.messages, p.gold, p.task
                       FROM rollouts ro JOIN prompts p USING (prompt_id) WHERE list_contains(?, ro.rollout_id)""",
                    [rollout_ids])
    rows["prompt"] = [seen_prompt(*x) for x in zip(rows["prompt_text"], rows["prompt"], rows["messages"], strict=True)]
    jobs = []
    for r in rows.itertuples(index=False):
        steps = steps_of(store, r.rollout_id, seg)
        gold = queries.prompt_of_row({"prompt": r.prompt, "gold": r.gold}).gold
        # a task's step is followed by its separator: ';' in the sample task, a line break in free text
        sep = (";" if r.task == "arithmetic" else "\n") if seg.kind == "task" else \
            seg.pattern if seg.kind == "delimiter" else ""
        prefixes = [""] + [r.text[:e] + sep for e in steps["char_end"]]
        jobs.append((r.rollout_id, steps, r.prompt, prefixes, [answer_text(r.task, gold, x) for x in prefixes]))
    ex = workers.pool()
    loop = asyncio.get_running_loop()
    flat_prompts = [j[2] for j in jobs for _ in j[3]]
    flat_prefix = [p for j in jobs for p in j[3]]
    flat_answer = [a for j in jobs for a in j[4]]
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
        for k, (a, b) in enumerate(zip(steps["start_pos"], steps["end_pos"], strict=False)):
            out.append((rid, k, int(a), int(b), source, float(p[k + 1] - p[k])))
    if out:
        store.write({"step_rewards": pd.DataFrame(out, columns=["rollout_id", "step_idx", "start_pos", "end_pos",
                                                                 "source", "value"])})
    return source


async def turn_information_gain(store: Store, policy_path: str | Path, rollout_ids: list[str]) -> str:
    """IGPO per turn (Wang et al. 2025, "Information Gain-based Policy Optimization"): each
    assistant turn k of a trajectory gets IG_k = P(gold | prompt, turns through k) − P(gold |
    through the turn before), P teacher-forced with the policy itself: the probability that it
    writes the gold answer right after the trajectory's stored tokens (its token ids as they
    are, so a tool response reads exactly as the policy saw it).

    "Through turn k" takes in what the turn's tool call brought back: the prefix ends where the
    next assistant turn starts (the information a call buys is the call's credit). The first
    turn is measured against the prompt alone. The answer turn (the last turn of a trajectory
    that stopped, with a verdict) has P = 1 when the answer is right and 0 when it is wrong (the
    trajectory has committed to it; IGPO gives the last turn the outcome), so a trajectory's
    turn values sum to 1[correct] − P(gold | prompt). Stored in ``turn_rewards`` under
    ``ig-<policy version>``; returns that id. Rollouts it already covers, and rollouts without
    token ids, are skipped; a rollout without stored turns is one assistant turn. A policy whose
    tokenizer reads the stored ids as another text is refused (``workers.TokenizerMismatch``).
    """
    from studio import workers
    from studio.queries.reads import tokens_of
    from studio.queries.turns import turns_of

    rows = store.df("""SELECT ro.rollout_id, ro.prompt_text, p.text AS prompt, p.messages, p.gold, p.task, ro.correct,
                              ro.finish_reason
                       FROM rollouts ro JOIN prompts p USING (prompt_id) WHERE list_contains(?, ro.rollout_id)
                       ORDER BY ro.rollout_id""", [rollout_ids])
    toks = tokens_of(store, rows["rollout_id"].tolist())
    turns = {r: g.reset_index(drop=True) for r, g in turns_of(store, rows["rollout_id"].tolist()).groupby("rollout_id")}
    jobs = []  # (rollout id, assistant turn indices, prompt, prefixes to teacher-force, the answer turn's P or None)
    for r in rows.itertuples(index=False):
        t = toks.get(r.rollout_id)
        if t is None or t["token_id"].isna().any() or r.rollout_id not in turns:
            continue
        ids = [int(i) for i in t["token_id"]]
        texts = ["" if x is None or x != x else x for x in t["token_text"].to_numpy(dtype=object)]
        tr = turns[r.rollout_id]
        acting = tr.index[tr["role"] == "assistant"].tolist()
        if not acting:
            continue
        # the answer turn: the trajectory's last turn, written by the policy, in a trajectory that stopped
        answered = (acting[-1] == len(tr) - 1 and r.finish_reason in ("stop", None) and r.correct is not None
                    and r.correct == r.correct)
        cuts = [0] + [int(tr["start_pos"][nxt]) if nxt is not None else len(ids)
                      for nxt in (next((j for j in acting if j > i), None) for i in acting)]
        if answered:
            cuts = cuts[:-1]
        gold = queries.prompt_of_row({"prompt": r.prompt, "gold": r.gold}).gold
        prompt = seen_prompt(r.prompt_text, r.prompt, r.messages)
        read = ["".join(texts[:c]) for c in cuts]
        final = (1.0 if bool(r.correct) else 0.0) if answered else None
        jobs.append((r.rollout_id, [int(tr["turn_idx"][i]) for i in acting], prompt,
                     [ids[:c] for c in cuts], [answer_text(r.task, gold, x) for x in read], final, read))
    if not jobs:
        raise ValueError("no trajectory to measure: these rollouts have no token ids (enrich them first)")
    ex = workers.pool()
    loop = asyncio.get_running_loop()
    flat = [(j[2], pre, ans, text) for j in jobs for pre, ans, text in zip(j[3], j[4], j[6], strict=True)]
    probs, version = await loop.run_in_executor(None, lambda: ex.submit(
        workers.answer_prob_job, str(policy_path), [f[0] for f in flat], [f[1] for f in flat],
        [f[2] for f in flat], prefix_texts=[f[3] for f in flat]).result())
    source = f"ig-{version}"
    done = set(store.df("SELECT DISTINCT rollout_id FROM turn_rewards WHERE source = ?", [source])["rollout_id"])
    out, i = [], 0
    for rid, turn_idx, _, prefixes, _, final, _ in jobs:
        p = list(probs[i:i + len(prefixes)]) + ([final] if final is not None else [])
        i += len(prefixes)
        if rid not in done:
            out.extend((rid, k, source, float(p[n + 1] - p[n])) for n, k in enumerate(turn_idx))
    if out:
        store.write({"turn_rewards": pd.DataFrame(out, columns=["rollout_id", "turn_idx", "source", "value"])})
    return source


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


async def prm_steps(store: Store, prm_path: str | Path, rollout_ids: list[str],
                    seg: Segmenter = Segmenter(),  # noqa: B008  (a frozen dataclass)
                    batch: int = 512) -> str:
    """Score every step of the rollouts with a process reward model: the PRM's P(step k is
    correct) on the prompt plus the completion through step k (``backends.process_models``),
    in a worker. Stored in ``step_rewards`` under ``prm-<folder@weights hash>``; returns
    that id. Rollouts it already covers are skipped."""
    from studio import workers

    folder = Path(prm_path).expanduser().resolve()
    source = PRM_PREFIX + _model_version(folder, "process reward model")
    todo = _todo(store, "step_rewards", "source", source, rollout_ids)
    for lo in range(0, len(todo), batch):
        rows = store.df("""SELECT ro.rollout_id, ro.text, coalesce(ro.prompt_text, p.text) AS prompt FROM rollouts ro JOIN prompts p
                           USING (prompt_id) WHERE list_contains(?, ro.rollout_id)""", [todo[lo:lo + batch]])
        steps = [steps_of(store, r, seg) for r in rows["rollout_id"]]
        fut = workers.pool().submit(workers.prm_job, str(folder), rows["prompt"].tolist(), rows["text"].tolist(),
                                    [[int(e) for e in st["char_end"]] for st in steps])
        scores, _ = await asyncio.wrap_future(fut)
        out = [(rid, k, int(a), int(b), source, float(v))
               for rid, st, sc in zip(rows["rollout_id"], steps, scores, strict=False)
               for k, (a, b, v) in enumerate(zip(st["start_pos"], st["end_pos"], sc, strict=False))]
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
    from studio import workers

    folder = Path(value_path).expanduser().resolve()
    version = VALUE_PREFIX + _model_version(folder, "value model")
    todo = _todo(store, "token_scores", "policy_version", version, rollout_ids)
    for lo in range(0, len(todo), batch):
        rows = store.df("""SELECT ro.rollout_id, ro.text, coalesce(ro.prompt_text, p.text) AS prompt, list(t.token_id ORDER BY t.pos) AS ids
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
