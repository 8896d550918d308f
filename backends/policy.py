"""Policy backend: sample completions with per-token statistics, and score given ones.

Works with any local transformers causal-LM folder (the sample policy, or a user's
Qwen/Llama). Statistics are computed on the fly at every decoding step from that step's
logits and the logits are dropped, so memory does not grow with vocabulary x length the
way ``generate(output_scores=True)`` does.

Every statistic describes the policy's own distribution pi(.|ctx) (temperature 1, no
top-p), whatever the sampling temperature: that is the distribution training optimises.
- ``logprob``: log pi(y_t | ctx) of the token actually generated.
- ``entropy``: H_t = -sum_v pi(v|ctx) log pi(v|ctx) over the full vocabulary (nats).
- ``topk_ids`` / ``topk_logprobs``: the k most likely tokens under pi and their logprobs.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .device import pick_device


class PolicyLoadError(ValueError):
    """The given path is not a loadable causal-LM folder; the message says why."""


@dataclass
class Generation:
    """One completion and its per-token statistics (arrays have one row per token)."""

    prompt_index: int
    sample_idx: int
    prompt: str
    text: str
    token_ids: np.ndarray  # [T] int64
    token_texts: list[str]
    logprobs: np.ndarray  # [T] float32
    entropies: np.ndarray  # [T] float32
    topk_ids: np.ndarray  # [T, k] int64
    topk_logprobs: np.ndarray  # [T, k] float32
    finish_reason: str  # "stop" (end token sampled) or "length" (max_new_tokens reached)

    @property
    def n_tokens(self) -> int:
        return int(self.token_ids.shape[0])


def token_texts(tokenizer, ids: list[int], window: int = 4) -> list[str]:
    """Display text of each token, decoded in context so that multi-byte characters and
    sentencepiece's leading spaces come out right; special tokens keep their names."""
    out = []
    for i in range(len(ids)):
        lo = max(0, i - window)
        before = tokenizer.decode(ids[lo:i], skip_special_tokens=False) if i > lo else ""
        upto = tokenizer.decode(ids[lo : i + 1], skip_special_tokens=False)
        out.append(upto[len(before):] if upto.startswith(before) else tokenizer.decode([ids[i]]))
    return out


def _stop_ids(model, tokenizer) -> list[int]:
    ids = model.generation_config.eos_token_id
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def _left_pad(tokenizer, prompts: list[str], device) -> tuple[torch.Tensor, torch.Tensor]:
    enc = [tokenizer(p)["input_ids"] for p in prompts]
    if any(len(e) == 0 for e in enc):
        raise ValueError("every prompt must encode to at least one token")
    width = max(map(len, enc))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (width - len(e)) + e for e in enc], device=device)  # [B, L]
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in enc], device=device)
    return ids, mask


