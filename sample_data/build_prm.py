"""Rebuild the sample process reward model (PRM): ``python -m sample_data.build_prm``.

A GPT-2-style sequence classifier (2 layers, 64 wide, one output logit, 0.1M parameters,
0.45 MB) with the sample policy's character tokenizer that scores one step of an
arithmetic completion. Its input is the prompt and the completion up to the end of step
k, without the ``;`` that follows (``Q: 23+48-7=23+48=71;71-7=64`` scores ``71-7=64``);
its label is the task's verdict on that step (``a op b = c`` computed right; a malformed
step counts as not right); its score is ``sigmoid(logit)`` = P(step k is correct)
(``backends.process_models``).

Training steps come from two sources, 3:1 in each batch (``--synthetic``):
- the sample policy's own completions, sampled here (seeded, temperature 1.0, 2 per
  prompt on 1,024 prompts the shipped rollouts never use): every parsed step is an
  example, so the PRM learns the mistakes the policy really makes (mostly carries and
  borrows off by 10, later steps, negative numbers);
- synthetic completions (:func:`synthetic_completion`): reference solutions where each
  step slips with the policy-like risk of :func:`sample_data.build_reward_model.slip_risk`
  (times ``SLIP_SCALE``), the slip usually carried on. An endless stream that keeps the
  model from memorising the few thousand policy steps (trained on those alone, it scored
  AUC 0.71 on the test steps below; with the mix 0.76-0.77).
Each training text is a whole rollout through its last step: the model is causal, so its
state at the last token of step k is exactly the one it computes for the PRM input of
step k, and one pass trains every step's score. Loss: binary cross-entropy on the logit
at each step's end, plus next-token prediction on the text of correct steps (through the
tied embeddings; only the classifier is saved).

The checkpoint (every 100 of 600 steps) with the best AUC on validation steps (one policy
sample on each of 600 other prompts, sampling seed 30,000) is saved; the steps of the
shipped sample rollouts (``make_rollouts``: other prompts, sampling seed 1) are the test
set, reported at the end and not used to pick anything. The shipped PRM: test AUC 0.770,
accuracy 0.693 (66% of those steps are right), validation AUC 0.769; about 1.5 minutes on
an idle 2-core CPU (8 s of it sampling). Like the reward model it learns where the policy
tends to slip (a logistic regression on hand-made features such as step index, carry and
sign reaches about the same AUC) well before it learns to check a sum, which this budget
does not reach.
Everything is seeded and runs on the CPU, so the same machine rebuilds the same weights.
``prm/training_log.json`` records the run.
"""
from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from studio.tasks import get_task
from studio.tasks.base import Prompt, Step

from . import POLICY_DIR, PRM_DIR, ROLLOUTS_DIR
from .build_policy import MIX, build_tokenizer
from .build_reward_model import (
    _perturb,
    _render,
    encode,
    sample_rollout_prompts,
    slip_risk,
)

SLIP_SCALE = 1.5  # the policy slips more often than the reward model's corruption assumes
P_CARRY_ON = 0.85  # a slipped result is usually carried into the next step
P_OPERAND_COPY = 0.05  # an operand miscopied, computed right from there (a correct step)


# --- the policy's own rollouts (shared with build_value_model) ---------------------------------------------

@dataclass
class Rollout:
    """One completion of the sample policy and the rule's verdicts."""

    prompt: Prompt
    text: str
    ids: list[int]  # completion token ids, the end token included when it was sampled
    correct: bool  # final answer right
    steps: tuple[Step, ...]


def draw_prompts(task, n: int, seed: int, exclude: set[str]) -> list[Prompt]:
    """``n`` distinct prompts of the policy's training mix, none of them in ``exclude``."""
    rng = random.Random(seed)
    out, seen = [], set(exclude)
    while len(out) < n:
        diff = rng.choices([d for d, _ in MIX], weights=[w for _, w in MIX])[0]
        p = task.make_prompts(1, seed=rng.getrandbits(62), difficulty=diff)[0]
        if p.text not in seen:
            seen.add(p.text)
            out.append(p)
    return out


