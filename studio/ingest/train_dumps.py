"""Readers of trainer dumps that log the log-probs of every token, each record to
:class:`~studio.ingest.trajectories.Trajectory` (field names as the framework's code writes them):

- ``nemo-rl``: NeMo-RL's GRPO training data, ``train_data_step{N}.jsonl`` (``nemo_rl/algorithms/grpo.py``,
  ``logger.log_batched_dict_as_jsonl``): ``content`` (each message's text: the templated prompt, then the
  response), ``rewards``, ``input_lengths``, and per token of the whole padded sequence (prompt and
  response) ``generation_logprobs`` (the generation backend's: the behaviour side), ``prev_logprobs``
  (the policy's forward pass: the recomputed side) and, in newer versions, ``token_ids``,
  ``token_loss_mask`` (1 on the tokens trained on), ``advantages``.

- ``slime``: slime's ``--save-debug-rollout-data`` files (``slime/ray/rollout.py``: ``torch.save`` of
  ``{"rollout_id", "samples": [Sample.to_dict(), ...]}``, :func:`read_torch_samples`): ``prompt`` (text
  or messages), ``tokens`` (prompt and response ids), ``response_length``, ``response``, ``loss_mask``
  and ``rollout_log_probs`` (over the response: the behaviour side; slime recomputes the training side
  in the actor and does not dump it), ``reward`` (a number, or a dict of them), ``label``, ``group_index``;
  the training step is the ``rollout_id``.

NeMo-RL: the response starts at the first token of the loss mask; later tokens outside it (an environment's
turn) are tool tokens, with no log-prob on either side. A dump without ``token_ids`` and
``token_loss_mask`` imports its text and reward only (the log-prob lists cannot be placed).
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from backends import Turn
from studio.ingest.errors import Bad, ImportFormatError
from studio.ingest.formats import ColumnMapping
from studio.ingest.normalise import _py_int
from studio.ingest.trajectories import (
    Trajectory,
    as_ids,
    as_logprobs,
    as_mask,
    masked_stats,
    number,
    prompt_of,
    token_turns,
)

Decode = Callable[[list[int]], list[str] | None]
NEMO_SIDES = (("logprobs", "generation_logprobs"), ("train_logprobs", "prev_logprobs"))


def _padded(rec: dict, name: str, n: int) -> list:
    """A per-token list of the padded sequence: its first ``n`` entries (the sequence's own)."""
    v = rec.get(name)
    if not isinstance(v, list):
        raise Bad(f"{name!r} must be a list")
    if len(v) < n:
        raise Bad(f"{name} has {len(v)} values for {n} tokens")
    return v[:n]


def nemo_rl(rec: dict, m: ColumnMapping, file_step: int | None, decode: Decode) -> list[Trajectory]:
    """One NeMo-RL training sample: the response's tokens (from the first trained token) with both log-probs."""
    n = rec.get("input_lengths")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise Bad(f"'input_lengths' must be a token count, got {str(n)[:40]!r}")
    content = rec.get("content")
    if not isinstance(content, list) or not content or not all(isinstance(c, str) for c in content):
        raise Bad("'content' must be a list of message texts (the prompt first)")
    step = _py_int(rec.get(m.step or "step"), m.step or "step")
    tok: dict[str, Any] = {"turns": [Turn("assistant", None, None, "".join(content[1:]))]}
    adv = None
    if rec.get("token_ids") is not None and rec.get("token_loss_mask") is not None:
        ids = as_ids(_padded(rec, "token_ids", n), "token_ids")
        mask = as_mask(_padded(rec, "token_loss_mask", n), "token_loss_mask", n, "token_ids")
        start = mask.index(True) if True in mask else n
        ids, mask = ids[start:], mask[start:]
        texts = decode(ids) if ids else []
        tok = {"token_ids": ids, "token_texts": texts, "trained": mask, "turns": token_turns(mask, texts),
               "sources": {}}
        for fld, name in NEMO_SIDES:
            if rec.get(name) is not None:
                values = as_logprobs(_padded(rec, name, n)[start:], name, len(ids), "token_ids")
                tok[fld], tok["sources"][fld] = masked_stats(values, mask), name
        if isinstance(rec.get("advantages"), list) and start < n:
            adv = number(_padded(rec, "advantages", n)[start], "advantages")
    else:
        for _, name in NEMO_SIDES:  # still checked: a dump with bad log-probs is named, not half-read
            if rec.get(name) is not None:
                _padded(rec, name, n)
    return [Trajectory(prompt=prompt_of(None, content[0]), completion="".join(content[1:]),
                       total=number(rec.get("rewards"), "rewards"), advantage=adv,
                       step=file_step if step is None else step, **tok)]


def read_torch_samples(path: Path) -> list[tuple[int, Any]]:
    """slime's rollout dump: its samples as ``(1-based index, record)``, each with the dump's
    ``rollout_id`` as its ``step`` (loaded with ``weights_only``: plain values only, no code runs).

    Raises:
        ImportFormatError: not a torch file of ``{"rollout_id", "samples"}``.
    """
    import torch  # only a .pt import needs it

    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises pickle / runtime / zip errors of several kinds
        raise ImportFormatError(f"{path}: not a torch file of plain values ({str(exc).splitlines()[0][:200]})") \
            from None
    if not isinstance(obj, dict) or not isinstance(obj.get("samples"), list):
        raise ImportFormatError(f"{path}: not a slime rollout dump (a dict with 'rollout_id' and 'samples')")
    step = obj.get("rollout_id")
    return [(i + 1, {"step": step, **r} if isinstance(r, dict) and isinstance(step, int) else r)
            for i, r in enumerate(obj["samples"])]


def slime(rec: dict, m: ColumnMapping, file_step: int | None, decode: Decode) -> list[Trajectory]:
    """One slime ``Sample``: its response's tokens (the last ``response_length`` of ``tokens``) with the
    sampler's log-probs; ``loss_mask`` 0 on a multi-turn sample's tool tokens."""
    tokens = as_ids(rec.get("tokens"), "tokens")
    n = rec.get("response_length")
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= len(tokens):
        raise Bad(f"'response_length' must be a token count up to the {len(tokens)} tokens, got {str(n)[:40]!r}")
    ids = tokens[len(tokens) - n:]
    mask = as_mask(rec["loss_mask"], "loss_mask", n, "response_length") if rec.get("loss_mask") is not None \
        else [True] * n
    lp = rec.get("rollout_log_probs")
    texts = decode(ids) if ids else []
    reward = rec.get("reward")
    comps = {k: number(v, k) for k, v in reward.items()} if isinstance(reward, dict) else {}
    prompt = rec.get("prompt")
    response = rec.get("response")
    label = rec.get("label")
    group = rec.get(m.group) if m.group else rec.get("group_index")
    step = _py_int(rec.get(m.step or "step"), m.step or "step")
    return [Trajectory(
        prompt=prompt_of(prompt, None) if isinstance(prompt, list) else prompt_of(None, str(prompt or "")),
        completion=response if isinstance(response, str) else None,
        total=sum(v for v in comps.values() if v is not None) if comps else number(reward, "reward"),
        components=comps, step=file_step if step is None else step, group=None if group is None else str(group),
        gold=None if label is None else json.dumps({"answer": label}, default=str),
        token_ids=ids, token_texts=texts, trained=mask, turns=token_turns(mask, texts),
        logprobs=masked_stats(as_logprobs(lp, "rollout_log_probs", n, "response_length"), mask)
        if lp is not None else None, sources={"logprobs": "rollout_log_probs"})]
