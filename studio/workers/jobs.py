"""The jobs the worker pool runs (:func:`studio.workers.processes.pool`): sample, agent
trajectories, branch (a completion or a trajectory), score, enrich, answer probabilities,
process rewards, values, warm-up.

Each job loads its model inside the worker (cached there by ``backends.load_policy``), and
returns plain records and the version of the weights that made them; jobs never touch the
store: the owner writes what they return. A job refuses (:class:`TokenizerMismatch`) when
the model would read stored token ids as another text. Jobs are submitted to a
``ProcessPoolExecutor`` by reference, so each stays a module-level function of this module.
"""
from __future__ import annotations

from studio.errors import StudioError


class TokenizerMismatch(StudioError, ValueError):
    """A policy's tokenizer does not read a stored rollout's token ids as the rollout's text."""


def policy_version(path: str, dtype: str = "float32") -> str:
    """``<folder>@<hash of its weights>`` (see ``backends.types.weights_version``), with ``~<dtype>``
    appended when the weights are loaded in another dtype than float32 (``folder@hash~bfloat16``:
    statistics of two precisions never share a version); for a backend URL what the backend says
    (``backends.remote.BackendInfo.version``: ``<url>#<folder>@<hash>``, or
    ``<url>#<model>@entropy-est-top20`` from a plain server)."""
    from backends.types import is_policy_url, weights_version

    if is_policy_url(path):
        from backends.remote import load_remote

        return load_remote(path).version
    return weights_version(path) + ("" if dtype == "float32" else f"~{dtype}")


def _version(policy) -> str:
    """:func:`policy_version` of a loaded policy (local: in the dtype it was loaded in)."""
    return policy_version(str(policy.path), getattr(policy, "precision", "float32"))


def sample_job(policy_path: str, prompts: list[str | dict], kwargs: dict) -> tuple[list, str, str]:
    """Runs in a worker: sample completions. Returns (generations, policy_version, device).
    ``kwargs`` are the sampling settings, with ``precision`` the one the policy is loaded in.

    A prompt is a text, or a chat (``{"messages", "thinking"}``) rendered with the policy's
    chat template (``backends.chat``); each generation's ``prompt`` is the text sampled from.
    """
    from backends import load_policy
    from backends.chat import render_all

    kwargs = dict(kwargs)
    policy = load_policy(policy_path, precision=kwargs.pop("precision", "auto"))
    texts = render_all(policy.tokenizer, prompts)
    return policy.sample(texts, **kwargs), _version(policy), policy.device


_SANDBOX = None  # this worker's tool sandbox (studio.workers.tools), started by its first agent job


def tool_sandbox():
    """The tool sandbox of this process (one per worker: its process is reused across jobs)."""
    global _SANDBOX
    if _SANDBOX is None:
        from studio.workers.tools import ToolSandbox

        _SANDBOX = ToolSandbox()
    return _SANDBOX


def agent_job(policy_path: str, task: dict, prompts: list[str | dict], kwargs: dict) -> tuple[list, str, str]:
    """Runs in a worker: sample agent trajectories on a task with tools (``backends.agent``), the
    tools run in this worker's sandbox. ``task`` is the task's spec (``Task.spec``). Returns
    (generations, policy_version, device), as :func:`sample_job`."""
    from backends import load_policy
    from backends.chat import render_all
    from studio.tasks import get_task
    from studio.workers.agent_env import TaskEnv

    kwargs = dict(kwargs)
    policy = load_policy(policy_path, precision=kwargs.pop("precision", "auto"))
    texts = render_all(policy.tokenizer, prompts)
    env = TaskEnv(get_task(task), tool_sandbox())
    return policy.sample_agent(texts, env, **kwargs), _version(policy), policy.device


def branch_job(policy_path: str, prompt: str | dict, prefix_ids: list[int], prefix_text: str,
               choices: list[int | None], kwargs: dict) -> tuple[list, str, str]:
    """Runs in a worker: continue a rollout from a fork (see ``backends.branch_batch``).

    ``prefix_text`` is what the stored tokens before the fork read as; a policy whose
    tokenizer decodes ``prefix_ids`` to something else has a different vocabulary, and its
    branches would continue a different text, so the job refuses.
    """
    from backends import load_policy
    from backends.chat import render

    kwargs = dict(kwargs)
    policy = load_policy(policy_path, precision=kwargs.pop("precision", "auto"))
    prompt = render(policy.tokenizer, prompt)  # a chat: through the policy's template, as Generate renders it
    _check_prefix(policy, policy_path, prefix_ids, prefix_text)
    return policy.branch(prompt, prefix_ids, choices, **kwargs), _version(policy), policy.device