def sample_rollouts(task, prompts: list[Prompt], group: int, seed: int, policy_dir: Path = POLICY_DIR,
                    chunk: int = 128, max_new_tokens: int = 40) -> list[Rollout]:
    """``group`` temperature-1.0 samples of the policy (on the CPU) per prompt, prompt-major.

    Prompts are sampled in chunks of equal step count, so short problems do not wait for
    long ones; each chunk has its own seed.
    """
    from backends.policy import load_policy

    policy = load_policy(policy_dir, device="cpu")
    order = sorted(range(len(prompts)), key=lambda i: (prompts[i].meta["n_steps"], i))
    out: dict[int, list[Rollout]] = {}
    for c, lo in enumerate(range(0, len(order), chunk)):
        idx = order[lo:lo + chunk]
        gens = policy.sample([prompts[i].text for i in idx], n=group, temperature=1.0, top_p=1.0,
                             max_new_tokens=max_new_tokens, seed=seed * 10_000 + c, top_k_stats=1)
        for g in gens:
            p = prompts[idx[g.prompt_index]]
            parsed = task.parse_completion(p, g.text)
            out.setdefault(idx[g.prompt_index], []).append(Rollout(
                p, g.text, [int(x) for x in g.token_ids], bool(task.is_correct(p, parsed.answer)), parsed.steps))
    return [r for i in range(len(prompts)) for r in out[i]]


def shipped_rollouts(task, folder: Path = ROLLOUTS_DIR) -> list[Rollout]:
    """The shipped sample rollouts (``make_rollouts``) with their token ids, in file order."""
    import pandas as pd

    prompts = pd.read_parquet(folder / "prompts.parquet").set_index("prompt_id")["text"]
    rolls = pd.read_parquet(folder / "rollouts.parquet")
    toks = pd.read_parquet(folder / "tokens.parquet", columns=["rollout_id", "pos", "token_id"])
    ids = toks.sort_values(["rollout_id", "pos"]).groupby("rollout_id")["token_id"].apply(list)
    out = []
    for r in rolls.itertuples():
        p = task.parse_prompt(prompts[r.prompt_id])
        parsed = task.parse_completion(p, r.text)
        out.append(Rollout(p, r.text, [int(x) for x in ids.get(r.rollout_id, [])],
                           bool(task.is_correct(p, parsed.answer)), parsed.steps))
    return out


# --- step examples -----------------------------------------------------------------------------------------

def step_examples(rollouts: list[Rollout]) -> list[tuple[str, float]]:
    """``(prompt + completion[:end of step k], verdict)`` for every step: the PRM's inputs."""
    return [(r.prompt.text + r.text[:s.end], float(bool(s.correct))) for r in rollouts for s in r.steps]


def training_row(r: Rollout) -> tuple[str, list[tuple[int, float]], list[tuple[int, int]]]:
    """One rollout as ``(text, [(position, verdict)] per step, token spans of correct steps)``.

    The model is causal, so its hidden state at the last token of step k is exactly the one
    it computes for the input ``prompt + completion[:end of step k]``: one pass over the text
    through the last step trains every step's score at once. Text offsets are token offsets
    (the character tokenizer). The spans mark where the next-token loss applies.
    """
    P = len(r.prompt.text)
    end = r.steps[-1].end if r.steps else 0
    labels = [(P + s.end - 1, float(bool(s.correct))) for s in r.steps]
    good = [(P + s.start, P + s.end) for s in r.steps if s.correct]
    return r.prompt.text + r.text[:end], labels, good


def synthetic_completion(rng: random.Random, operands: list[int], ops: list[str]) -> str:
    """A policy-like attempt: each step may slip (a perturbed result), usually carried on."""
    steps, acc = [], operands[0]
    for i, (op, b) in enumerate(zip(ops, operands[1:])):
        a = acc
        if rng.random() < P_OPERAND_COPY:
            a = _perturb(rng, a)
        r = a + b if op == "+" else a - b
        true = r
        if rng.random() < min(0.9, SLIP_SCALE * slip_risk(a, op, b, r, i)):
            r = _perturb(rng, r)
        steps.append((a, op, b, r))
        acc = r if rng.random() < P_CARRY_ON else true
    return _render(steps, acc)


def synthetic_rollouts(rng: random.Random, task, n: int, exclude: set[str]) -> list[Rollout]:
    out = []
    while len(out) < n:
        diff = rng.choices([d for d, _ in MIX], weights=[w for _, w in MIX])[0]
        p = task.make_prompts(1, seed=rng.getrandbits(62), difficulty=diff)[0]
        if p.text in exclude:
            continue
        comp = synthetic_completion(rng, p.meta["operands"], p.meta["ops"])
        parsed = task.parse_completion(p, comp)
        out.append(Rollout(p, comp, [], bool(task.is_correct(p, parsed.answer)), parsed.steps))
    return out


