"""Readers of the trajectories agent frameworks dump, one per format, each record to
:class:`~studio.ingest.trajectories.Trajectory` (field names as each framework's code writes them):

- ``verl-agent``: verl's ``AgentLoopOutput`` (``verl/experimental/agent_loop/agent_loop.py``) one per
  line: ``prompt_ids``, ``response_ids``, ``response_mask`` (0 on tool tokens), ``response_logprobs`` (or
  the batch's ``rollout_log_probs``), ``reward_score``, ``num_turns``, ``extra_fields`` (``raw_prompt``,
  ``turn_scores``, ``tool_rewards``, ``reward_extra_info``; ``tool_agent_loop.py``);
- ``skyrl``: SkyRL's ``GeneratorOutput`` (``skyrl/train/generators/base.py``) one row per line:
  ``prompt_token_ids``, ``response_ids``, ``loss_masks``, ``rewards`` (a number or one per token),
  ``rollout_logprobs``, ``stop_reasons``, ``trajectory_ids`` and, step-wise, ``is_last_step`` (the
  steps of one trajectory are joined);
- ``trl-tools``: what a TRL ``GRPOTrainer`` ``rollout_func`` returns (``prompt_ids``,
  ``completion_ids``, ``logprobs``, ``env_mask``) or its tool loop builds (``tool_mask``), per row;
- ``rllm``: rLLM's ``Episode.to_dict()`` (``rllm/types.py``) one per line: each of its
  ``trajectories`` a rollout, each ``Step`` (``chat_completions``, ``prompt_ids``, ``response_ids``,
  ``logprobs``, ``reward``) an assistant turn after the observations it saw;
- ``openai-chat``: ``messages`` (or ``prompt`` + ``completion``) with ``tool_calls`` and ``tool`` messages;
- ``openai-responses``: Responses items (``input``, ``output``): ``message``, ``reasoning``,
  ``function_call`` / ``custom_tool_call`` and their ``*_output``;
- ``nemo-rl``, ``slime``: NeMo-RL's training data and slime's rollout dumps (:mod:`studio.ingest.train_dumps`).

Token ids without texts are decoded with the import's tokenizer (a policy folder) when it has one.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from backends import Turn
from studio.ingest.errors import Bad, ImportFormatError, Problem
from studio.ingest.formats import ColumnMapping
from studio.ingest.messages import message_turns, responses_messages, split_prompt
from studio.ingest.normalise import Batch, _py_int
from studio.ingest.train_dumps import nemo_rl, slime
from studio.ingest.trajectories import (
    Trajectory,
    as_ids,
    as_logprobs,
    as_mask,
    as_numbers,
    masked_stats,
    number,
    prompt_of,
    token_turns,
    trajectory_batch,
)

Decode = Callable[[list[int]], "list[str] | None"]
_TERMINATION = {"max_prompt_length_exceeded": "length", "max_response_length_exceeded": "length",
                "env_done": "stop", "max_turns_exceeded": "turns"}  # rLLM's TerminationReason


def decoder(tokenizer: str | Path | None) -> Decode:
    """Token ids -> their texts with a policy folder's tokenizer; without one, None (ids stay undecoded)."""
    if tokenizer is None:
        return lambda ids: None
    from studio.workers.vocab import decode_ids

    return lambda ids: decode_ids(str(tokenizer), ids)


def check_tokenizer(tokenizer: str | Path | None) -> None:
    """Refuse a tokenizer that cannot decode: neither a backend URL nor a folder with a ``tokenizer.json``.

    Raises:
        ImportFormatError: naming the folder.
    """
    from studio.workers.vocab import is_policy_url, resolve_policy

    if tokenizer is None or is_policy_url(str(tokenizer)):
        return
    folder = resolve_policy(str(tokenizer))
    if not (Path(folder) / "tokenizer.json").is_file():
        raise ImportFormatError(f"tokenizer {tokenizer}: {folder} has no tokenizer.json (name a policy folder, "
                                "or sample-chat)")