def agent_branch_job(policy_path: str, task: dict, prompt: str | dict, prefix_ids: list[int], prefix_text: str,
                     prefix_mask: list[bool], prefix_turns: list, choices: list[int | None],
                     kwargs: dict) -> tuple[list, str, str]:
    """Runs in a worker: continue an agent trajectory from a fork (``backends.agent.branch_agent``):
    the prefix's turns kept, the loop run on, the tools in this worker's sandbox. Refuses a policy
    whose tokenizer reads the prefix as another text, as :func:`branch_job` does."""
    from backends import load_policy
    from backends.chat import render
    from studio.tasks import get_task
    from studio.workers.agent_env import TaskEnv

    kwargs = dict(kwargs)
    policy = load_policy(policy_path, precision=kwargs.pop("precision", "auto"))
    prompt = render(policy.tokenizer, prompt)
    _check_prefix(policy, policy_path, prefix_ids, prefix_text)
    env = TaskEnv(get_task(task), tool_sandbox())
    gens = policy.branch_agent(prompt, prefix_ids, prefix_mask, prefix_turns, choices, env, **kwargs)
    return gens, _version(policy), policy.device


def _check_prefix(policy, policy_path: str, prefix_ids: list[int], prefix_text: str) -> None:
    """Refuse a policy whose tokenizer reads a stored prefix's ids as another text: its branches
    would continue a different text (another vocabulary)."""
    decoded = policy.tokenizer.decode(prefix_ids, skip_special_tokens=False)
    if decoded != prefix_text:
        raise TokenizerMismatch(
            f"the policy in {policy_path} reads this rollout's token ids as {decoded[:60]!r}, but the "
            f"rollout says {prefix_text[:60]!r}: its tokenizer is not the one that made the rollout")


def _rendered(policy, prompts: list[str | dict]) -> list[str]:
    """Prompt texts as the policy reads them: a chat (an import that gave messages) through its template."""
    from backends.chat import render_all

    return render_all(policy.tokenizer, prompts)


def score_job(policy_path: str, prompts: list[str | dict], completions: list[list[int]], precision: str = "auto",
              texts: list[list[str]] | None = None) -> tuple[list, str, str]:
    """Runs in a worker: teacher-forced statistics of stored completions under a policy loaded in
    ``precision``. With ``texts`` (each completion's stored token texts) a completion whose ids
    this policy's tokenizer does not read as those texts (another vocabulary) is not scored: its
    place holds the reason, a string."""
    from backends import load_policy

    policy = load_policy(policy_path, precision=precision)
    prompts = _rendered(policy, prompts)
    bad = {i: why for i in range(len(completions)) if texts is not None
           and (why := _vocab_mismatch(policy, completions[i], texts[i])) is not None}
    keep = [i for i in range(len(completions)) if i not in bad]
    scored = iter(policy.score([prompts[i] for i in keep], [completions[i] for i in keep]) if keep else [])
    out = [bad[i] if i in bad else next(scored) for i in range(len(completions))]
    return out, _version(policy), policy.device


def _vocab_mismatch(policy, ids: list[int], texts: list[str]) -> str | None:
    """Why ``policy`` cannot score stored tokens (``ids`` read as ``texts``): an id outside its
    vocabulary, or ids it decodes as another text; None when it reads them as stored."""
    tok = policy.tokenizer
    size = len(tok) if hasattr(tok, "__len__") else None  # a backend's tokenizer: its decode says it
    if size is not None and max(ids, default=0) >= size:
        return f"token id {max(ids)} is outside its vocabulary of {size}"
    stored = "".join(texts)
    decoded = tok.decode(ids, skip_special_tokens=False)
    if decoded != stored:
        return f"it reads the token ids as {decoded[:60]!r}, the rollout's tokens say {stored[:60]!r}"
    return None


def enrich_job(policy_path: str, prompts: list[str | dict], completions: list[str | list[int]],
               expect: list[int | None], stopped: list[bool]) -> tuple[list, str, str]:
    """Runs in a worker: teacher-forced statistics of imported completions (``studio.runs.enrich``);
    one ``Generation`` per rollout, or the reason it cannot be scored (longer than the policy's
    context) as a string.

    A text completion gets the end-of-sequence token appended when it ``stopped`` (its
    finish reason is stop), or when its source counted ``expect`` tokens, one more than the
    policy's tokenization: the stop token is sampled, but the text does not show it.
    """
    from backends import load_policy

    policy = load_policy(policy_path)
    tok = policy.tokenizer
    prompts = _rendered(policy, prompts)
    limit = context_length(policy)
    forced: list[list[int]] = []
    too_long: dict[int, str] = {}
    for i, (p, c, n, stop) in enumerate(zip(prompts, completions, expect, stopped, strict=False)):
        if isinstance(c, str):
            ids = tok(c, add_special_tokens=False)["input_ids"]
            if tok.eos_token_id is not None and (stop or (n is not None and len(ids) + 1 == n)):
                ids = ids + [tok.eos_token_id]
            c = ids
        if limit is not None:
            total = len(tok(p)["input_ids"]) + len(c)
            if total > limit:
                too_long[i] = (f"prompt and completion are {total} tokens for this policy, which reads at most "
                               f"{limit}: it cannot score this rollout")
                continue
        forced.append(c)
    keep = [p for i, p in enumerate(prompts) if i not in too_long]
    scored = iter(policy.score(keep, forced) if forced else [])
    out = [too_long[i] if i in too_long else next(scored) for i in range(len(prompts))]
    return out, _version(policy), policy.device