def training_batch(tokenizer, rows):
    """``(ids [B, T], attn [B, T], label positions [N, 2], labels [N], lm_mask [B, T-1])``."""
    ids, attn = encode(tokenizer, [t for t, _, _ in rows])
    lm_mask = torch.zeros(ids.shape[0], ids.shape[1] - 1)
    where, labels = [], []
    for b, (_, lab, spans) in enumerate(rows):
        for pos, y in lab:
            where.append((b, pos))
            labels.append(y)
        for s, e in spans:  # position j-1 predicts token j
            lm_mask[b, s - 1:e - 1] = 1.0
    return ids, attn, torch.tensor(where), torch.tensor(labels), lm_mask


def auc(scores: list[float], labels: list[float]) -> float:
    """Area under the ROC curve (ties count half)."""
    pos = [s for s, y in zip(scores, labels) if y >= 0.5]
    neg = [s for s, y in zip(scores, labels) if y < 0.5]
    if not pos or not neg:
        return float("nan")
    ranked = sorted([(s, 1) for s in pos] + [(s, 0) for s in neg])
    # rank-sum with average ranks for ties
    rank_sum, i = 0.0, 0
    while i < len(ranked):
        j = i
        while j < len(ranked) and ranked[j][0] == ranked[i][0]:
            j += 1
        avg = (i + j + 1) / 2
        rank_sum += avg * sum(1 for k in range(i, j) if ranked[k][1])
        i = j
    return (rank_sum - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg))