def _sampling_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Distribution to draw from: temperature-scaled, then nucleus-truncated.  [B, V]"""
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        drop = sorted_p.cumsum(-1) - sorted_p > top_p  # keep the smallest set reaching top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    return probs


@torch.inference_mode()
def sample_batch(model, tokenizer, prompts: list[str], n: int = 1, temperature: float = 1.0,
                 top_p: float = 1.0, max_new_tokens: int = 64, seed: int = 0,
                 top_k_stats: int = 5) -> list[Generation]:
    """Sample ``n`` completions per prompt with a KV cache, recording per-token statistics.

    Args:
        prompts: prompt texts; completions come back prompt-major (prompt 0's n samples first).
        temperature: 0 means greedy decoding.
        top_p: nucleus sampling mass (1.0 disables it).
        seed: seeds a private generator, so results do not depend on global RNG state.
        top_k_stats: how many most-likely alternatives to record per token.
    """
    device = next(model.parameters()).device
    rows = [p for p in prompts for _ in range(n)]
    ids, attn = _left_pad(tokenizer, rows, device)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)  # [B, L]
    B, k = ids.shape[0], top_k_stats
    gen = torch.Generator(device=device).manual_seed(seed)
    stop = torch.tensor(_stop_ids(model, tokenizer), device=device)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    out_ids = torch.full((B, max_new_tokens), pad_id, dtype=torch.long, device=device)
    out_lp = torch.zeros(B, max_new_tokens, device=device)
    out_ent = torch.zeros(B, max_new_tokens, device=device)
    out_tki = torch.zeros(B, max_new_tokens, k, dtype=torch.long, device=device)
    out_tkl = torch.zeros(B, max_new_tokens, k, device=device)
    lengths = torch.full((B,), max_new_tokens, dtype=torch.long, device=device)
    done = torch.zeros(B, dtype=torch.bool, device=device)

    past, step_ids, step_pos = None, ids, pos
    for t in range(max_new_tokens):
        out = model(input_ids=step_ids, attention_mask=attn, position_ids=step_pos,
                    past_key_values=past, use_cache=True, logits_to_keep=1)
        past = out.past_key_values
        logits = out.logits[:, -1, :].float()  # [B, V]
        logp = torch.log_softmax(logits, dim=-1)  # [B, V]
        probs = logp.exp()
        out_ent[:, t] = -(probs * logp).sum(-1)
        tkl, tki = logp.topk(k, dim=-1)  # [B, k]
        out_tkl[:, t], out_tki[:, t] = tkl, tki
        if temperature == 0:
            nxt = logits.argmax(-1)
        else:
            draw = probs if (temperature == 1.0 and top_p >= 1.0) else _sampling_probs(logits, temperature, top_p)
            nxt = torch.multinomial(draw, 1, generator=gen).squeeze(-1)  # [B]
        nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
        out_ids[:, t] = nxt
        out_lp[:, t] = logp.gather(-1, nxt[:, None]).squeeze(-1)
        hit = torch.isin(nxt, stop) & ~done
        lengths = torch.where(hit, torch.full_like(lengths, t + 1), lengths)
        done |= hit
        if bool(done.all()):
            break
        step_ids = nxt[:, None]
        attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=-1)
        step_pos = step_pos[:, -1:] + 1

    return _to_generations(tokenizer, rows, n, out_ids, out_lp, out_ent, out_tki, out_tkl,
                           lengths, done)


def _to_generations(tokenizer, rows, n, out_ids, out_lp, out_ent, out_tki, out_tkl, lengths, done):
    ids_np, lp_np, ent_np = out_ids.cpu().numpy(), out_lp.cpu().numpy(), out_ent.cpu().numpy()
    tki_np, tkl_np, len_np, done_np = out_tki.cpu().numpy(), out_tkl.cpu().numpy(), lengths.cpu().numpy(), done.cpu().numpy()
    gens = []
    for b, prompt in enumerate(rows):
        L = int(len_np[b])
        tok = ids_np[b, :L].tolist()
        gens.append(Generation(
            prompt_index=b // n, sample_idx=b % n, prompt=prompt,
            text=tokenizer.decode(tok, skip_special_tokens=True),
            token_ids=ids_np[b, :L].astype(np.int64), token_texts=token_texts(tokenizer, tok),
            logprobs=lp_np[b, :L].astype(np.float32), entropies=ent_np[b, :L].astype(np.float32),
            topk_ids=tki_np[b, :L].astype(np.int64), topk_logprobs=tkl_np[b, :L].astype(np.float32),
            finish_reason="stop" if done_np[b] else "length",
        ))
    return gens


@torch.inference_mode()
def score_batch(model, tokenizer, prompts: list[str], completions: list[str | list[int]],
                top_k_stats: int = 5, batch_size: int = 8) -> list[Generation]:
    """Teacher-forced statistics of given completions: the same fields as sampling.

    A completion is text (tokenized without special tokens) or a list of token ids.
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    out: list[Generation] = []
    for lo in range(0, len(prompts), batch_size):
        chunk_p, chunk_c = prompts[lo:lo + batch_size], completions[lo:lo + batch_size]
        p_ids = [tokenizer(p)["input_ids"] for p in chunk_p]
        c_ids = [c if isinstance(c, list) else tokenizer(c, add_special_tokens=False)["input_ids"] for c in chunk_c]
        seqs = [p + c for p, c in zip(p_ids, c_ids)]
        width = max(map(len, seqs))
        ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs], device=device)  # [B, T]
        attn = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs], device=device)
        hidden = model(input_ids=ids, attention_mask=attn, output_hidden_states=True).hidden_states[-1]
        head = model.get_output_embeddings()
        for b, (p, c) in enumerate(zip(p_ids, c_ids)):
            P, C = len(p), len(c)
            if C == 0:
                stats = (np.zeros(0, np.float32),) * 2 + (np.zeros((0, top_k_stats), np.int64), np.zeros((0, top_k_stats), np.float32))
            else:
                logits = head(hidden[b, P - 1 : P + C - 1]).float()  # [C, V], position t predicts token t+1
                logp = torch.log_softmax(logits, -1)
                target = torch.tensor(c, device=device)
                tkl, tki = logp.topk(top_k_stats, -1)
                stats = (logp.gather(-1, target[:, None]).squeeze(-1).cpu().numpy(),
                         (-(logp.exp() * logp).sum(-1)).cpu().numpy(),
                         tki.cpu().numpy(), tkl.cpu().numpy())
            stop = set(_stop_ids(model, tokenizer))
            out.append(Generation(
                prompt_index=lo + b, sample_idx=0, prompt=chunk_p[b],
                text=tokenizer.decode(c, skip_special_tokens=True), token_ids=np.asarray(c, np.int64),
                token_texts=token_texts(tokenizer, c), logprobs=stats[0].astype(np.float32),
                entropies=stats[1].astype(np.float32), topk_ids=stats[2].astype(np.int64),
                topk_logprobs=stats[3].astype(np.float32),
                finish_reason="stop" if c and c[-1] in stop else "length",
            ))
    return out