def _common(rec: dict, m: ColumnMapping, file_step: int | None) -> dict:
    """Step (the record's, else the file name's), group and gold answer: top-level fields."""
    step = _py_int(rec.get(m.step or "step", rec.get("global_step")), m.step or "step")
    group = rec.get(m.group) if m.group else None
    gold = rec.get(m.gold or "gold", rec.get("ground_truth"))
    return {"step": file_step if step is None else step, "group": None if group is None else str(group),
            "gold": None if gold is None else json.dumps({"answer": gold}, default=str)}


def _tokens(ids: list[int], mask: list[bool], logprobs: list | None, decode: Decode) -> dict:
    texts = decode(ids) if ids else []
    return {"token_ids": ids, "token_texts": texts, "logprobs": masked_stats(logprobs, mask), "trained": mask,
            "turns": token_turns(mask, texts) if ids else [Turn("assistant", 0, 0, "")]}


def _prompt_text(ids: list[int], decode: Decode) -> str | None:
    texts = decode(ids)
    return None if texts is None else "".join(texts)


def _token_prompt(messages: list | None, ids: list[int], decode: Decode) -> tuple:
    """The prompt of a token format: its messages where the record keeps them, its ids decoded, else (no
    tokenizer) a text saying so, keyed by the ids (the same ids are one prompt, one group)."""
    templated = _prompt_text(ids, decode)
    if messages or templated is not None:
        return prompt_of(messages, templated)
    text = f"(a prompt of {len(ids)} token ids: import with a tokenizer to read it)"
    return text, f"{text} {ids}", None, None


def _numbers(d: Any, skip: tuple = ()) -> dict[str, float]:
    """The numeric values of a dict (a record's reward components, a reward's extra info) but those of ``skip``."""
    if not isinstance(d, dict):
        return {}
    return {str(k): float(v) for k, v in d.items()
            if k not in skip and isinstance(v, (int, float)) and not isinstance(v, bool) and v == v}


def _run_turns(turns) -> list[int]:
    """The turns that are runs of the mask's 1s (an assistant message's further calls span no tokens)."""
    return [i for i, t in enumerate(turns) if t.role == "assistant" and (t.end > t.start or len(turns) == 1)]


def _add(rewards: dict[int, float], turn: int, value: float | None) -> None:
    if value is not None:
        rewards[turn] = rewards.get(turn, 0.0) + value


# ------------------------------------------------------------------------------------------- verl

def verl_agent(rec: dict, m: ColumnMapping, file_step: int | None, decode: Decode) -> list[Trajectory]:
    """verl's agent loop: turn scores (an interaction's reward for each assistant turn) and tool rewards
    (one per call) become per-turn rewards of the assistant turn they follow."""
    ids = as_ids(rec.get("response_ids"), "response_ids")
    mask = as_mask(rec.get("response_mask"), "response_mask", len(ids), "response_ids")
    lp_name = "response_logprobs" if rec.get("response_logprobs") is not None else "rollout_log_probs"
    lp = rec.get(lp_name)
    logprobs = as_logprobs(lp, lp_name, len(ids), "response_ids") if lp is not None else None
    tok = _tokens(ids, mask, logprobs, decode)
    old = rec.get("old_log_probs")  # the trainer's recomputed log-probs, where the dump kept the batch's
    tok["train_logprobs"] = masked_stats(as_logprobs(old, "old_log_probs", len(ids), "response_ids"), mask) \
        if old is not None else None
    tok["sources"] = {"logprobs": lp_name, "train_logprobs": "old_log_probs"}
    extra = rec.get("extra_fields") or {}
    if not isinstance(extra, dict):
        raise Bad("'extra_fields' must be an object")
    turns = tok["turns"]
    per_turn: dict[int, float] = {}
    runs = _run_turns(turns)
    scores = extra.get("turn_scores") or []
    if not isinstance(scores, list):
        raise Bad("'extra_fields.turn_scores' must be a list")
    if len(scores) > len(runs):
        raise Bad(f"'extra_fields.turn_scores' has {len(scores)} scores but the response has {len(runs)} "
                  "assistant turns")
    for k, v in enumerate(scores):
        _add(per_turn, runs[k], number(v, "turn_scores"))
    tool_rewards = extra.get("tool_rewards") or []
    if not isinstance(tool_rewards, list):
        raise Bad("'extra_fields.tool_rewards' must be a list")
    callers = [i for i, t in enumerate(turns) if t.role == "assistant" and (t.tool_name or t.tool_args) is not None]
    if tok["token_texts"] is None:
        # the calls cannot be read: one reward per tool turn credits the turn before it; more (a turn made
        # several calls) cannot be placed, and are left out
        callers = [i - 1 for i, t in enumerate(turns) if t.role == "tool" and i > 0]
        tool_rewards = tool_rewards if len(tool_rewards) == len(callers) else []
    if len(tool_rewards) > len(callers):
        raise Bad(f"'extra_fields.tool_rewards' has {len(tool_rewards)} rewards but the response has "
                  f"{len(callers)} tool calls")
    for k, v in enumerate(tool_rewards):
        _add(per_turn, callers[k], number(v, "tool_rewards"))
    raw = extra.get("raw_prompt")
    prompt_ids = as_ids(rec.get("prompt_ids"), "prompt_ids")
    return [Trajectory(prompt=_token_prompt(raw if isinstance(raw, list) else None, prompt_ids, decode),
                       total=number(rec.get("reward_score"), "reward_score"),
                       components=_numbers(extra.get("reward_extra_info")), turn_rewards=per_turn,
                       **tok, **_common(rec, m, file_step))]


