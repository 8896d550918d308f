"""Sampling with per-token statistics: the backend's sampler against ``generate(output_scores=True)``.

Run: ``python benchmarks/bench_sampling.py`` (about 4-6 minutes on a busy 2-core CPU).

What a user must do today to get each sampled token's logprob, the full-distribution
entropy and the top-5 alternatives is call ``model.generate(..., do_sample=True,
output_scores=True, return_dict_in_generate=True)`` and compute the statistics from the
scores it returns. ``backends.policy.sample_batch`` computes them on the fly at every
decoding step and drops the logits. Two ways of doing the ``generate`` side are timed:

* the baseline (``per_step``), the fairest: the statistics computed step by step from
  ``out.scores``, each step's scores dropped once read, so beyond the T x [B, V] scores
  ``generate`` hands back only one step's [B, V] temporaries are ever allocated;
* ``stacked``, a second, labelled figure: every step's scores stacked into one [B, T, V]
  tensor first, then the statistics (what a user writes first; several [B, T, V] copies).

All methods get the same model, the same left-padded batch of prompts, the same seed, and
the same number of new tokens (the end token is disabled, so every row runs to
``max_new_tokens``).

Three cases:
  (a) the sample policy (``sample_data/policy``, a ~0.8M-parameter char-level GPT-2);
  (b) a randomly initialised Llama-style model with a 151,936-token vocabulary (Qwen's
      size), where keeping every step's logits is what costs memory;
  (c) the realistic world's chat policy (``sample_data/chat_policy``, a tiny Qwen2 with a BPE
      tokenizer) on word problems through its chat template: ``sampling_speed_chat_policy``
      (target >= 1.0), skipped with a note when the folder is absent.

Everything runs in subprocesses (this script with the hidden ``--worker`` option). Peak
memory: one fresh process per (case, method), reporting the peak resident-set increase
over the RSS just before one full run (after the model is loaded and its weights paged in).
Time: one process per case runs the methods interleaved (the order rotating) after a short
warm-up, ``--reps`` times each (5x as many for the sub-second sample-policy runs), and
compares medians; it also checks every method's statistics for one sequence against a
teacher-forced forward pass over the same tokens.

Figures: ``sampling_speed_<case>`` and ``sampling_peak_mem_150k_vocab`` against the
per-step ``generate`` baseline; ``sampling_speed_<case>_vs_stacked`` and
``sampling_peak_mem_150k_vocab_vs_stacked`` against the stacked one.

Options: --reps, --batch, --new-tokens (override both cases), --vocab, --hidden, --layers,
--policy (default: the sample policy), --seed, --smoke (a 4,096-token vocabulary, 4 rows x 8
tokens, one repetition, one torch thread, measured in this process instead of fresh ones: seconds).
"""
from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: import the project's packages

from benchmarks import smoke  # noqa: E402
from sample_data import CHAT_POLICY_DIR, POLICY_DIR  # noqa: E402

RESULT_TAG = "@@bench-result "
TOPK = 5
# per-case defaults: (batch, new tokens)
DEFAULTS = {"sample_policy": (64, 40), "150k_vocab": (16, 64), "chat_policy": (32, 96)}
# a sample-policy run takes well under a second, where scheduler noise dominates: repeat it more
REPS_SCALE = {"sample_policy": 5, "150k_vocab": 1, "chat_policy": 2}
METHODS = ("ours", "per_step", "stacked")
LABELS = {"ours": "backend sample_batch (stats on the fly)", "per_step": "generate(output_scores) + per-step stats",
          "stacked": "generate(output_scores) + stacked stats"}
BASELINES = {"per_step": "hf_generate_output_scores_per_step", "stacked": "hf_generate_output_scores_stacked"}


# --------------------------------------------------------------------------------------
# Worker side: measurements on one model, in a fresh process.
# --------------------------------------------------------------------------------------
def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


