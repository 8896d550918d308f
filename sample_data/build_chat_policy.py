"""Rebuild the sample chat policy from scratch: ``python -m sample_data.build_chat_policy``.

A tiny Qwen2 causal LM (4 layers, 160 wide, ~1.4M parameters) with a byte-level BPE
tokenizer trained here on the word-problem corpus (``sample_data.wordproblems``; every
digit is its own token) and a ChatML chat template in Qwen3's style. It learns to answer
a user's word problem with ``<think>`` one equation per line ``</think>`` then
``\\boxed{n}``, loss on the completion only. Training stops at the first evaluation whose
final-answer accuracy at temperature 1.0 on held-out (test split) prompts reaches
``--target``, so the policy is competent but still slips (a wrong product, a wrong
operation): room for RL. Everything is seeded, so the same machine rebuilds the same
weights. ``chat_policy/training_log.json`` records the run (steps, seconds, accuracy curve).

The shipped policy stopped after 2,000 steps at 53% (150 prompts; 55% on all 300 test
prompts through ``backends.policy``): 2,070 s on this project's 2-core CPU while other jobs
shared the cores (0.5-3 s a step); 0.38 s a step with 2 threads on an idle host, so about
14 minutes alone. Accuracy climbs late (1% at step 600, 26% at 1,300, 40% at 1,500).
"""
from __future__ import annotations

import argparse
import json
import platform
import random
import re
import time
from pathlib import Path

import torch

from .wordproblems import make_problem, make_splits

HERE = Path(__file__).resolve().parent
CHAT_POLICY_DIR = HERE / "chat_policy"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
THINK = ["<think>", "</think>"]  # added but not special (as in Qwen3): decoded text keeps them
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)
BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def build_tokenizer(corpus: list[str], vocab_size: int = 800):
    """Byte-level BPE trained on ``corpus``, digits kept apart, wrapped for transformers."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"], padding_side="left", model_max_length=512,
        chat_template=CHAT_TEMPLATE,
    )


def prompt_text(tokenizer, question: str) -> str:
    """The chat prompt of one user question, ready for the assistant's turn."""
    return tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                         add_generation_prompt=True)


def training_batch(rng: random.Random, tokenizer, batch: int, exclude: set[str]):
    """Fresh prompt+completion sequences, loss on the completion and ``<|im_end|>`` only."""
    seqs, masks = [], []
    while len(seqs) < batch:
        p = make_problem(rng)
        if p["question"] in exclude:
            continue
        prompt_ids = tokenizer(prompt_text(tokenizer, p["question"]))["input_ids"]
        comp_ids = tokenizer(p["completion"])["input_ids"] + [tokenizer.eos_token_id]
        seqs.append(prompt_ids + comp_ids)
        masks.append([0] * len(prompt_ids) + [1] * len(comp_ids))
    width = max(map(len, seqs))
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs])  # [B, T]
    loss_mask = torch.tensor([m + [0] * (width - len(m)) for m in masks])  # [B, T]
    attn = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])  # [B, T]
    return input_ids, attn, loss_mask


def boxed_answer(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text``, if any."""
    found = BOXED.findall(text)
    return found[-1].strip() if found else None


@torch.no_grad()
def evaluate(model, tokenizer, problems: list[dict], seed: int = 0) -> float:
    """Final-answer accuracy of one temperature-1.0 sample per problem."""
    from backends.policy import sample_batch

    prompts = [prompt_text(tokenizer, p["question"]) for p in problems]
    gens = sample_batch(model, tokenizer, prompts, n=1, temperature=1.0, top_p=1.0, max_new_tokens=96,
                        seed=seed, top_k_stats=1)
    return sum(boxed_answer(g.text) == str(p["final"]) for p, g in zip(problems, gens)) / len(problems)


def build_model(tokenizer):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=160, intermediate_size=512, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True,
        rope_theta=10_000.0, bos_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, attention_dropout=0.0,
    )
    return Qwen2ForCausalLM(config)


def train_step(model, opt, batch, lr: float) -> float:
    input_ids, attn, loss_mask = batch
    for g in opt.param_groups:
        g["lr"] = lr
    model.train()
    logits = model(input_ids=input_ids, attention_mask=attn).logits[:, :-1]  # [B, T-1, V]
    mask = loss_mask[:, 1:].float()  # [B, T-1]
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), input_ids[:, 1:], reduction="none")
    loss = (nll * mask).sum() / mask.sum()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()


def save(model, tokenizer, out: Path, card: dict, max_new_tokens: int = 96) -> None:
    """The model and tokenizer as a transformers folder (sampling at temperature 1 by default),
    with ``card`` as its ``training_log.json``."""
    model.eval()
    gc = model.generation_config
    gc.do_sample, gc.temperature, gc.top_k, gc.top_p, gc.max_new_tokens = True, 1.0, 0, 1.0, max_new_tokens
    gc.eos_token_id, gc.pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "training_log.json").write_text(json.dumps(card, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=CHAT_POLICY_DIR)
    ap.add_argument("--target", type=float, default=0.5, help="stop once held-out accuracy reaches this")
    ap.add_argument("--max-steps", type=int, default=3000)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-size", type=int, default=150, help="held-out prompts per evaluation")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    train, test = make_splits()
    roles = ["<|im_start|>system", "<|im_start|>user", "<|im_start|>assistant"]
    tokenizer = build_tokenizer(roles + [p[k] for p in train for k in ("question", "answer", "solution")])
    model = build_model(tokenizer)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    heldout = test[:args.eval_size]
    exclude = {p["question"] for p in test}
    rng = random.Random(args.seed)
    log, acc, t0 = [], 0.0, time.time()
    for step in range(1, args.max_steps + 1):
        lr = args.lr * min(1.0, step / 100)
        loss = train_step(model, opt, training_batch(rng, tokenizer, args.batch, exclude), lr)
        if step % args.eval_every == 0:
            model.eval()
            acc = evaluate(model, tokenizer, heldout, seed=step)
            log.append({"step": step, "loss": round(loss, 4), "heldout_acc_t1": acc,
                        "elapsed_s": round(time.time() - t0, 1)})
            print(json.dumps(log[-1]), flush=True)
            if acc >= args.target:
                break
    card = {"task": "wordproblems", "steps": step, "heldout_acc_t1": acc, "heldout_size": len(heldout),
            "train_seconds": round(time.time() - t0, 1), "params": sum(p.numel() for p in model.parameters()),
            "machine": f"{platform.machine()} CPU, torch threads {torch.get_num_threads()}", "log": log}
    save(model, tokenizer, args.out, card)
    print(f"saved {args.out} after {step} steps, held-out accuracy {acc:.2f}, {card['train_seconds']} s")


if __name__ == "__main__":
    main()