def check_policy_folder(path: Path) -> None:
    """Raise :class:`PolicyLoadError` unless ``path`` looks like a saved causal-LM folder."""
    path = Path(path)
    if not path.exists():
        raise PolicyLoadError(f"policy folder {str(path)!r} does not exist")
    if not path.is_dir():
        raise PolicyLoadError(f"policy {str(path)!r} is a file; give the folder written by save_pretrained")
    if not (path / "config.json").is_file():
        raise PolicyLoadError(
            f"{str(path)!r} is not a transformers model folder: it has no config.json "
            "(expected the output of model.save_pretrained + tokenizer.save_pretrained)")
    weights = list(path.glob("*.safetensors")) + list(path.glob("pytorch_model*.bin"))
    if not weights:
        raise PolicyLoadError(f"{str(path)!r} has a config.json but no weights (*.safetensors or pytorch_model.bin)")


class Policy:
    """A loaded causal LM and its tokenizer, on the device picked for this process."""

    def __init__(self, path: str | Path, device: str | None = None):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.path = Path(path).expanduser().resolve()
        check_policy_folder(self.path)
        self.device = device or pick_device()
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.path)
            dtype = torch.float32 if self.device == "cpu" else "auto"
            self.model = AutoModelForCausalLM.from_pretrained(self.path, dtype=dtype).to(self.device).eval()
        except Exception as exc:  # transformers raises many kinds; the user needs one message
            raise PolicyLoadError(f"could not load the policy in {str(self.path)!r}: {exc}") from exc
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "left"

    @property
    def name(self) -> str:
        return self.path.name

    def describe(self) -> str:
        n = sum(p.numel() for p in self.model.parameters())
        return f"{self.name} ({self.model.config.model_type}, {n / 1e6:.1f}M params, {self.device})"

    def sample(self, prompts: list[str], **kwargs) -> list[Generation]:
        """See :func:`sample_batch`."""
        return sample_batch(self.model, self.tokenizer, prompts, **kwargs)

    def score(self, prompts: list[str], completions: list[str | list[int]], **kwargs) -> list[Generation]:
        """See :func:`score_batch`."""
        return score_batch(self.model, self.tokenizer, prompts, completions, **kwargs)


@functools.lru_cache(maxsize=4)
def _cached(path: str, device: str | None) -> Policy:
    return Policy(path, device)


def load_policy(path: str | Path, device: str | None = None) -> Policy:
    """Load a policy folder once per process (later calls return the same object)."""
    return _cached(str(Path(path).expanduser().resolve()), device)