class PeakRSS:
    """Peak resident memory while the block runs, in MB above the RSS at entry.

    torch allocates outside Python's allocator, so tracemalloc cannot see it: read the
    kernel's figures instead. The high-water mark (VmHWM) is reset at entry where the
    kernel allows it (exact); a thread also samples VmRSS every 5 ms as a fallback.
    """

    def __enter__(self):
        gc.collect()
        self.base_kb = _status_kb("VmRSS")
        try:
            Path("/proc/self/clear_refs").write_text("5")  # "5" resets VmHWM to the current RSS
            self._hwm = True
        except OSError:
            self._hwm = False
        self._peak_kb = self.base_kb
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self):
        while not self._stop.wait(0.005):
            self._peak_kb = max(self._peak_kb, _status_kb("VmRSS"))

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        peak = max(self._peak_kb, _status_kb("VmRSS"))
        if self._hwm:
            peak = max(peak, _status_kb("VmHWM"))
        self.mb = (peak - self.base_kb) / 1024
        return False


class NoEosTokenizer:
    """The real tokenizer, reporting no end token: sampling never stops early, so both
    methods generate exactly ``max_new_tokens`` for every row."""

    eos_token_id = None

    def __init__(self, tok):
        self._tok = tok

    def __call__(self, *args, **kwargs):
        return self._tok(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tok, name)


def bench_prompts(n: int, seed: int) -> list[str]:
    """Arithmetic prompts like the sample task's (``Q: 23+48-7=``), varied in length so the
    batch really is left-padded. Only ids < 99 (printable ASCII), valid in any vocabulary."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        terms = [str(rng.randint(0, 10 ** rng.randint(1, 2) - 1)) for _ in range(rng.randint(2, 4))]
        out.append("Q: " + "".join(t if i == 0 else rng.choice("+-") + t for i, t in enumerate(terms)) + "=")
    return out


def chat_prompts(tok, n: int, seed: int) -> list[str]:
    """Word problems of the realistic sample world through the chat policy's template, as the
    studio gives them to it (``backends.chat.render``)."""
    from backends.chat import render
    from sample_data.wordproblems import make_split

    return [render(tok, {"messages": [{"role": "user", "content": p["question"]}]}) for p in make_split(n, seed)]


def run_ours(model, tok, prompts, new_tokens, seed):
    from backends.policy import sample_batch

    gens = sample_batch(model, tok, prompts, n=1, temperature=1.0, top_p=1.0,
                        max_new_tokens=new_tokens, seed=seed, top_k_stats=TOPK)
    n_tok = sum(g.n_tokens for g in gens)
    per_row = [(g.token_ids.tolist(), g.logprobs, g.entropies, g.topk_logprobs) for g in gens]
    return n_tok, per_row


def _generate(model, tok, prompts, new_tokens, seed):
    """``generate`` with its scores, as a user calls it: (new token ids [B, T], scores: T x [B, V])."""
    import torch

    enc = tok(prompts, return_tensors="pt", padding=True)  # left-padded, like ours
    torch.manual_seed(seed)
    out = model.generate(**enc, do_sample=True, output_scores=True, return_dict_in_generate=True,
                         top_k=0, top_p=1.0, temperature=1.0, max_new_tokens=new_tokens,
                         pad_token_id=tok.pad_token_id)
    return out.sequences[:, enc["input_ids"].shape[1]:], list(out.scores)


def run_per_step(model, tok, prompts, new_tokens, seed):
    """The baseline: the statistics from each step's scores in turn, each step dropped once read."""
    import torch

    new, scores = _generate(model, tok, prompts, new_tokens, seed)  # [B, T], T x [B, V]
    B, T = new.shape
    lp, ent, topv = torch.empty(B, T), torch.empty(B, T), torch.empty(B, T, TOPK)
    with torch.no_grad():
        for t in range(T):
            logp = torch.log_softmax(scores[t].float(), dim=-1)  # [B, V]
            scores[t] = None  # drop the step: only one [B, V] at a time beyond generate's own
            lp[:, t] = logp.gather(-1, new[:, t, None]).squeeze(-1)
            ent[:, t] = -(logp.exp() * logp).sum(-1)
            topv[:, t] = logp.topk(TOPK, dim=-1).values
    per_row = [(new[b].tolist(), lp[b].numpy(), ent[b].numpy(), topv[b].numpy()) for b in range(B)]
    return int(new.numel()), per_row


