"""Rebuild the sample value model (critic): ``python -m sample_data.build_value_model``.

A GPT-2-style token classifier (2 layers, 64 wide, one output logit per position, 0.1M
parameters, 0.45 MB) with the sample policy's character tokenizer, over the policy's
token ids of ``prompt + completion``. ``sigmoid`` of the logit at position j estimates the
chance that the sample policy's rollout ends with a right final answer, given the tokens
up to and including j. So the value of the state before completion token t, V(s_t), is
read at the last token before it: position ``len(prompt) + t - 1`` (for t = 0 the last
prompt token) (``backends.process_models``).

Training data are the sample policy's own rollouts, sampled here (seeded, temperature
1.0, 4 per prompt on 1,024 prompts the shipped rollouts never use). Loss: binary
cross-entropy at every state the critic is read at (positions ``len(prompt) - 1`` to
``len(prompt) + T - 2`` for a completion of T tokens, the end token included) against the
rollout's final-answer correctness (Monte-Carlo returns, no bootstrapping), plus
next-token prediction on the completions of correct rollouts (through the tied
embeddings; only the classifier is saved), which teaches the format and some arithmetic
faster than the returns alone.

The checkpoint (every 100 of 800 steps) with the lowest loss on validation rollouts (4
samples on each of 256 other prompts, sampling seed 31,000) is saved; the shipped sample
rollouts (``make_rollouts``: 64 other prompts x 8, sampling seed 1) are the test set,
reported at the end and not used to pick anything. The shipped value model, on the test
set: AUC 0.801 of V at the last completion token against correctness, AUC 0.763 of
V(s_0), correlation 0.63 between a prompt's V(s_0) and its solve rate, mean V(s_0) 0.569
against a success rate of 0.568; about 1.5 minutes on an idle 2-core CPU (15 s of it
sampling). Most of what it knows is how hard a prompt is for the policy; it checks little
arithmetic.
Everything is seeded and runs on the CPU, so the same machine rebuilds the same weights.
``value_model/training_log.json`` records the run.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch

from studio.tasks import get_task

from . import POLICY_DIR, VALUE_MODEL_DIR
from .build_policy import build_tokenizer
from .build_prm import Rollout, auc, draw_prompts, sample_rollouts, shipped_rollouts
from .build_reward_model import sample_rollout_prompts


def encode(tokenizer, rollouts: list[Rollout]):
    """``(ids [B, T], attn [B, T], value mask [B, T], returns [B], lm mask [B, T-1])``.

    Right-padded ``prompt ids + completion ids``; the value mask marks the states the
    critic is read at (the last prompt token through the second-to-last completion token).
    """
    seqs, masks, lm = [], [], []
    for r in rollouts:
        p = tokenizer(r.prompt.text)["input_ids"]
        P, T = len(p), len(r.ids)
        seqs.append(p + r.ids)
        masks.append([0] * (P - 1) + [1] * T + [0])
        lm.append([0] * (P - 1) + [int(r.correct)] * T)  # position j predicts token j+1
    width = max(map(len, seqs))
    pad = tokenizer.pad_token_id
    ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs])
    attn = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    vmask = torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.float32)
    lm_mask = torch.tensor([m + [0] * (width - 1 - len(m)) for m in lm], dtype=torch.float32)
    returns = torch.tensor([float(r.correct) for r in rollouts])
    return ids, attn, vmask, returns, lm_mask


@torch.no_grad()
def values(model, tokenizer, rollouts: list[Rollout], batch: int = 128) -> list[list[float]]:
    """V(s_t) for every completion token t of every rollout."""
    model.eval()
    out = []
    for lo in range(0, len(rollouts), batch):
        chunk = rollouts[lo:lo + batch]
        ids, attn, vmask, _, _ = encode(tokenizer, chunk)
        v = torch.sigmoid(model(input_ids=ids, attention_mask=attn).logits[..., 0])  # [B, T]
        out += [v[b][vmask[b] > 0].tolist() for b in range(len(chunk))]
    return out


def pearson(x: list[float], y: list[float]) -> float:
    xt, yt = torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64)
    xt, yt = xt - xt.mean(), yt - yt.mean()
    return float((xt * yt).sum() / (xt.norm() * yt.norm()).clamp(min=1e-12))


def evaluate(model, tokenizer, rollouts: list[Rollout]) -> dict[str, float]:
    """How well V predicts correctness: over all states (the training loss), at the last
    token, at s_0, and per prompt."""
    vs = values(model, tokenizer, rollouts)
    y = [float(r.correct) for r in rollouts]
    eps = 1e-6
    ll = [-(t * math.log(max(v, eps)) + (1 - t) * math.log(max(1 - v, eps))) for vv, t in zip(vs, y) for v in vv]
    last, first = [v[-1] for v in vs], [v[0] for v in vs]
    by_prompt: dict[str, list[tuple[float, float]]] = {}
    for r, v0 in zip(rollouts, first):
        by_prompt.setdefault(r.prompt.text, []).append((v0, float(r.correct)))
    v0s = [sum(a for a, _ in g) / len(g) for g in by_prompt.values()]
    rates = [sum(b for _, b in g) / len(g) for g in by_prompt.values()]
    mse = sum((v - t) ** 2 for v, t in zip(last, y)) / len(y)
    acc = sum((v >= 0.5) == (t > 0.5) for v, t in zip(last, y)) / len(y)
    return {"bce_all_states": round(sum(ll) / len(ll), 4), "auc_last": round(auc(last, y), 4),
            "acc_last": round(acc, 4), "brier_last": round(mse, 4), "auc_s0": round(auc(first, y), 4),
            "prompt_corr_s0_vs_solve_rate": round(pearson(v0s, rates), 4),
            "mean_v_s0": round(sum(first) / len(first), 4), "mean_correct": round(sum(y) / len(y), 4),
            "n": len(y), "prompts": len(v0s)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=VALUE_MODEL_DIR)
    ap.add_argument("--policy", type=Path, default=POLICY_DIR)
    ap.add_argument("--prompts", type=int, default=1024, help="training prompts the policy is sampled on")
    ap.add_argument("--group", type=int, default=4, help="policy samples per training prompt")
    ap.add_argument("--val-prompts", type=int, default=256, help="validation prompts (--group samples each)")
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--aux-lm", type=float, default=1.0, help="weight of next-token prediction on correct rollouts")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from transformers import GPT2Config, GPT2ForTokenClassification

    torch.manual_seed(args.seed)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    t0 = time.time()
    task = get_task("arithmetic")
    test = shipped_rollouts(task)
    exclude = sample_rollout_prompts(task)
    val_prompts = draw_prompts(task, args.val_prompts, seed=31_000 + args.seed, exclude=exclude)
    val = sample_rollouts(task, val_prompts, args.group, seed=31_000 + args.seed, policy_dir=args.policy)
    exclude |= {p.text for p in val_prompts}
    prompts = draw_prompts(task, args.prompts, seed=1_000 + args.seed, exclude=exclude)
    rollouts = sample_rollouts(task, prompts, args.group, seed=1_000 + args.seed, policy_dir=args.policy)
    sample_s = time.time() - t0
    print(f"sampled {len(rollouts)} training rollouts ({sum(r.correct for r in rollouts) / len(rollouts):.2f} "
          f"correct), {len(val)} validation rollouts, in {sample_s:.0f} s", flush=True)

    tokenizer = build_tokenizer()
    tokenizer.padding_side = "right"  # GPT-2 numbers positions from the first token: pad after the text
    config = GPT2Config(
        vocab_size=len(tokenizer), n_positions=96, n_embd=args.width, n_layer=args.layers, n_head=args.heads,
        num_labels=1, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        classifier_dropout=0.0,
    )
    model = GPT2ForTokenClassification(config)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    rng = random.Random(args.seed)
    log, run, best = [], {}, (float("inf"), 0, None)
    t1 = time.time()
    for step in range(1, args.steps + 1):
        lr = args.lr * min(1.0, step / 100) * (0.1 + 0.9 * (1 - step / args.steps))  # warm up, then decay
        for g in opt.param_groups:
            g["lr"] = lr
        batch = [rollouts[rng.randrange(len(rollouts))] for _ in range(args.batch)]
        ids, attn, vmask, returns, lm_mask = encode(tokenizer, batch)
        model.train()
        hidden = model.transformer(input_ids=ids, attention_mask=attn).last_hidden_state  # [B, T, H]
        logits = model.classifier(hidden)[..., 0]  # [B, T], as the saved model computes it
        target = returns[:, None].expand_as(logits)
        v_loss = (bce(logits, target, reduction="none") * vmask).sum() / vmask.sum()
        lm_logits = hidden[:, :-1] @ model.transformer.wte.weight.T  # [B, T-1, V]: the tied embeddings as LM head
        nll = torch.nn.functional.cross_entropy(lm_logits.transpose(1, 2), ids[:, 1:], reduction="none")
        lm_loss = (nll * lm_mask).sum() / lm_mask.sum().clamp(min=1)
        loss = v_loss + args.aux_lm * lm_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        for k, v in (("bce", v_loss.item()), ("lm", lm_loss.item())):  # smoothed for the log
            run[k] = v if k not in run else 0.95 * run[k] + 0.05 * v
        if step % args.eval_every == 0 or step == args.steps:
            m = evaluate(model, tokenizer, val)
            log.append({"step": step, "bce": round(run["bce"], 4), "lm_loss": round(run["lm"], 4),
                        **{f"val_{k}": m[k] for k in ("bce_all_states", "auc_last", "auc_s0",
                                                      "prompt_corr_s0_vs_solve_rate")},
                        "elapsed_s": round(time.time() - t0, 1)})
            print(json.dumps(log[-1]), flush=True)
            if m["bce_all_states"] < best[0]:
                best = (m["bce_all_states"], step, {k: v.clone() for k, v in model.state_dict().items()})

    model.load_state_dict(best[2])  # the checkpoint with the best validation loss
    model.eval()
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    tokenizer.save_pretrained(args.out)
    metrics = {"test": evaluate(model, tokenizer, test), "validation": evaluate(model, tokenizer, val),
               "train": evaluate(model, tokenizer, rollouts)}
    card = {"task": "arithmetic",
            "model": "GPT2ForTokenClassification, 1 logit per position; V(s_t) = sigmoid(logit at len(prompt)+t-1)",
            "input": "the policy's token ids of prompt + completion (right-padded)",
            "target": "1 if the rollout's final answer is right (Monte-Carlo return of the sample policy)",
            "metrics": metrics, "metric_sets": {
                "test": "the shipped sample rollouts (sample_data/rollouts; 64 prompts x 8, sampling seed 1)",
                "validation": f"{len(val)} policy rollouts on {len(val_prompts)} other prompts (picks the checkpoint)",
                "train": "the rollouts trained on"},
            "saved_step": best[1], "policy_rollouts": len(rollouts), "policy_prompts": len(prompts),
            "sample_seconds": round(sample_s, 1), "train_seconds": round(time.time() - t1, 1),
            "build_seconds": round(time.time() - t0, 1), "params": sum(p.numel() for p in model.parameters()),
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, "log": log}
    (args.out / "training_log.json").write_text(json.dumps(card, indent=1))
    t = metrics["test"]
    print(f"saved {args.out} (step {best[1]}): test AUC of V at the last token {t['auc_last']:.3f}, "
          f"of V(s_0) {t['auc_s0']:.3f}, prompt correlation {t['prompt_corr_s0_vs_solve_rate']:.3f}; "
          f"{card['build_seconds']} s")


if __name__ == "__main__":
    main()