# ------------------------------------------------------------------------------------------- TRL

_TRL_KNOWN = {"step", "global_step", "advantage", "prompt_ids", "completion_ids", "logprobs", "env_mask", "tool_mask"}


def trl_tools(rec: dict, m: ColumnMapping, file_step: int | None, decode: Decode) -> list[Trajectory]:
    """TRL's tool loop or a rollout function: every other numeric field is a reward function's score."""
    ids = as_ids(rec.get("completion_ids"), "completion_ids")
    mask_name = "env_mask" if rec.get("env_mask") is not None else "tool_mask"
    mask = as_mask(rec.get(mask_name), mask_name, len(ids), "completion_ids")
    lp = rec.get("logprobs")
    if isinstance(lp, list) and lp and all(isinstance(v, list) for v in lp):  # a top-k list per token: the sampled one
        lp = [v[0] if v else None for v in lp]
    logprobs = as_logprobs(lp, "logprobs", len(ids), "completion_ids") if lp is not None else None
    prompt = rec.get("prompt")
    prompt_ids = as_ids(rec.get("prompt_ids"), "prompt_ids")
    comps = _numbers(rec, (*_TRL_KNOWN, m.step, m.group, m.gold))
    completion = rec.get("completion")
    return [Trajectory(prompt=prompt_of(None, prompt) if isinstance(prompt, str) else
                       _token_prompt(prompt if isinstance(prompt, list) else None, prompt_ids, decode),
                       completion=completion if isinstance(completion, str) else None,
                       total=sum(comps.values()) if comps else None, components=comps,
                       advantage=number(rec.get("advantage"), "advantage"), sources={"logprobs": "logprobs"},
                       **_tokens(ids, mask, logprobs, decode), **_common(rec, m, file_step))]


# ------------------------------------------------------------------------------------------- SkyRL

def _trajectory_id(v: Any) -> tuple[str, str]:
    """``(trajectory key, instance id)`` of SkyRL's ``TrajectoryID`` (an object, or its ``to_string()``)."""
    if isinstance(v, dict):
        return f"{v.get('instance_id')}_{v.get('repetition_id')}", str(v.get("instance_id"))
    return str(v), str(v).rsplit("_", 1)[0]