def run_stacked(model, tok, prompts, new_tokens, seed):
    """The second baseline: every step's scores stacked first, then the statistics."""
    import torch

    new, scores = _generate(model, tok, prompts, new_tokens, seed)
    with torch.no_grad():
        # What a user writes: stack every step's scores, then the same statistics as ours.
        scores = torch.stack(scores, dim=1).float()  # [B, T, V]
        logp = torch.log_softmax(scores, dim=-1)
        lp = logp.gather(-1, new[..., None]).squeeze(-1)  # [B, T]
        ent = -(logp.exp() * logp).sum(-1)  # [B, T]
        top = logp.topk(TOPK, dim=-1)  # values and ids, [B, T, k]
    per_row = [(new[b].tolist(), lp[b].numpy(), ent[b].numpy(), top.values[b].numpy()) for b in range(new.shape[0])]
    return int(new.numel()), per_row


def teacher_forced_error(model, tok, prompt, row) -> float:
    """Max abs difference between a row's statistics and a plain forward pass over
    prompt + generated tokens (unpadded, no cache): catches position / padding / cache bugs."""
    import numpy as np
    import torch

    ids, lp, ent, tkl = row
    p = tok(prompt)["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([p + ids])).logits[0, len(p) - 1: -1].float()
        ref = torch.log_softmax(logits, dim=-1)
        ref_lp = ref.gather(-1, torch.tensor(ids)[:, None]).squeeze(-1).numpy()
        ref_ent = (-(ref.exp() * ref).sum(-1)).numpy()
        ref_tkl = ref.topk(TOPK, dim=-1).values.numpy()
    return float(max(np.abs(ref_lp - lp).max(), np.abs(ref_ent - ent).max(), np.abs(ref_tkl - tkl).max()))


def measure(mode: str, model_dir: Path, tokenizer_dir: Path, batch: int, new_tokens: int, reps: int,
            seed: int) -> dict:
    """``mem-<method>``: peak memory of one full run of one method (in a fresh process, for the
    figure). ``time``: every method, interleaved, ``reps`` times each."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # fixed length for every method
    tok = NoEosTokenizer(tok)
    prompts = chat_prompts(tok, batch, seed) if getattr(tok, "chat_template", None) else bench_prompts(batch, seed)

    limit = getattr(model.config, "n_positions", None) or getattr(model.config, "max_position_embeddings", None)
    longest = max(len(tok(p)["input_ids"]) for p in prompts)
    if limit and longest + new_tokens > limit:
        sys.exit(f"prompt ({longest}) + new tokens ({new_tokens}) exceed the model's {limit} positions")

    methods = {"ours": run_ours, "per_step": run_per_step, "stacked": run_stacked}
    # safetensors loads weights memory-mapped: fault them in now, and run each method once on
    # one short row (lazy imports, kernel setup), so what follows measures only the batch
    for t in model.state_dict().values():
        t.sum()
    names = [mode[len("mem-"):]] if mode.startswith("mem-") else list(methods)
    for name in names:
        methods[name](model, tok, prompts[:1], 2, seed)

    if mode.startswith("mem-"):
        with PeakRSS() as mem:
            methods[names[0]](model, tok, prompts, new_tokens, seed)
        return {"peak_mb": mem.mb}
    # Interleave the methods (rotating which goes first) so that load changes on a shared
    # machine hit all alike; the medians are compared.
    times = {name: [] for name in methods}
    out = {}
    for rep in range(reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            t0 = time.perf_counter()
            out[name] = methods[name](model, tok, prompts, new_tokens, seed)
            times[name].append(time.perf_counter() - t0)
    # check the most left-padded row: padding is where a cached sampler goes wrong
    r = min(range(len(prompts)), key=lambda i: len(prompts[i]))
    result = {name: {"tokens": out[name][0], "times_s": times[name], "median_s": statistics.median(times[name]),
                     "check_max_abs_err": teacher_forced_error(model, tok, prompts[r], out[name][1][r])}
              for name in methods}
    result["expected_tokens"] = batch * new_tokens
    return result


def worker(args) -> None:
    """``--worker MODE``: :func:`measure` in this fresh process; the result on a tagged line."""
    result = measure(args.worker, args.model_dir, args.tokenizer_dir, args.batch, args.new_tokens, args.reps,
                     args.seed)
    print(RESULT_TAG + json.dumps(result), flush=True)


# --------------------------------------------------------------------------------------
# Parent side: build the 150k model, spawn workers, report.
# --------------------------------------------------------------------------------------
def build_random_model(out_dir: Path, vocab: int, hidden: int, layers: int, seed: int) -> None:
    """A seeded random Llama-style model with a large vocabulary (tied embeddings, like
    small Qwen models). Its weights are irrelevant: only the shapes set the cost."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden,
                         num_hidden_layers=layers, num_attention_heads=max(1, hidden // 64),
                         num_key_value_heads=max(1, hidden // 128), max_position_embeddings=512,
                         tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(config).eval().save_pretrained(out_dir, safe_serialization=True)


def spawn_worker(mode: str, model_dir: Path, tokenizer_dir: Path, batch: int, new_tokens: int,
                 reps: int, seed: int) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", mode,
           "--model-dir", str(model_dir), "--tokenizer-dir", str(tokenizer_dir),
           "--batch", str(batch), "--new-tokens", str(new_tokens), "--reps", str(reps), "--seed", str(seed)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    raise SystemExit(f"worker {mode} on {model_dir} failed (exit {proc.returncode}):\n"
                     f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def main(args) -> None:
    policy = Path(args.policy).expanduser().resolve()
    if not (policy / "config.json").is_file():
        raise SystemExit(f"no policy at {policy}: build it with `python -m sample_data.build_policy` or pass --policy")

    # smoke: measured in this process (one import of torch instead of nine); peaks then reuse
    # memory earlier runs freed, so they read low
    run = measure if args.smoke else spawn_worker
    if args.smoke:  # tiny tensors: one thread is as fast, and spins less on a busy machine
        import torch

        torch.set_num_threads(1)
    timing, mem = {}, {}
    with tempfile.TemporaryDirectory(prefix="bench-sampling-") as tmp:
        big = Path(tmp) / "random-150k"
        print(f"building a random {args.vocab}-token model ({args.layers} layers, hidden {args.hidden}) ...",
              flush=True)
        build_random_model(big, args.vocab, args.hidden, args.layers, args.seed)
        # the sample char tokenizer encodes the prompts for both models (its ids are valid in any vocab);
        # the chat policy reads templated word problems with its own tokenizer
        cases = {"sample_policy": (policy, policy), "150k_vocab": (big, policy)}
        if (args.chat_policy / "config.json").is_file():
            cases["chat_policy"] = (args.chat_policy, args.chat_policy)
        else:
            print(f"  no chat policy at {args.chat_policy}: build it with `python -m sample_data.build_chat_policy`")
        for case, (model_dir, tok_dir) in cases.items():
            shape = (args.batch or DEFAULTS[case][0], args.new_tokens or DEFAULTS[case][1])
            print(f"  {case}: batch {shape[0]} x {shape[1]} new tokens: memory ...", flush=True)
            for method in METHODS:
                mem[case, method] = run(f"mem-{method}", model_dir, tok_dir, *shape, args.reps, args.seed)["peak_mb"]
            reps = args.reps * (1 if args.smoke else REPS_SCALE[case])
            print(f"  {case}: batch {shape[0]} x {shape[1]} new tokens: time, {reps} reps ...", flush=True)
            timing[case] = run("time", model_dir, tok_dir, *shape, reps, args.seed)

    print()
    print(f"{'case':<14} {'method':<42} {'tokens':>7} {'median s':>9} {'tokens/s':>10} {'peak MB':>9} "
          f"{'check err':>10}")
    speed = {}
    for case, t in timing.items():
        for method in METHODS:
            r = t[method]
            speed[case, method] = r["tokens"] / r["median_s"]
            print(f"{case:<14} {LABELS[method]:<42} {r['tokens']:>7} {r['median_s']:>9.3f} "
                  f"{speed[case, method]:>10.0f} {mem[case, method]:>9.1f} {r['check_max_abs_err']:>10.1e}")
            if r["tokens"] != t["expected_tokens"]:
                print(f"  note: {r['tokens']} tokens generated, {t['expected_tokens']} expected "
                      "(rates use actual tokens)")
            if r["check_max_abs_err"] > 1e-3:
                print("  WARNING: statistics differ from a teacher-forced forward pass by more than 1e-3")

    print()
    for base in BASELINES:
        a = _ratio(speed["sample_policy", "ours"], speed["sample_policy", base])
        b = _ratio(speed["150k_vocab", "ours"], speed["150k_vocab", base])
        m = _ratio(mem["150k_vocab", "ours"], mem["150k_vocab", base])
        c = _ratio(speed["chat_policy", "ours"], speed["chat_policy", base]) if "chat_policy" in timing else None
        print(f"against generate + {base.replace('_', '-')} statistics:")
        for label, x, ok in (("(a) sample policy speed ratio >= 1.0:", a, a is not None and a >= 1.0),
                             ("(c) chat policy speed ratio >= 1.0:  ", c, c is not None and c >= 1.0),
                             ("(b) 150k-vocab speed ratio >= 1.2:  ", b, b is not None and b >= 1.2),
                             ("(b) 150k-vocab memory ratio <= 0.5: ", m, m is not None and m <= 0.5)):
            print(f"  target {label} {x}  {'met' if ok else 'NOT met'}")
    if args.smoke:
        print(f"  ({smoke.NOTE}; the '150k_vocab' case has {args.vocab} tokens)")
    print()
    for base, prefix in BASELINES.items():
        tail = "" if base == "per_step" else f"_vs_{base}"
        for case in timing:
            print(json.dumps({"figure": f"sampling_speed_{case}{tail}", "value": round(speed[case, "ours"], 1),
                              "unit": "tokens/s", "baseline": f"{prefix}_tokens_s",
                              "baseline_value": round(speed[case, base], 1),
                              "ratio": _ratio(speed[case, "ours"], speed[case, base])}))
        print(json.dumps({"figure": f"sampling_peak_mem_150k_vocab{tail}", "value": round(mem["150k_vocab", "ours"], 1),
                          "unit": "MB", "baseline": f"{prefix}_peak_mb",
                          "baseline_value": round(mem["150k_vocab", base], 1),
                          "ratio": _ratio(mem["150k_vocab", "ours"], mem["150k_vocab", base])}))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3,
                    help="timed repetitions per method, median reported (x5 for the sample policy)")
    ap.add_argument("--batch", type=int, default=None, help="batch size for both cases (default 64 / 16)")
    ap.add_argument("--new-tokens", type=int, default=None, help="new tokens per row for both cases (default 40 / 64)")
    ap.add_argument("--vocab", type=int, default=151_936, help="vocabulary of the random model (default 151936)")
    ap.add_argument("--hidden", type=int, default=256, help="hidden size of the random model")
    ap.add_argument("--layers", type=int, default=2, help="layers of the random model")
    ap.add_argument("--policy", type=Path, default=POLICY_DIR, help="sample policy folder (default sample_data/policy)")
    ap.add_argument("--chat-policy", type=Path, default=CHAT_POLICY_DIR,
                    help="the realistic world's chat policy (default sample_data/chat_policy)")
    ap.add_argument("--seed", type=int, default=0)
    # worker mode: a measurement on one model in a fresh process (spawned by main)
    ap.add_argument("--worker", choices=[f"mem-{m}" for m in METHODS] + ["time"], help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--tokenizer-dir", type=Path, help=argparse.SUPPRESS)
    return smoke.parse_args(ap, argv, reps=1, batch=4, new_tokens=8, vocab=4_096, hidden=64, layers=1)


if __name__ == "__main__":
    _args = parse_args()
    if _args.worker:
        worker(_args)
    else:
        main(_args)
