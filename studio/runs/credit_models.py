"""Step credit computed by a model in the worker: information gain, PRM step scores, critic values.

- :func:`information_gain` (IGPO): the change in P(gold answer) step by step, teacher-forced
  with the policy → ``step_rewards`` (source ``ig-<policy version>``).
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