def skyrl_steps(steps: list[dict], m: ColumnMapping, file_step: int | None, decode: Decode) -> Trajectory:
    """One SkyRL trajectory from its rows (a single row, or the steps of a step-wise one, in order): the
    responses (each with its observation's tokens, masked) joined. A per-token reward is credited to the
    assistant turn its token falls in (or follows); a step's single number, step-wise, to the step's last
    assistant turn; a whole trajectory's single number is its total only."""
    ids: list[int] = []
    mask: list[bool] = []
    logprobs: list | None = []
    credits: list[tuple[int, float]] = []  # (token position, reward)
    total: list[float] = []
    for row in steps:
        r_ids = as_ids(row.get("response_ids"), "response_ids")
        r_mask = as_mask(row.get("loss_masks"), "loss_masks", len(r_ids), "response_ids")
        lp = row.get("rollout_logprobs")
        logprobs = logprobs + as_logprobs(lp, "rollout_logprobs", len(r_ids), "response_ids") \
            if logprobs is not None and lp is not None else None
        r = row.get("rewards")
        if isinstance(r, list):
            per_token = as_numbers(r, "rewards", len(r_ids), "response_ids")
            credits += [(len(ids) + i, v) for i, v in enumerate(per_token) if v]
            total += [v for v in per_token if v is not None]
        elif (v := number(r, "rewards")) is not None:
            total.append(v)
            trained = [i for i, t in enumerate(r_mask) if t]
            if len(steps) > 1 and trained:
                credits.append((len(ids) + trained[-1], v))
        ids += r_ids
        mask += r_mask
    tok = _tokens(ids, mask, logprobs, decode)
    turns, per_turn = tok["turns"], {}
    of_token = [0] * len(ids)
    for i, t in enumerate(turns):
        of_token[t.start:t.end] = [i] * (t.end - t.start)
    for pos, v in credits:
        i = of_token[pos]
        while i > 0 and turns[i].role != "assistant":
            i -= 1
        _add(per_turn, i, v)
    first, last = steps[0], steps[-1]
    prompt_ids = as_ids(first.get("prompt_token_ids"), "prompt_token_ids")
    common = _common(first, m, file_step)
    if first.get("trajectory_ids") is not None and common["group"] is None:
        common["group"] = _trajectory_id(first["trajectory_ids"])[1]  # the prompt's instance: one GRPO group
    fin = last.get("stop_reasons")
    return Trajectory(prompt=_token_prompt(None, prompt_ids, decode), total=sum(total) if total else None,
                      turn_rewards=per_turn, sources={"logprobs": "rollout_logprobs"},
                      finish_reason=fin if isinstance(fin, str) else None, **tok, **common)


def skyrl_unfinished(recs: list[tuple[int, Any]]) -> int | None:
    """The first line from which a file being written holds a step-wise trajectory whose last step is not
    there yet (a tail poll leaves it, and what follows, for the next poll); None when all are finished."""
    cut = None
    while True:
        open_: dict[str, int] = {}  # trajectory key -> its first line
        for line, rec in recs:
            if cut is not None and line >= cut:
                break
            if isinstance(rec, dict) and rec.get("is_last_step") is not None:
                key = _trajectory_id(rec.get("trajectory_ids"))[0]
                if rec["is_last_step"]:
                    open_.pop(key, None)
                else:
                    open_.setdefault(key, line)
        if not open_:
            return cut
        cut = min(open_.values())  # earlier than before: the trajectories it cuts short move it again


def skyrl_batch(recs: list[tuple[int, Any]], m: ColumnMapping, file_step: int | None, file: str,
                decode: Decode) -> tuple[list[Trajectory], list[Problem]]:
    """SkyRL rows: a step-wise row (``is_last_step`` set) waits for the rest of its trajectory; a
    trajectory that never reaches its last step in the file is a problem on each of its lines."""
    trajs: list[Trajectory] = []
    problems: list[Problem] = []
    open_: dict[str, list] = {}  # trajectory key -> its steps so far (line, record)
    for line, rec in recs:
        if not isinstance(rec, dict):
            problems.append(Problem(file, line, "expected a JSON object"))
            continue
        last = rec.get("is_last_step")
        if last is None:
            rows = [(line, rec)]
        else:
            key, _ = _trajectory_id(rec.get("trajectory_ids"))
            open_.setdefault(key, []).append((line, rec))
            if not last:
                continue
            rows = open_.pop(key)
        try:
            trajs.append(skyrl_steps([r for _, r in rows], m, file_step, decode))
        except Bad as exc:
            problems += [Problem(file, ln, f"trajectory of {len(rows)} step(s): {exc}") for ln, _ in rows]
    for key, rows in open_.items():
        problems += [Problem(file, ln, f"trajectory {key!r} has no step with is_last_step true in this file")
                     for ln, _ in rows]
    return trajs, problems