def context_length(policy) -> int | None:
    """The longest sequence (prompt + completion) a policy reads: its config's positions
    (a local folder) or what a backend reports (``max_model_len``); None when unknown."""
    if callable(getattr(policy, "info", None)):  # a backend (backends.remote.RemotePolicy)
        return policy.info().max_model_len
    cfg = getattr(getattr(policy, "model", None), "config", None)
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(cfg, name, None)
        if isinstance(value, int) and 0 < value < 10_000_000:
            return value
    return None


def answer_prob_job(policy_path: str, prompts: list[str | dict], prefixes: list[str | list[int]], answers: list[str],
                    batch_size: int = 32, prefix_texts: list[str] | None = None) -> tuple[list[float], str]:
    """Runs in a worker: P(answer | prompt + prefix) under the policy, teacher-forced.

    The prefix and the answer are tokenized apart (the answer's ids follow the prefix's),
    so the probability is of exactly the answer's tokens: exp(Σ their log-probs). A prefix
    given as token ids (a trajectory's stored tokens) is read as they are; with
    ``prefix_texts`` (what those ids read as, in the store) a policy whose tokenizer decodes
    them to another text has another vocabulary, and the job refuses.
    """
    import math

    from backends import load_policy

    policy = load_policy(policy_path)
    tok = policy.tokenizer
    prompts = _rendered(policy, prompts)
    ids, n_ans = [], []
    for i, (pre, ans) in enumerate(zip(prefixes, answers, strict=False)):
        if prefix_texts is not None and isinstance(pre, list) and (
                max(pre, default=0) >= len(tok) or tok.decode(pre, skip_special_tokens=False) != prefix_texts[i]):
            raise TokenizerMismatch(
                f"the policy in {policy_path} does not read a stored rollout's token ids as its text "
                f"({prefix_texts[i][:60]!r}): its tokenizer is not the one that made the rollout")
        a = tok(ans, add_special_tokens=False)["input_ids"]
        ids.append((pre if isinstance(pre, list) else tok(pre, add_special_tokens=False)["input_ids"]) + a)
        n_ans.append(len(a))
    gens = policy.score(prompts, ids, top_k_stats=1, batch_size=batch_size)
    probs = [math.exp(float(g.logprobs[len(g.logprobs) - n:].sum())) if n else 1.0
             for g, n in zip(gens, n_ans, strict=False)]
    return probs, _version(policy)


def prm_job(folder: str, prompts: list[str], completions: list[str], step_ends: list[list[int]]
            ) -> tuple[list[list[float]], str]:
    """Runs in a worker: a process reward model's P(step correct) for every step (see
    ``backends.process_models.prm_step_scores``), and the PRM's version."""
    from backends.process_models import prm_step_scores, prm_version

    return prm_step_scores(folder, prompts, completions, step_ends), prm_version(folder)


def value_job(folder: str, prompts: list[str], completion_ids: list[list[int]], completion_texts: list[str]
              ) -> tuple[list[list[float]], str]:
    """Runs in a worker: a value model's V(s_t) for every completion token (see
    ``backends.process_models.value_scores``), and the value model's version.

    A critic reads the policy's token ids, so its tokenizer must read every stored
    completion's ids as the stored text; otherwise the job refuses (values of other tokens
    would be meaningless).
    """
    from backends.process_models import load_value_model, value_model_version

    model = load_value_model(folder)
    tok = model.tokenizer
    for ids, text in zip(completion_ids, completion_texts, strict=False):
        decoded = tok.decode(ids, skip_special_tokens=True)  # a rollout's text leaves out <eos>
        if decoded != text:
            raise TokenizerMismatch(
                f"the value model in {folder} reads a rollout's token ids as {decoded[:60]!r}, but the rollout "
                f"says {text[:60]!r}: a critic must share the policy's tokenizer")
    prompt_ids = [tok(p)["input_ids"] for p in prompts]
    return model.values(prompt_ids, completion_ids), value_model_version(folder)


def warm_job(policy_path: str) -> str:
    """Runs in a worker: load the policy now, so the first real job does not pay for it."""
    from backends import load_policy

    return load_policy(policy_path).device

