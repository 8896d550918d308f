"""The CUDA path of ``backends/``, end to end, in fp32 and bf16, with the sampler's speed against ``generate``.

Run on a GPU machine: ``python benchmarks/bench_cuda.py [--out DIR]`` (about 2-4 minutes on one
H100; ``benchmarks/device_run.sh`` is the device command). On a machine without CUDA it runs
on the device ``backends.device.pick_device`` picks (``ROLLOUT_STUDIO_DEVICE`` overrides), which
is what ``--smoke`` does in CI: tiny sizes, the same code paths.

For each policy and dtype it checks, and prints a line per check (``[ok]`` / ``[FAIL]``):

1. ``backends.policy.load_policy`` loads it on the device in the wanted dtype. The dtype comes
   from the folder's ``config.json`` (``load_policy`` asks transformers for ``dtype="auto"``
   off the CPU): each case is a temporary folder of symbolic links to the policy's files and
   a copy of its config naming ``float32`` or ``bfloat16``. On a CPU ``load_policy`` always
   loads float32, so the bf16 case casts the loaded model (smoke runs only).
2. ``sample`` (n=2 per prompt, temperature 0.8, top-p 0.95) gives finite per-token statistics
   (logprob <= 0, 0 <= entropy <= log V, top-k sorted, the sampled token's logprob equal to its
   top-k entry), and its logprobs, entropies and top-k logprobs agree with a teacher-forced
   ``score`` of the same tokens (max abs difference; tolerance 2e-3 in fp32, 0.25 in bf16).
3. ``branch`` at a fork (the sampled token, an alternative, and a drawn one, n=2 each) keeps the
   prefix, forces the chosen token, and its statistics agree with ``score`` of the same tokens.
4. Speed: the studio sampler (``sample_batch``, statistics on the fly) against
   ``model.generate(do_sample=True, output_scores=True, return_dict_in_generate=True)`` plus
   the same statistics (logprob, entropy, top-5) computed from each step's scores, on the same
   model, left-padded prompts, batch, seed and length (end token disabled: every row runs to
   the length); interleaved repetitions, medians, tokens/s and peak CUDA memory.
5. The HTTP backend: ``backends.server`` (its tornado app, in this process, on 127.0.0.1, the
   same cached policy) answers ``GET /v1/models`` (device) and one seeded ``/v1/completions``
   with the studio extension (``studio.stats``, ``logprobs``) whose tokens equal the local
   sampler's for that seed; then ``backends.remote.RemotePolicy`` against it: ``sample``,
   ``branch`` and ``score`` equal the local policy's.
6. Issue 33's precision mismatch (fp32 cases): the same folder loaded with
   ``precision="bfloat16"`` samples; the float32 policy scores those tokens; Δ = log π_fp32 −
   log π_bf16 is small but not zero (figures ``cuda_mismatch_bf16_vs_fp32_{mean,max}_abs_delta_<model>``).
7. A training step with ``backends.trainer``: ``micro_batches`` + ``backward`` (``policy_loss``)
   + ``grad_norm`` + an AdamW step on freshly sampled completions (loss and gradient finite).

Policies: the sample policy (``sample_data/policy``), the sample chat policy
(``sample_data/chat_policy``, when that folder exists), and a random Qwen2-0.5B-sized model
(hidden 896, 24 layers, 14 heads, 2 KV heads, intermediate 4864, vocabulary 151,936, tied
embeddings) built here from a ``Qwen2Config`` with a local character-level tokenizer padded
to the vocabulary, saved (bf16) to a temporary folder. Nothing is downloaded.

Figures per policy and dtype (``<dt>`` fp32 / bf16, ``<model>`` sample_policy / chat_policy /
qwen2_0p5b): ``cuda_sampling_tokens_per_s_<dt>_<model>`` against
``hf_generate_tokens_per_s_<dt>_<model>``; ``cuda_logprob_sample_vs_score_max_abs_diff_<dt>_<model>``
(nats); ``cuda_train_step_s_<dt>_<model>`` (median of the steps after the first). With
``--out DIR`` the figure lines also go to ``DIR/cuda.jsonl`` and every check to
``DIR/cuda_checks.json``. Exit status 1 when a check failed (figures are printed anyway).

``--budget-s`` (default 420): a case or section that would start with too little time left is
skipped (and said so), and timing repetitions stop early, so the run ends before the limit.

Imports only ``backends`` (and torch, transformers, tokenizers, tornado for the server).

Options: --models, --dtypes, --batch, --new-tokens, --reps, --train-steps, --qwen-size,
--seed, --budget-s, --out, --smoke (batch 4 x 8 tokens, one repetition, a tiny Qwen2
(hidden 64, 2 layers, vocabulary 4,096), the sample policy and the Qwen2 only: seconds).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: import the project's packages

from benchmarks import smoke  # noqa: E402
from benchmarks.bench_sampling import NoEosTokenizer, bench_prompts  # noqa: E402  (stdlib and sample_data paths only)

SAMPLE_POLICY = REPO / "sample_data" / "policy"
CHAT_POLICY = REPO / "sample_data" / "chat_policy"
QWEN = "qwen2_0p5b"
MODELS = ("sample_policy", "chat_policy", QWEN)
TOPK = 5
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
TOL = {"fp32": 2e-3, "bf16": 0.25}  # sample vs teacher-forced statistics, nats: bf16 rounds logits ~|x| 2^-8
# Qwen2-0.5B's shapes, and a tiny one for smoke runs
QWEN_SIZES = {
    "0.5b": dict(vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2),
    "tiny": dict(vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
}
MIN_CASE_S = {"sample_policy": 15.0, "chat_policy": 15.0, QWEN: 45.0}  # do not start a case with less left
MIN_SECTION_S = 8.0


# --------------------------------------------------------------------------------------
# Bookkeeping: checks, figures, the time budget.
# --------------------------------------------------------------------------------------
class Report:
    def __init__(self, budget_s: float):
        self.t0, self.budget_s = time.monotonic(), budget_s
        self.checks: list[dict] = []
        self.figures: list[dict] = []
        self.skipped: list[str] = []

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.t0)

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append({"check": name, "ok": bool(ok), "detail": detail})
        print(f"    [{'ok' if ok else 'FAIL'}] {name}{f': {detail}' if detail else ''}", flush=True)
        return bool(ok)

    def figure(self, figure: str, value: float, unit: str, baseline: str | None = None,
               baseline_value: float | None = None) -> None:
        ratio = round(value / baseline_value, 3) if baseline_value else None
        self.figures.append({"figure": figure, "value": value, "unit": unit, "baseline": baseline,
                             "baseline_value": baseline_value, "ratio": ratio})

    def skip(self, what: str) -> None:
        self.skipped.append(what)
        print(f"    [skipped] {what}", flush=True)

    def finish(self, out: Path | None, name: str, meta: dict, note: str | None = None) -> int:
        """Print the checks' summary and the figures (one JSON line each); with ``out``, also write
        ``out/<name>.jsonl`` and ``out/<name>_checks.json`` (``meta`` and every check). Returns the
        exit status: 1 when a check failed."""
        failed = [c for c in self.checks if not c["ok"]]
        print(f"\n{len(self.checks) - len(failed)}/{len(self.checks)} checks passed"
              f"{f', {len(self.skipped)} skipped' if self.skipped else ''}; "
              f"{time.monotonic() - self.t0:.0f} s of the {self.budget_s:.0f} s budget used")
        for c in failed:
            print(f"  FAILED: {c['check']}: {c['detail']}")
        if note:
            print(f"  ({note})")
        lines = [json.dumps(f) for f in self.figures]
        if out:
            out = Path(out)
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{name}.jsonl").write_text("".join(x + "\n" for x in lines))
            (out / f"{name}_checks.json").write_text(json.dumps(
                {**meta, "checks": self.checks, "skipped": self.skipped,
                 "elapsed_s": round(time.monotonic() - self.t0, 1)}, indent=1))
        print()
        for x in lines:
            print(x)
        return 1 if failed else 0

    def section(self, name: str, fn, *args) -> object:
        """Run one section; an exception is a failed check (the run goes on)."""
        if self.left() < MIN_SECTION_S:
            self.skip(f"{name}: {self.left():.0f} s of the budget left")
            return None
        print(f"  {name} ...", flush=True)
        t0 = time.perf_counter()
        try:
            return fn(*args)
        except Exception as exc:  # report and go on: the device run has one shot
            self.check(f"{name} ran", False, f"{type(exc).__name__}: {exc}")
            traceback.print_exc()
            return None
        finally:
            print(f"    ({time.perf_counter() - t0:.1f} s)", flush=True)


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _max_abs(pairs) -> float:
    """Max |a - b| over pairs of equal-shape arrays (0 when there are none)."""
    import numpy as np

    out = 0.0
    for a, b in pairs:
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a.size:
            out = max(out, float(np.abs(a - b).max()))
    return out


# --------------------------------------------------------------------------------------
# The policies: a dtype variant of a folder, the random Qwen2.
# --------------------------------------------------------------------------------------
def dtype_variant(src: Path, dtype: str, out: Path) -> Path:
    """``out``: symbolic links to ``src``'s files and its config naming ``dtype``, which is what
    ``load_policy`` (``dtype="auto"`` off the CPU) then loads the weights in."""
    out.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and f.name != "config.json":
            (out / f.name).symlink_to(f.resolve())
    cfg = json.loads((src / "config.json").read_text())
    cfg["dtype"] = cfg["torch_dtype"] = dtype  # transformers 5 reads dtype; 4.x torch_dtype
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


def build_tokenizer(out: Path, vocab_size: int) -> None:
    """A character-level tokenizer (printable ASCII and newline) padded with ``<tN>`` tokens to
    ``vocab_size``, so every id a random model samples decodes: ids 0-2 are pad, bos, eos."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    toks = ["<|pad|>", "<|bos|>", "<|endoftext|>", "<|unk|>", "\n"] + [chr(i) for i in range(32, 127)]
    toks += [f"<t{i}>" for i in range(len(toks), vocab_size)]
    tk = Tokenizer(models.WordLevel({t: i for i, t in enumerate(toks)}, unk_token="<|unk|>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one token per character
    tk.decoder = decoders.Fuse()  # pieces concatenate to the text
    PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|bos|>", eos_token="<|endoftext|>",
                            pad_token="<|pad|>", unk_token="<|unk|>").save_pretrained(out)


def build_qwen(out: Path, size: str, device: str, seed: int) -> None:
    """A seeded random Qwen2 of ``QWEN_SIZES[size]``'s shapes (tied embeddings, as Qwen2-0.5B),
    built on ``device`` and saved in bf16 with its tokenizer."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**QWEN_SIZES[size], max_position_embeddings=32_768, rms_norm_eps=1e-6, tie_word_embeddings=True,
                      use_sliding_window=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg)
    model.to(torch.bfloat16).eval().save_pretrained(out, safe_serialization=True)
    del model
    build_tokenizer(out, cfg.vocab_size)
    n = QWEN_SIZES[size]
    print(f"  built a random Qwen2 ({n['num_hidden_layers']} layers, hidden {n['hidden_size']}, vocabulary "
          f"{n['vocab_size']}) in {out}", flush=True)


# --------------------------------------------------------------------------------------
# The checks of one policy in one dtype.
# --------------------------------------------------------------------------------------
def stats_problems(gens, vocab: int) -> list[str]:
    """What is wrong with the per-token statistics of ``gens`` (empty: nothing)."""
    import numpy as np

    bad, log_v = [], math.log(vocab)
    for i, g in enumerate(gens):
        T = g.n_tokens
        shapes = (g.logprobs.shape, g.entropies.shape, g.topk_ids.shape, g.topk_logprobs.shape, len(g.token_texts))
        if shapes != ((T,), (T,), (T, TOPK), (T, TOPK), T):
            bad.append(f"row {i}: shapes {shapes} for {T} tokens")
            continue
        if not T:
            continue
        arrays = (g.logprobs, g.entropies, g.topk_logprobs)
        if not all(np.isfinite(a).all() for a in arrays):
            bad.append(f"row {i}: non-finite statistics")
            continue
        if g.token_ids.min() < 0 or g.token_ids.max() >= vocab or g.topk_ids.min() < 0 or g.topk_ids.max() >= vocab:
            bad.append(f"row {i}: token ids outside the vocabulary")
        if g.logprobs.max() > 1e-4:
            bad.append(f"row {i}: a logprob > 0 ({g.logprobs.max():.3g})")
        if g.entropies.min() < -1e-3 or g.entropies.max() > log_v + 1e-2:
            bad.append(f"row {i}: entropy outside [0, log V] ({g.entropies.min():.3g}..{g.entropies.max():.3g})")
        if (np.diff(g.topk_logprobs, axis=-1) > 1e-6).any():
            bad.append(f"row {i}: top-k logprobs not sorted")
        if (g.topk_logprobs[:, 0] < g.logprobs - 1e-5).any():
            bad.append(f"row {i}: a sampled token more likely than the top-1")
        hit = g.topk_ids == g.token_ids[:, None]  # where the sampled token is among the top k
        if (np.abs(np.where(hit, g.topk_logprobs - g.logprobs[:, None], 0.0)) > 1e-5).any():
            bad.append(f"row {i}: a sampled token's logprob differs from its top-k entry")
    return bad


def compare_to_score(policy, gens) -> dict[str, float]:
    """Max abs differences between ``gens``' statistics and a teacher-forced ``score`` of their tokens."""
    scored = policy.score([g.prompt for g in gens], [g.token_ids.tolist() for g in gens], top_k_stats=TOPK,
                          batch_size=max(1, len(gens)))
    return {"logprob": _max_abs((g.logprobs, s.logprobs) for g, s in zip(gens, scored)),
            "entropy": _max_abs((g.entropies, s.entropies) for g, s in zip(gens, scored)),
            "topk": _max_abs((g.topk_logprobs, s.topk_logprobs) for g, s in zip(gens, scored))}


def check_sample_score(rep: Report, case: str, policy, prompts, new_tokens: int, seed: int, tol: float, vocab: int):
    """Sampling with statistics, checked, and against teacher forcing. Returns the generations."""
    gens = policy.sample(prompts, n=2, temperature=0.8, top_p=0.95, max_new_tokens=new_tokens, seed=seed,
                         top_k_stats=TOPK)
    bad = stats_problems(gens, vocab)
    n_tok = sum(g.n_tokens for g in gens)
    rep.check(f"{case}: sample statistics finite and consistent", not bad and len(gens) == 2 * len(prompts),
              "; ".join(bad[:3]) or f"{len(gens)} completions, {n_tok} tokens")
    d = compare_to_score(policy, gens)
    rep.check(f"{case}: sample statistics = teacher-forced score", max(d.values()) <= tol,
              f"max |diff| logprob {d['logprob']:.2e}, entropy {d['entropy']:.2e}, top-k {d['topk']:.2e} "
              f"(tolerance {tol})")
    return gens, d["logprob"]


def check_branch(rep: Report, case: str, policy, gens, new_tokens: int, seed: int, tol: float, vocab: int):
    g0 = max(gens, key=lambda g: g.n_tokens)
    if g0.n_tokens < 2:
        rep.check(f"{case}: branch", False, "no sampled completion has two tokens to fork")
        return
    P = min(3, g0.n_tokens - 1)
    prefix, actual = g0.token_ids[:P].tolist(), int(g0.token_ids[P])
    alt = int(next(t for t in g0.topk_ids[P] if int(t) != actual))
    choices = [actual, alt, None]
    br = policy.branch(g0.prompt, prefix, choices, n=2, temperature=1.0, max_new_tokens=P + 1 + new_tokens,
                       seed=seed, top_k_stats=TOPK)
    bad = stats_problems(br, vocab)
    if len(br) != 2 * len(choices):
        bad.append(f"{len(br)} branches, expected {2 * len(choices)}")
    for i, b in enumerate(br):
        want = choices[i // 2]
        if b.token_ids[:P].tolist() != prefix:
            bad.append(f"branch {i} lost the prefix")
        if want is not None and (b.n_tokens <= P or int(b.token_ids[P]) != want):
            bad.append(f"branch {i} does not continue with the forced token {want}")
    rep.check(f"{case}: branch keeps the prefix and forces the choice", not bad,
              "; ".join(bad[:3]) or f"fork at {P}, choices {choices}, {len(br)} branches")
    d = compare_to_score(policy, br)
    pre = _max_abs((b.logprobs[:P], g0.logprobs[:P]) for b in br)
    rep.check(f"{case}: branch statistics = teacher-forced score", max(d["logprob"], d["entropy"], pre) <= tol,
              f"max |diff| logprob {d['logprob']:.2e}, entropy {d['entropy']:.2e}, prefix vs sample {pre:.2e}")


def hf_generate_with_stats(model, tok, prompts, new_tokens: int, seed: int) -> int:
    """The baseline: ``generate`` with its scores, then the same statistics as the studio's from
    each step's scores (each step dropped once read), brought to the host. Returns tokens made."""
    import torch

    device = next(model.parameters()).device
    enc = tok(prompts, return_tensors="pt", padding=True)  # left-padded (Policy sets the side)
    ids, attn = enc["input_ids"].to(device), enc["attention_mask"].to(device)
    torch.manual_seed(seed)
    out = model.generate(input_ids=ids, attention_mask=attn, do_sample=True, output_scores=True,
                         return_dict_in_generate=True, top_k=0, top_p=1.0, temperature=1.0,
                         max_new_tokens=new_tokens, pad_token_id=tok.pad_token_id)
    new, scores = out.sequences[:, ids.shape[1]:], list(out.scores)  # [B, T], T x [B, V]
    B, T = new.shape
    lp = torch.empty(B, T, device=device)
    ent = torch.empty(B, T, device=device)
    tkl = torch.empty(B, T, TOPK, device=device)
    tki = torch.empty(B, T, TOPK, dtype=torch.long, device=device)
    with torch.no_grad():
        for t in range(T):
            logp = torch.log_softmax(scores[t].float(), dim=-1)  # [B, V]
            scores[t] = None
            lp[:, t] = logp.gather(-1, new[:, t, None]).squeeze(-1)
            ent[:, t] = -(logp.exp() * logp).sum(-1)
            tkl[:, t], tki[:, t] = logp.topk(TOPK, dim=-1)
    for x in (new, lp, ent, tkl, tki):
        x.cpu().numpy()
    return int(new.numel())


def check_speed(rep: Report, case: str, dt: str, model_label: str, policy, prompts, new_tokens: int, reps: int,
                seed: int, device: str):
    """The studio sampler against generate + statistics: interleaved, medians, tokens/s."""
    import torch

    from backends.policy import sample_batch

    model, tok = policy.model, policy.tokenizer
    no_eos = NoEosTokenizer(tok)
    saved_eos = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = None  # both run every row to the full length

    def ours(ps, T):
        gens = sample_batch(model, no_eos, ps, n=1, temperature=1.0, top_p=1.0, max_new_tokens=T, seed=seed,
                            top_k_stats=TOPK)
        return sum(g.n_tokens for g in gens)

    def theirs(ps, T):
        return hf_generate_with_stats(model, tok, ps, T, seed)

    methods = {"studio": ours, "hf": theirs}
    cuda = device.startswith("cuda")
    try:
        for fn in methods.values():  # warm-up: kernels, lazy imports, allocator
            fn(prompts, min(new_tokens, 4))
        times = {m: [] for m in methods}
        tokens, peak = {}, {}
        names = list(methods)
        for r in range(reps):
            if r and rep.left() < 3 * max(max(v) for v in times.values()) + MIN_SECTION_S:
                print(f"    (stopping after {r} repetitions: budget)", flush=True)
                break
            for name in names[r % 2:] + names[:r % 2]:
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                _sync(device)
                t0 = time.perf_counter()
                tokens[name] = methods[name](prompts, new_tokens)
                _sync(device)
                times[name].append(time.perf_counter() - t0)
                if cuda:
                    peak[name] = torch.cuda.max_memory_allocated() / 2 ** 20
    finally:
        model.generation_config.eos_token_id = saved_eos
    speed = {m: tokens[m] / statistics.median(times[m]) for m in methods}
    for m, label in (("studio", "studio sample_batch (stats on the fly)"),
                     ("hf", "generate(output_scores) + per-step stats")):
        mem = f", peak {peak[m]:.0f} MiB" if m in peak else ""
        print(f"    {label:<42} {tokens[m]:>6} tokens  median {statistics.median(times[m]):.3f} s over "
              f"{len(times[m])}  {speed[m]:>9.0f} tokens/s{mem}", flush=True)
    expected = len(prompts) * new_tokens
    rep.check(f"{case}: both samplers made batch x length tokens", tokens["studio"] == tokens["hf"] == expected,
              f"studio {tokens['studio']}, generate {tokens['hf']}, expected {expected}")
    rep.figure(f"cuda_sampling_tokens_per_s_{dt}_{model_label}", round(speed["studio"], 1), "tokens/s",
               f"hf_generate_tokens_per_s_{dt}_{model_label}", round(speed["hf"], 1))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class InProcessServer:
    """``backends.server``'s tornado app for ``folder`` on 127.0.0.1, its event loop on a thread.
    The engine loads the policy with ``load_policy``: the same cached object as this process's."""

    def __init__(self, folder: Path):
        from backends.server import Engine, make_app

        self.engine = Engine(Path(folder))
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._make_app = make_app
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop = self._stop = None
        self._thread = threading.Thread(target=self._run, name="bench-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(60):
            raise TimeoutError("the server did not start within 60 s")
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        async def main():
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            try:
                server = self._make_app(self.engine, None).listen(self.port, address="127.0.0.1")
            except BaseException as exc:
                self._error = exc
                self._ready.set()
                return
            self._ready.set()
            await self._stop.wait()
            server.stop()

        asyncio.run(main())

    def close(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        self.engine.model_thread.shutdown(wait=True)
        self.engine.info_thread.shutdown(wait=True)


def _http(url: str, body: dict | None = None, timeout: float = 120.0) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def check_server(rep: Report, case: str, folder: Path, policy, prompts, seed: int, device: str, tol: float,
                 vocab: int):
    """One /v1/completions request with the studio extension, then RemotePolicy, against the local policy."""
    import numpy as np

    from backends.remote import RemotePolicy

    srv = InProcessServer(folder)
    try:
        m = 12
        status, models = _http(srv.url + "/v1/models")
        card = (models.get("data") or [{}])[0]
        ext = card.get("studio") or {}
        rep.check(f"{case}: server /v1/models", status == 200 and ext.get("device") == device,
                  f"status {status}, studio.device {ext.get('device')!r} (expected {device!r}), "
                  f"version {ext.get('version')}")
        ps = prompts[:2]
        body = {"model": srv.engine.name, "prompt": ps, "n": 2, "max_tokens": m, "seed": seed, "temperature": 1.0,
                "logprobs": 2, "studio": {"stats": True, "top_k": TOPK}}
        t0 = time.perf_counter()
        status, resp = _http(srv.url + "/v1/completions", body)
        took = time.perf_counter() - t0
        choices = sorted(resp.get("choices") or [], key=lambda c: c["index"])
        bad = [] if status == 200 else [f"status {status}: {json.dumps(resp)[:300]}"]
        if status == 200 and len(choices) != 4:
            bad.append(f"{len(choices)} choices, expected 4")
        for c in choices:
            s = c.get("studio") or {}
            n = len(s.get("token_ids") or [])
            cols = [s.get(k) for k in ("token_texts", "logprobs", "entropies", "topk_ids", "topk_logprobs")]
            if not n or any(x is None or len(x) != n for x in cols):
                bad.append(f"choice {c['index']}: studio columns missing or of unequal lengths")
                continue
            if not np.isfinite(np.asarray(s["logprobs"] + s["entropies"], np.float64)).all():
                bad.append(f"choice {c['index']}: non-finite studio statistics")
            lp = c.get("logprobs") or {}
            if len(lp.get("token_logprobs") or []) != n or len(lp.get("top_logprobs") or []) != n:
                bad.append(f"choice {c['index']}: standard logprobs missing")
        rep.check(f"{case}: server /v1/completions with studio.stats", not bad,
                  "; ".join(bad[:3]) or f"4 choices in {took:.2f} s, usage {resp.get('usage')}")
        if not bad:
            local = policy.sample(ps, n=2, max_new_tokens=m, seed=seed, top_k_stats=TOPK)
            same = [c["studio"]["token_ids"] == g.token_ids.tolist() for c, g in zip(choices, local)]
            diff = _max_abs((c["studio"]["logprobs"], g.logprobs) for c, g in zip(choices, local) if
                            c["studio"]["token_ids"] == g.token_ids.tolist())
            rep.check(f"{case}: server completion = local sample (same seed)", all(same) and diff <= tol,
                      f"{sum(same)}/{len(same)} choices with the same tokens, max |logprob diff| {diff:.2e}")

        rp = RemotePolicy(srv.url)
        info = rp.info()
        rep.check(f"{case}: RemotePolicy sees the extension", info.extension and info.device == device,
                  f"extension {info.extension}, device {info.device}, vocab {info.vocab_size}")
        r_gens = rp.sample(ps, n=2, max_new_tokens=m, seed=seed + 1, top_k_stats=TOPK)
        l_gens = policy.sample(ps, n=2, max_new_tokens=m, seed=seed + 1, top_k_stats=TOPK)
        same = sum(r.token_ids.tolist() == g.token_ids.tolist() for r, g in zip(r_gens, l_gens))
        diff = _max_abs((r.logprobs, g.logprobs) for r, g in zip(r_gens, l_gens)
                        if r.token_ids.tolist() == g.token_ids.tolist())
        bad = stats_problems(r_gens, vocab)
        rep.check(f"{case}: RemotePolicy.sample = local sample", not bad and same == len(l_gens) and diff <= tol,
                  "; ".join(bad[:2]) or f"{same}/{len(l_gens)} same tokens, max |logprob diff| {diff:.2e}")
        g0 = max(l_gens, key=lambda g: g.n_tokens)
        if g0.n_tokens >= 2:
            P = min(2, g0.n_tokens - 1)
            prefix, choice = g0.token_ids[:P].tolist(), [int(g0.topk_ids[P][0]), None]
            rb = rp.branch(g0.prompt, prefix, choice, n=1, max_new_tokens=P + 1 + m, seed=seed, top_k_stats=TOPK)
            lb = policy.branch(g0.prompt, prefix, choice, n=1, max_new_tokens=P + 1 + m, seed=seed, top_k_stats=TOPK)
            same = sum(r.token_ids.tolist() == g.token_ids.tolist() for r, g in zip(rb, lb))
            rep.check(f"{case}: RemotePolicy.branch = local branch", same == len(lb) == 2,
                      f"{same}/{len(lb)} same tokens")
        comps = [g.token_ids.tolist() for g in l_gens]
        rs = rp.score([g.prompt for g in l_gens], comps, top_k_stats=TOPK)
        ls = policy.score([g.prompt for g in l_gens], comps, top_k_stats=TOPK)
        diff = max(_max_abs((r.logprobs, g.logprobs) for r, g in zip(rs, ls)),
                   _max_abs((r.entropies, g.entropies) for r, g in zip(rs, ls)))
        ok = len(rs) == len(ls) and all(r.token_ids.tolist() == c for r, c in zip(rs, comps))
        rep.check(f"{case}: RemotePolicy.score = local score", ok and diff <= tol,
                  f"{len(rs)} completions, max |diff| {diff:.2e}")
    finally:
        srv.close()


def check_train(rep: Report, case: str, dt: str, model_label: str, policy, prompts, new_tokens: int, steps: int,
                seed: int, device: str):
    """``backends.trainer``'s step as the mini-run does it: sample, micro-batches, backward, AdamW."""
    import numpy as np
    import torch

    from backends.trainer import backward, grad_norm, length_buckets, micro_batches

    model, tok = policy.model, policy.tokenizer
    gens = policy.sample(prompts, n=1, max_new_tokens=new_tokens, seed=seed, top_k_stats=TOPK)
    p_ids = [tok(g.prompt)["input_ids"] for g in gens]
    c_ids = [g.token_ids.tolist() for g in gens]
    dev = next(model.parameters()).device
    adv = torch.linspace(-1.0, 1.0, len(gens), device=dev)
    buckets = (length_buckets([len(p) + len(c) for p, c in zip(p_ids, c_ids)]) if device == "cpu"
               else [np.arange(len(gens))])  # as the mini-run: one batch on a GPU
    batches = micro_batches(p_ids, c_ids, adv, buckets, "grpo")
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-6)
    times, losses, norms = [], [], []
    model.train()
    try:
        for i in range(steps):
            if i and rep.left() < 2 * max(times) + MIN_SECTION_S:
                break
            _sync(device)
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss, _ = backward(model, batches, pad, loss_type="grpo")
            norms.append(grad_norm(model))
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            _sync(device)
            times.append(time.perf_counter() - t0)
            losses.append(loss)
    finally:
        model.eval()
        opt.zero_grad(set_to_none=True)
        del opt
    peak = f", peak {torch.cuda.max_memory_allocated() / 2 ** 20:.0f} MiB" if device.startswith("cuda") else ""
    ok = all(math.isfinite(x) for x in losses + norms) and all(n > 0 for n in norms)
    rep.check(f"{case}: training step (policy_loss, backward, AdamW)", ok,
              f"{len(gens)} completions, {sum(map(len, c_ids))} tokens; losses {[round(x, 4) for x in losses]}, "
              f"grad norms {[round(x, 4) for x in norms]}; steps {[round(t, 3) for t in times]} s{peak}")
    step_s = statistics.median(times[1:]) if len(times) > 1 else times[0]
    rep.figure(f"cuda_train_step_s_{dt}_{model_label}", round(step_s, 4), "s")


def check_precision_mismatch(rep: Report, case: str, model_label: str, folder: Path, policy, prompts,
                             new_tokens: int, seed: int, device: str):
    """Issue 33's two engines on one GPU: sample with the folder loaded in bfloat16
    (``load_policy(..., precision="bfloat16")``), teacher-force the same tokens with the float32
    policy, and report Δ = log π_fp32 − log π_bf16 per token (small but not zero)."""
    import numpy as np

    from backends.policy import load_policy

    lo = load_policy(str(folder), device, precision="bfloat16")
    p = next(lo.model.parameters())
    gens = lo.sample(prompts, n=2, temperature=1.0, max_new_tokens=new_tokens, seed=seed, top_k_stats=TOPK)
    ref = policy.score([g.prompt for g in gens], [g.token_ids.tolist() for g in gens], top_k_stats=TOPK)
    d = np.concatenate([np.asarray(r.logprobs, dtype=np.float64) - np.asarray(g.logprobs, dtype=np.float64)
                        for g, r in zip(gens, ref)])
    mean_abs, max_abs = float(np.abs(d).mean()), float(np.abs(d).max())
    rep.check(f"{case}: bf16-sampled, fp32-scored Δ small but non-zero",
              p.dtype.is_floating_point and str(p.dtype) == "torch.bfloat16" and 0 < mean_abs < 0.1
              and np.isfinite(d).all(),
              f"{d.size} tokens; mean |Δ| {mean_abs:.2e}, max |Δ| {max_abs:.2e}, mean Δ {d.mean():+.2e} "
              f"(sampler {p.dtype} on {p.device})")
    rep.figure(f"cuda_mismatch_bf16_vs_fp32_mean_abs_delta_{model_label}", round(mean_abs, 6), "nats")
    rep.figure(f"cuda_mismatch_bf16_vs_fp32_max_abs_delta_{model_label}", round(max_abs, 6), "nats")
    del lo


def run_case(rep: Report, args, model_label: str, folder: Path, dt: str, device: str) -> None:
    import torch

    from backends.policy import load_policy

    case = f"{model_label} {dt}"
    print(f"\n== {case} ({folder.name}) on {device}", flush=True)
    t0 = time.perf_counter()
    policy = load_policy(str(folder))
    want = getattr(torch, DTYPES[dt])
    if device == "cpu" and want != torch.float32:  # load_policy loads float32 on a CPU
        policy.model.to(want)
        print(f"    (on a CPU load_policy loads float32: cast to {want} here)", flush=True)
    p = next(policy.model.parameters())
    rep.check(f"{case}: load_policy", p.dtype == want and p.device.type == device.split(":")[0],
              f"{p.dtype} on {p.device} in {time.perf_counter() - t0:.1f} s "
              f"({sum(x.numel() for x in policy.model.parameters()) / 1e6:.1f}M parameters)")
    vocab = policy.model.get_output_embeddings().weight.shape[0]
    prompts = bench_prompts(args.batch, args.seed)
    cfg = policy.model.config
    limit = getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", None) or 10 ** 9
    longest = max(len(policy.tokenizer(x)["input_ids"]) for x in prompts)
    new_tokens = max(1, min(args.new_tokens, limit - longest - 8))
    if new_tokens < args.new_tokens:
        print(f"    ({new_tokens} new tokens: the model has {limit} positions)", flush=True)
    tol = TOL[dt]
    k = max(1, min(4, len(prompts)))
    out = rep.section(f"{case}: sample + score", check_sample_score, rep, case, policy, prompts[:k], new_tokens,
                      args.seed, tol, vocab)
    if out is not None:
        gens, lp_diff = out
        rep.figure(f"cuda_logprob_sample_vs_score_max_abs_diff_{dt}_{model_label}", round(lp_diff, 6), "nats")
        rep.section(f"{case}: branch", check_branch, rep, case, policy, gens, min(new_tokens, 32), args.seed, tol,
                    vocab)
    if dt == "fp32":
        rep.section(f"{case}: bf16 sampler vs fp32 scorer", check_precision_mismatch, rep, case, model_label,
                    folder, policy, prompts[:k], min(new_tokens, 64), args.seed, device)
    rep.section(f"{case}: speed vs generate", check_speed, rep, case, dt, model_label, policy, prompts, new_tokens,
                args.reps, args.seed, device)
    rep.section(f"{case}: HTTP backend + RemotePolicy", check_server, rep, case, folder, policy, prompts, args.seed,
                device, tol, vocab)
    rep.section(f"{case}: training step", check_train, rep, case, dt, model_label, policy,
                prompts[:min(8, len(prompts))], min(new_tokens, 64), args.train_steps, args.seed, device)
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def main(args) -> int:
    import torch
    import transformers
    from transformers.utils import logging as hf_logging

    from backends.device import pick_device

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    rep = Report(args.budget_s)
    device = pick_device()
    if device == "cpu" and args.smoke:
        torch.set_num_threads(1)  # tiny tensors: one thread is as fast, and spins less on a busy machine
    gpu = torch.cuda.get_device_name(0) if device.startswith("cuda") else "none"
    print(f"device {device} (GPU {gpu}); torch {torch.__version__}, transformers {transformers.__version__}, "
          f"python {sys.version.split()[0]}; budget {args.budget_s:.0f} s", flush=True)
    if not device.startswith("cuda"):
        print("  no CUDA here: the CUDA path is not exercised; the same code runs on this device", flush=True)
    wanted = [m.strip() for m in args.models.split(",") if m.strip()]
    dts = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    for x in wanted:
        if x not in MODELS:
            raise SystemExit(f"unknown model {x!r}: choose from {', '.join(MODELS)}")
    for d in dts:
        if d not in DTYPES:
            raise SystemExit(f"unknown dtype {d!r}: choose from {', '.join(DTYPES)}")
    with tempfile.TemporaryDirectory(prefix="bench-cuda-") as tmp:
        tmp = Path(tmp)
        for model_label in wanted:
            if model_label == "sample_policy":
                src = SAMPLE_POLICY
            elif model_label == "chat_policy":
                src = CHAT_POLICY
                if not (src / "config.json").is_file():
                    rep.skip(f"chat_policy: {src} does not exist (python -m sample_data.build_chat_policy)")
                    continue
            else:
                if rep.left() < MIN_CASE_S[QWEN]:
                    rep.skip(f"{QWEN}: {rep.left():.0f} s of the budget left")
                    continue
                src = tmp / "qwen2-random"
                t0 = time.perf_counter()
                build_qwen(src, args.qwen_size, device, args.seed)
                print(f"  ({time.perf_counter() - t0:.1f} s)", flush=True)
            for dt in dts:
                if rep.left() < MIN_CASE_S[model_label]:
                    rep.skip(f"{model_label} {dt}: {rep.left():.0f} s of the budget left")
                    continue
                folder = dtype_variant(src, DTYPES[dt], tmp / f"{model_label}-{dt}")
                try:
                    run_case(rep, args, model_label, folder, dt, device)
                except Exception as exc:
                    rep.check(f"{model_label} {dt}: case ran", False, f"{type(exc).__name__}: {exc}")
                    traceback.print_exc()

    note = f"{smoke.NOTE}; the '{QWEN}' case is a {args.qwen_size} Qwen2" if args.smoke else None
    return rep.finish(args.out, "cuda", {"device": device, "gpu": gpu, "torch": torch.__version__,
                                         "transformers": transformers.__version__, "smoke": bool(args.smoke),
                                         "qwen_size": args.qwen_size}, note)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--dtypes", default="fp32,bf16", help="comma-separated, of fp32, bf16")
    ap.add_argument("--batch", type=int, default=32, help="prompts in the timed batch (default 32)")
    ap.add_argument("--new-tokens", type=int, default=128, help="new tokens per row (default 128)")
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions per sampler, median reported")
    ap.add_argument("--train-steps", type=int, default=3, help="training steps timed (the first is a warm-up)")
    ap.add_argument("--qwen-size", choices=sorted(QWEN_SIZES), default="0.5b", help="shapes of the random Qwen2")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="stop starting work this many seconds after the start (default 420)")
    ap.add_argument("--out", type=Path, default=None, help="also write DIR/cuda.jsonl and DIR/cuda_checks.json")
    return smoke.parse_args(ap, argv, models=f"sample_policy,{QWEN}", batch=4, new_tokens=8, reps=1, train_steps=2,
                            qwen_size="tiny")


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded
    sys.exit(main(parse_args()))
