"""The agent loop against a remote backend: turns sampled by the server, tools answered here.

``RemotePolicy.sample_agent`` / ``branch_agent`` (the interface of ``backends.agent``) run the
loop in this process, round by round: one ``/v1/completions`` request samples the next
assistant turn of every unfinished trajectory (the extension's ``studio.call_end`` ends each
row at its tool call; a later round's prompts are token ids: prompt, turns so far), then each
closed call is answered by the environment, the answer's tokens (the backend's ``/tokenize``)
appended masked, and the trajectories that go on are sent again. The server keeps no state
between rounds. The first round is what the local loop samples for the same seed; later rounds
draw other tokens (the server sees each round as a new request), with the same turn structure,
masks, tool turns and exact statistics. Needs the extension (``ExtensionRequired`` otherwise).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..trajectory import Trajectory, kept_turns
from ..types import AgentEnv, Generation, Turn
from .errors import ExtensionRequired
from .generations import sorted_choices

if TYPE_CHECKING:
    from .policy import RemotePolicy

ROUND_SEED = 7919  # round r of a loop seeded s samples with seed s + r * ROUND_SEED


class _Row:
    """A trajectory and its statistics so far (lists, one entry per token)."""

    def __init__(self, traj: Trajectory, k: int):
        self.traj, self.k = traj, k
        self.lp: list[float] = []
        self.ent: list[float] = []
        self.tki: list[list[int]] = []
        self.tkl: list[list[float]] = []

    def masked(self, n: int) -> None:
        """``n`` tokens without statistics (a tool's answer, or a masked prefix token)."""
        self.lp += [np.nan] * n
        self.ent += [np.nan] * n
        self.tki += [[-1] * self.k] * n
        self.tkl += [[np.nan] * self.k] * n


def sample_agent(policy: RemotePolicy, prompts: list[str], env: AgentEnv, n: int = 1, max_turns: int = 8,
                 max_new_tokens: int = 256, temperature: float = 1.0, top_p: float = 1.0, seed: int = 0,
                 top_k_stats: int = 5) -> list[Generation]:
    """See ``backends.agent.sample_agent``: ``n`` trajectories per prompt, prompt-major."""
    if not prompts:
        return []
    info = _extension(policy)
    rows = [_Row(Trajectory(b // n, b % n, prompts[b // n]), top_k_stats) for b in range(len(prompts) * n)]
    body = {"model": info.model, "prompt": list(prompts), "n": n, "temperature": temperature, "top_p": top_p,
            "max_tokens": max_new_tokens, "seed": seed,
            "studio": {"stats": True, "top_k": top_k_stats, "call_end": env.call_end}}
    _take(policy, rows, policy._call("POST", "/v1/completions", body), env, max_turns, max_new_tokens, 0)
    _rounds(policy, rows, env, max_turns, max_new_tokens, temperature, top_p, seed, top_k_stats)
    return _finish(policy, rows)


def branch_agent(policy: RemotePolicy, prompt: str, prefix_ids: list[int], prefix_mask: list[bool] | None,
                 prefix_turns: list[Turn] | None, choices: list[int | None], env: AgentEnv, n: int = 1,
                 max_turns: int = 8, max_new_tokens: int = 256, temperature: float = 1.0, top_p: float = 1.0,
                 seed: int = 0, top_k_stats: int = 5) -> list[Generation]:
    """See ``backends.agent.branch_agent``: the first round is the server's fork request (prefix
    teacher-forced, each choice forced), the loop goes on from there."""
    info = _extension(policy)
    P = len(prefix_ids)
    mask = [True] * P if prefix_mask is None else [bool(m) for m in prefix_mask]
    if len(mask) != P:
        raise ValueError(f"a loss mask of {len(mask)} entries for a prefix of {P} tokens")
    kept, turn_start = kept_turns(prefix_turns, P)
    choices = list(dict.fromkeys(choices))  # the server branches each distinct choice once
    rows = [_Row(Trajectory(b // n, b % n, prompt, prefix_ids, mask, list(kept), turn_start), top_k_stats)
            for b in range(len(choices) * n)]
    body = {"model": info.model, "prompt": prompt, "n": n, "temperature": temperature, "top_p": top_p,
            "max_tokens": max_new_tokens, "seed": seed,
            "studio": {"stats": True, "top_k": top_k_stats, "prefix": [int(i) for i in prefix_ids],
                       "choices": [None if c is None else int(c) for c in choices], "call_end": env.call_end}}
    resp = policy._call("POST", "/v1/completions", body)
    for row, c in zip(rows, sorted_choices(resp), strict=True):  # the prefix's statistics: its policy tokens only
        s = c["studio"]
        for t in range(P):
            if mask[t]:
                row.lp.append(s["logprobs"][t])
                row.ent.append(s["entropies"][t])
                row.tki.append(s["topk_ids"][t])
                row.tkl.append(s["topk_logprobs"][t])
            else:
                row.masked(1)
    _take(policy, rows, resp, env, max_turns, max_new_tokens, P)
    _rounds(policy, rows, env, max_turns, max_new_tokens, temperature, top_p, seed, top_k_stats)
    return _finish(policy, rows)


def _extension(policy: RemotePolicy):
    info = policy.info()
    if not info.extension:
        raise ExtensionRequired(
            f"the agent loop needs the rollout-studio extension (turns that end at a tool call, "
            f"'studio.call_end'), which the server at {policy.url} does not offer. Serve the policy with "
            "`rollout-studio backend --policy PATH`, or use a local policy folder")
    return info


def _rounds(policy, rows: list[_Row], env: AgentEnv, max_turns: int, budget: int, temperature: float, top_p: float,
            seed: int, k: int) -> None:
    """Sample the next turn of every unfinished trajectory, one request per round, until all end."""
    prompt_ids: dict[str, list[int]] = {}
    r = 1
    while True:
        live = [row for row in rows if not row.traj.done]
        if not live:
            return
        for row in live:
            if row.traj.prompt not in prompt_ids:
                prompt_ids[row.traj.prompt] = policy.tokenizer(row.traj.prompt)["input_ids"]
        body = {"model": policy.info().model, "prompt": [prompt_ids[row.traj.prompt] + row.traj.ids for row in live],
                "n": 1, "temperature": temperature, "top_p": top_p,
                "max_tokens": max(budget - len(row.traj.ids) for row in live), "seed": seed + r * ROUND_SEED,
                "studio": {"stats": True, "top_k": k, "call_end": env.call_end}}
        _take(policy, live, policy._call("POST", "/v1/completions", body), env, max_turns, budget, 0)
        r += 1


def _take(policy, rows: list[_Row], resp: dict, env: AgentEnv, max_turns: int, budget: int, skip: int) -> None:
    """Add each choice's turn to its row (``skip``: the prefix tokens a fork's choices repeat), and
    answer the calls that closed."""
    call_ids = policy.tokenizer(env.call_end, add_special_tokens=False)["input_ids"]
    for row, c in zip(rows, sorted_choices(resp), strict=True):
        s, traj = c["studio"], row.traj
        ids = s["token_ids"][skip:]
        for t, tok in enumerate(ids):
            row.lp.append(s["logprobs"][skip + t])
            row.ent.append(s["entropies"][skip + t])
            row.tki.append(s["topk_ids"][skip + t])
            row.tkl.append(s["topk_logprobs"][skip + t])
            stop = t == len(ids) - 1 and s.get("finish_reason") == "stop"
            if traj.add(tok, stop, call_ids, max_turns, budget):
                reply = env.reply(traj.prompt_index, policy.tokenizer.decode(traj.call_ids()))
                answer = policy.tokenizer(reply.text, add_special_tokens=False)["input_ids"] if reply.text else []
                row.masked(len(traj.answer(reply, answer, budget)))
                break
            if traj.done:
                break
        if not traj.done and (not ids or s.get("finish_reason") == "length"):  # nothing more will come
            traj.end("length")


def _finish(policy, rows: list[_Row]) -> list[Generation]:
    out = []
    for row in rows:
        traj = row.traj
        if not traj.done:
            traj.end("length")
        T = len(traj.ids)
        out.append(traj.generation(policy.tokenizer.pieces(traj.ids), policy.tokenizer.decode, row.lp[:T],
                                   row.ent[:T], row.tki[:T], row.tkl[:T]))
    return out