@torch.no_grad()
def evaluate(model, tokenizer, data, batch: int = 256) -> dict[str, float]:
    """AUC and accuracy of ``logit >= 0`` against the step verdicts of ``data``."""
    model.eval()
    scores = []
    for lo in range(0, len(data), batch):
        ids, attn = encode(tokenizer, [t for t, _ in data[lo:lo + batch]])
        scores += model(input_ids=ids, attention_mask=attn).logits[:, 0].tolist()
    labels = [y for _, y in data]
    acc = sum((z >= 0) == (y >= 0.5) for z, y in zip(scores, labels)) / len(labels)
    return {"auc": round(auc(scores, labels), 4), "acc": round(acc, 4), "n": len(labels),
            "positive_share": round(sum(labels) / len(labels), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=PRM_DIR)
    ap.add_argument("--policy", type=Path, default=POLICY_DIR)
    ap.add_argument("--prompts", type=int, default=1024, help="training prompts the policy is sampled on")
    ap.add_argument("--group", type=int, default=2, help="policy samples per training prompt")
    ap.add_argument("--val-prompts", type=int, default=600, help="validation prompts (one policy sample each)")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--synthetic", type=float, default=0.25, help="share of each batch from synthetic completions")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--aux-lm", type=float, default=1.0, help="weight of next-token prediction on correct steps")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from transformers import GPT2Config, GPT2ForSequenceClassification

    torch.manual_seed(args.seed)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    t0 = time.time()
    task = get_task("arithmetic")
    test = step_examples(shipped_rollouts(task))
    exclude = sample_rollout_prompts(task)
    val_prompts = draw_prompts(task, args.val_prompts, seed=30_000 + args.seed, exclude=exclude)
    val = step_examples(sample_rollouts(task, val_prompts, 1, seed=30_000 + args.seed, policy_dir=args.policy))
    exclude |= {p.text for p in val_prompts}
    prompts = draw_prompts(task, args.prompts, seed=args.seed, exclude=exclude)
    rollouts = sample_rollouts(task, prompts, args.group, seed=args.seed, policy_dir=args.policy)
    policy_steps = step_examples(rollouts)
    policy_rows = [training_row(r) for r in rollouts if r.steps]
    sample_s = time.time() - t0
    print(f"sampled {len(rollouts)} training rollouts, {len(policy_steps)} steps "
          f"({sum(y for _, y in policy_steps) / len(policy_steps):.2f} correct), {len(val)} validation steps, "
          f"in {sample_s:.0f} s", flush=True)

    tokenizer = build_tokenizer()
    tokenizer.padding_side = "right"  # GPT-2 numbers positions from the first token: pad after the text
    config = GPT2Config(
        vocab_size=len(tokenizer), n_positions=96, n_embd=args.width, n_layer=args.layers, n_head=args.heads,
        num_labels=1, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )
    model = GPT2ForSequenceClassification(config)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    rng = random.Random(args.seed)
    n_syn = round(args.batch * args.synthetic)
    log, run, best = [], {}, (-1.0, 0, None)
    t1 = time.time()
    for step in range(1, args.steps + 1):
        lr = args.lr * min(1.0, step / 100) * (0.1 + 0.9 * (1 - step / args.steps))  # warm up, then decay
        for g in opt.param_groups:
            g["lr"] = lr
        rows = [policy_rows[rng.randrange(len(policy_rows))] for _ in range(args.batch - n_syn)]
        rows += [training_row(r) for r in synthetic_rollouts(rng, task, n_syn, exclude)]
        ids, attn, where, labels, lm_mask = training_batch(tokenizer, rows)
        model.train()
        hidden = model.transformer(input_ids=ids, attention_mask=attn).last_hidden_state  # [B, T, H]
        logits = model.score(hidden[where[:, 0], where[:, 1]])[:, 0]  # [N]: each step's end, as the saved model reads it
        cls_loss = bce(logits, labels)
        lm_logits = hidden[:, :-1] @ model.transformer.wte.weight.T  # [B, T-1, V]: the tied embeddings as LM head
        nll = torch.nn.functional.cross_entropy(lm_logits.transpose(1, 2), ids[:, 1:], reduction="none")
        lm_loss = (nll * lm_mask).sum() / lm_mask.sum().clamp(min=1)
        loss = cls_loss + args.aux_lm * lm_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        for k, v in (("bce", cls_loss.item()), ("lm", lm_loss.item())):  # smoothed for the log
            run[k] = v if k not in run else 0.95 * run[k] + 0.05 * v
        if step % args.eval_every == 0 or step == args.steps:
            m = evaluate(model, tokenizer, val)
            log.append({"step": step, "bce": round(run["bce"], 4), "lm_loss": round(run["lm"], 4),
                        "val_auc": m["auc"], "val_acc": m["acc"], "elapsed_s": round(time.time() - t0, 1)})
            print(json.dumps(log[-1]), flush=True)
            if m["auc"] > best[0]:
                best = (m["auc"], step, {k: v.clone() for k, v in model.state_dict().items()})

    model.load_state_dict(best[2])  # the checkpoint with the best validation AUC
    model.eval()
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    tokenizer.save_pretrained(args.out)
    metrics = {"test": evaluate(model, tokenizer, test), "validation": evaluate(model, tokenizer, val),
               "train_policy_steps": evaluate(model, tokenizer, policy_steps),
               "synthetic": evaluate(model, tokenizer, step_examples(
                   synthetic_rollouts(random.Random(20_000 + args.seed), task, 400, exclude)))}
    card = {"task": "arithmetic",
            "model": "GPT2ForSequenceClassification, 1 logit; score = sigmoid(logit) = P(step k correct)",
            "input": "prompt text + completion[:end of step k] (no trailing ';')",
            "label": "1 if step k's arithmetic is right (task verdict; a malformed step is 0)",
            "metrics": metrics, "metric_sets": {
                "test": "steps of the shipped sample rollouts (sample_data/rollouts; 64 prompts x 8, sampling seed 1)",
                "validation": f"steps of one policy sample on each of {len(val_prompts)} other prompts "
                              "(picks the checkpoint)",
                "train_policy_steps": "the policy steps trained on",
                "synthetic": "steps of 400 synthetic completions on other prompts"},
            "saved_step": best[1], "policy_rollouts": len(rollouts), "policy_steps": len(policy_steps),
            "sample_seconds": round(sample_s, 1), "train_seconds": round(time.time() - t1, 1),
            "build_seconds": round(time.time() - t0, 1), "params": sum(p.numel() for p in model.parameters()),
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "synthetic": {"slip_scale": SLIP_SCALE, "p_carry_on": P_CARRY_ON, "p_operand_copy": P_OPERAND_COPY},
            "log": log}
    (args.out / "training_log.json").write_text(json.dumps(card, indent=1))
    t = metrics["test"]
    print(f"saved {args.out} (step {best[1]}): test AUC {t['auc']:.3f}, accuracy {t['acc']:.3f}; "
          f"validation AUC {best[0]:.3f}; {card['build_seconds']} s")


if __name__ == "__main__":
    main()
