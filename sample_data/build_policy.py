"""Rebuild the sample policy from scratch: ``python -m sample_data.build_policy``.

A GPT-2-style causal LM (4 layers, 128 wide, ~0.8M parameters) with a character-level
tokenizer, trained on the arithmetic task's reference solutions. Training stops at the
first evaluation whose final-answer accuracy at temperature 1.0 on held-out prompts
reaches ``--target`` (default 0.6), so the policy is competent but still makes real
mistakes at carries and signs: room for RL. Everything is seeded, so the same machine
rebuilds the same weights. The shipped policy stopped after 2,200 steps (0.3-0.5 s each
on a 2-core CPU: 12-20 minutes alone; 30 minutes measured while other jobs shared the
cores); ``policy/training_log.json`` records the run.
"""
from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

from studio.tasks import get_task

from . import POLICY_DIR

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARS = [chr(c) for c in range(32, 127)]  # printable ASCII, one token each
MIX = [("easy", 0.3), ("medium", 0.4), ("hard", 0.3)]


def build_tokenizer():
    """A character-level fast tokenizer that transformers saves and loads as usual."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("(?m)."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
        unk_token="<unk>", model_max_length=96, padding_side="left",
    )


def heldout_prompts(n: int = 300):
    return get_task("arithmetic").make_prompts(n, seed=10_000, difficulty="medium")


def training_batch(rng: random.Random, task, tokenizer, batch: int, exclude: set[str]):
    """Prompt+solution sequences, loss on the completion and the end token only."""
    seqs, masks = [], []
    while len(seqs) < batch:
        diff = rng.choices([d for d, _ in MIX], weights=[w for _, w in MIX])[0]
        p = task.make_prompts(1, seed=rng.getrandbits(62), difficulty=diff)[0]
        if p.text in exclude:
            continue
        prompt_ids = tokenizer(p.text, add_special_tokens=False)["input_ids"]
        comp_ids = tokenizer(p.gold["solution"], add_special_tokens=False)["input_ids"]
        ids = prompt_ids + comp_ids + [tokenizer.eos_token_id]
        seqs.append(ids)
        masks.append([0] * len(prompt_ids) + [1] * (len(comp_ids) + 1))
    width = max(map(len, seqs))
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs])  # [B, T]
    loss_mask = torch.tensor([m + [0] * (width - len(m)) for m in masks])  # [B, T]
    attn = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    return input_ids, attn, loss_mask


@torch.no_grad()
def evaluate(model, tokenizer, prompts, seed: int = 0) -> float:
    """Final-answer accuracy of one temperature-1.0 sample per prompt."""
    from backends.policy import sample_batch

    task = get_task("arithmetic")
    gens = sample_batch(model, tokenizer, [p.text for p in prompts], n=1, temperature=1.0,
                        top_p=1.0, max_new_tokens=40, seed=seed, top_k_stats=1)
    ok = sum(task.is_correct(p, task.parse_completion(p, g.text).answer) for p, g in zip(prompts, gens))
    return ok / len(prompts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=POLICY_DIR)
    ap.add_argument("--target", type=float, default=0.6, help="stop once held-out accuracy reaches this")
    ap.add_argument("--max-steps", type=int, default=8000)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(args.seed)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    tokenizer = build_tokenizer()
    config = GPT2Config(
        vocab_size=len(tokenizer), n_positions=96, n_embd=128, n_layer=4, n_head=4,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )
    model = GPT2LMHeadModel(config)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01, betas=(0.9, 0.98))
    task = get_task("arithmetic")
    heldout = heldout_prompts()
    exclude = {p.text for p in heldout}
    rng = random.Random(args.seed)
    log = []
    t0 = time.time()
    acc = 0.0
    for step in range(1, args.max_steps + 1):
        lr = 2e-3 * min(1.0, step / 200)
        for g in opt.param_groups:
            g["lr"] = lr
        input_ids, attn, loss_mask = training_batch(rng, task, tokenizer, args.batch, exclude)
        model.train()
        logits = model(input_ids=input_ids, attention_mask=attn).logits[:, :-1]  # [B, T-1, V]
        target = input_ids[:, 1:]
        mask = loss_mask[:, 1:].float()
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, reduction="none")
        loss = (nll * mask).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.eval_every == 0:
            model.eval()
            acc = evaluate(model, tokenizer, heldout, seed=step)
            log.append({"step": step, "loss": round(loss.item(), 4), "heldout_acc_t1": acc,
                        "elapsed_s": round(time.time() - t0, 1)})
            print(json.dumps(log[-1]), flush=True)
            if acc >= args.target:
                break

    model.eval()
    model.generation_config.do_sample = True
    model.generation_config.temperature = 1.0
    model.generation_config.top_k = 0
    model.generation_config.max_new_tokens = 40
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    tokenizer.save_pretrained(args.out)
    card = {"task": "arithmetic", "steps": step, "heldout_acc_t1": acc, "train_seconds": round(time.time() - t0, 1),
            "params": sum(p.numel() for p in model.parameters()), "log": log}
    (args.out / "training_log.json").write_text(json.dumps(card, indent=1))
    print(f"saved {args.out} after {step} steps, held-out accuracy {acc:.2f}, {card['train_seconds']} s")


if __name__ == "__main__":
    main()