# ------------------------------------------------------------------------------------------- messages

def _chat_trajectory(messages: list, rec: dict, m: ColumnMapping, file_step: int | None) -> Trajectory:
    prompt, rest = split_prompt(messages)
    turns, _ = message_turns(rest)
    comps = _numbers(rec, ("step", "global_step", "reward", "score", "advantage", m.step, m.group, m.gold))
    total = number(rec.get("reward", rec.get("score")), "reward")
    fin = rec.get("finish_reason")
    return Trajectory(prompt=prompt_of(prompt, None), turns=turns, total=total if total is not None else
                      (sum(comps.values()) if comps else None), components=comps,
                      advantage=number(rec.get("advantage"), "advantage"),
                      finish_reason=fin if isinstance(fin, str) else None, **_common(rec, m, file_step))


def openai_chat(rec: dict, m: ColumnMapping, file_step: int | None, decode: Decode) -> list[Trajectory]:
    """OpenAI chat messages (``messages``, or a ``prompt`` and a ``completion`` as TRL's conversational
    format splits them); a reward is ``reward`` or ``score``, other numbers its components."""
    if rec.get("messages") is not None:
        messages = rec["messages"]
    else:
        prompt = rec.get("prompt")
        prompt = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        if not isinstance(prompt, list) or not isinstance(rec.get("completion"), list):
            raise Bad("expected 'messages', or 'prompt' and 'completion' messages")
        messages = prompt + rec["completion"]
    return [_chat_trajectory(messages, rec, m, file_step)]


def openai_responses(rec: dict, m: ColumnMapping, file_step: int | None, decode: Decode) -> list[Trajectory]:
    """A Responses conversation: ``instructions`` (a system message), ``input`` (text or items) and
    ``output`` items, or all of them as ``items``."""
    given = rec.get("input")
    items = ([{"role": "user", "content": given}] if isinstance(given, str) else list(given or []))
    items += list(rec.get("output") or rec.get("items") or [])
    messages = responses_messages(items)
    if isinstance(rec.get("instructions"), str):
        messages.insert(0, {"role": "system", "content": rec["instructions"]})
    return [_chat_trajectory(messages, rec, m, file_step)]


# ------------------------------------------------------------------------------------------- rLLM

def _role_of(msg: Any) -> str | None:
    return msg.get("role") if isinstance(msg, dict) else None


def rllm_trajectory(traj: dict, episode: dict, m: ColumnMapping, file_step: int | None,
                    decode: Decode) -> Trajectory:
    """One rLLM trajectory: each step's messages after the previous assistant message (what it observed)
    and its response (the step's last message, else its ``model_response``) as turns, the step's reward on
    its assistant turn. Tokens where every step has them and each step's prompt extends the one before
    with its response (the observation's tokens between them: masked)."""
    steps = traj.get("steps")
    if not isinstance(steps, list) or not steps or not all(isinstance(s, dict) for s in steps):
        raise Bad(f"trajectory {traj.get('name')!r} has no steps")
    msgs, spans, answers, prompt = [], [], [], None
    ids: list[int] | None = []
    mask: list[bool] = []
    logprobs: list | None = []
    seen: list[int] = []  # the context the next step's prompt must extend
    for k, step in enumerate(steps):
        cc = list(step.get("chat_completions") or [])
        if _role_of(cc[-1] if cc else None) != "assistant":
            cc.append({"role": "assistant", "content": step.get("model_response") or ""})
        a = len(cc) - 1
        b = a
        while b > 0 and _role_of(cc[b - 1]) != "assistant":
            b -= 1
        if k == 0:
            prompt, b = cc[:a], a
        new = cc[b:]
        # tokens: this step's observation (its prompt past what came before) and its response
        p_ids, r_ids = step.get("prompt_ids") or [], step.get("response_ids") or []
        if ids is not None and r_ids and (k == 0 or p_ids[:len(seen)] == seen):
            p_ids, r_ids = as_ids(p_ids, "prompt_ids"), as_ids(r_ids, "response_ids")
            obs = p_ids[len(seen):] if k else []
            lp = step.get("logprobs")
            logprobs = logprobs + [None] * len(obs) + as_logprobs(lp, "logprobs", len(r_ids), "response_ids") \
                if logprobs is not None and lp else None
            o0 = len(ids)
            ids += obs + r_ids
            mask += [False] * len(obs) + [True] * len(r_ids)
            seen = p_ids + r_ids
            spans += [(o0, o0 + len(obs)) if j == 0 else (o0 + len(obs), o0 + len(obs)) for j in range(len(new) - 1)]
            spans.append((o0 + len(obs), len(ids)))
        else:
            ids, spans = None, []
        answers.append((len(msgs) + len(new) - 1, number(step.get("reward"), "reward")))
        msgs += new
    turns, first = message_turns(msgs, spans if ids is not None else None)
    per_turn: dict[int, float] = {}
    for i, v in answers:
        _add(per_turn, first[i], v)
    if ids is not None:  # the turns' texts are the messages'; the tokens' texts decoded where a tokenizer is given
        texts = decode(ids)
        tok = {"token_ids": ids, "token_texts": texts, "logprobs": logprobs, "trained": mask}
    else:
        tok = {}
    total = number(traj.get("reward"), "reward")
    comps = {"is_correct": float(bool(episode["is_correct"]))} if episode.get("is_correct") is not None else {}
    task_id = str(episode.get("id") or "").split(":")[0]
    name = traj.get("name") or ""
    common = _common(episode, m, file_step)
    common["group"] = common["group"] or (task_id + (f"/{name}" if name and name != "default_traj_name" else "")
                                          if task_id else None)
    reason = episode.get("termination_reason")
    return Trajectory(prompt=prompt_of(prompt or [{"role": "user", "content": _task_text(episode, traj)}], None),
                      turns=turns,
                      total=total if total is not None else sum(v for _, v in answers if v is not None),
                      components=comps, turn_rewards=per_turn, sources={"logprobs": "logprobs"},
                      finish_reason=_TERMINATION.get(reason, reason) if isinstance(reason, str) else None,
                      **tok, **common)


def _task_text(episode: dict, traj: dict) -> str:
    """A trajectory's task as text, when its steps keep no messages (a task dict's question or instruction)."""
    task = traj.get("task") or episode.get("task")
    if isinstance(task, dict):
        for k in ("question", "instruction", "prompt", "problem"):
            if isinstance(task.get(k), str):
                return task[k]
        return json.dumps(task, ensure_ascii=False, default=str)
    return "" if task is None else str(task)


def rllm(rec: dict, m: ColumnMapping, file_step: int | None, decode: Decode) -> list[Trajectory]:
    """An rLLM episode: each of its trajectories is a rollout (a multi-agent episode's roles group apart)."""
    trajs = rec.get("trajectories")
    if not isinstance(trajs, list) or not trajs or not all(isinstance(t, dict) for t in trajs):
        raise Bad("'trajectories' must be a non-empty list of trajectories")
    return [rllm_trajectory(t, rec, m, file_step, decode) for t in trajs]


READERS = {"verl-agent": verl_agent, "trl-tools": trl_tools, "rllm": rllm, "openai-chat": openai_chat,
           "openai-responses": openai_responses, "nemo-rl": nemo_rl, "slime": slime}


def agent_batch(fmt: str, recs: list[tuple[int, Any]], m: ColumnMapping, file_step: int | None, file: str,
                tokenizer: str | Path | None = None) -> tuple[Batch | None, list[Problem]]:
    """The trajectories of a slice's records as one batch, and the records that could not be read."""
    decode = decoder(tokenizer)
    if fmt == "skyrl":
        trajs, problems = skyrl_batch(recs, m, file_step, file, decode)
    else:
        trajs, problems = [], []
        for line, rec in recs:
            try:
                if not isinstance(rec, dict):
                    raise Bad(f"expected a JSON object, got {type(rec).__name__}")
                trajs += READERS[fmt](rec, m, file_step, decode)
            except Bad as exc:
                problems.append(Problem(file, line, str(exc)))
    return (trajectory_batch(trajs) if trajs else None), problems
