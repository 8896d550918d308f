"""The formats an import reads, and how one file's fields become a :class:`ColumnMapping`.

Formats: TRL GRPO completions tables (``completions/completions_{step}.parquet``, or a logged
table as JSON), verl generation dumps (``{step}.jsonl``), OpenRLHF / RL-Logging-Board JSONL, and
``generic``: any JSONL or Parquet with a user's column mapping. Every format is a
:class:`ColumnMapping` resolved from the file's own field names (:data:`FORMAT_FIELDS`: each
field's aliases, the first present wins; :func:`resolve`), so one pipeline reads them all and a
user mapping can override any field of any format. Numbers the mapping does not name are the
reward components (TRL, verl), or those named like rewards (OpenRLHF). :func:`detect_format`
tells the format from a path's file names and fields; :func:`files_of` lists the files a path
(a file or a run directory) stands for, sorted by step.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from studio.configs import setting
from studio.ingest.errors import ImportFormatError

# agent trajectories (studio.ingest.agent_formats): the fields a record needs (one name of each tuple), and
# the field whose number is a trajectory's reward (named in its rule version)
AGENT_FORMATS: dict[str, tuple[tuple[tuple[str, ...], ...], str]] = {
    "verl-agent": ((("prompt_ids",), ("response_ids",), ("response_mask",)), "reward_score"),
    "skyrl": ((("prompt_token_ids",), ("response_ids",), ("loss_masks",)), "rewards"),
    "trl-tools": ((("prompt_ids",), ("completion_ids",), ("env_mask", "tool_mask")), "the reward functions"),
    "rllm": ((("trajectories",),), "reward"),
    "nemo-rl": ((("content",), ("input_lengths",), ("generation_logprobs", "prev_logprobs")), "rewards"),
    "slime": ((("tokens",), ("response_length",)), "reward"),
    "openai-chat": ((("messages", "completion"),), "reward"),
    "openai-responses": ((("output", "items"),), "reward"),
}
FORMATS = ("trl", "verl", "openrlhf", "generic", *AGENT_FORMATS)
AGENT_MAPPING = ("step", "group", "gold")  # the fields a mapping may name for an agent format
INT32 = 2**31 - 1


@dataclass(frozen=True)
class ColumnMapping:
    """Which source column holds which rollout field; "" means none (a format's default applies)."""

    prompt: str = setting("", "the prompt: text, or a list of {role, content} messages (required)")
    completion: str = setting("", "the completion: text, or a list of {role, content} messages (required)")
    step: str = setting("", "training step (default: the number in the file name)")
    group: str = setting("", "rows with the same value at the same step form one group (default: the same prompt)")
    reward: str = setting("", "total reward (default: the sum of the reward components)")
    rewards: tuple[str, ...] = setting((), "reward component columns, each stored as a component named after its "
                                          "column")
    gold: str = setting("", 'reference answer, stored as the prompt\'s gold {"answer": ...}')
    advantage: str = setting("", "advantage the trainer used: a number, or a per-token list (its first value)")
    finish_reason: str = setting("", "why generation stopped (stop / length)")
    token_texts: str = setting("", "per-token list: the completion's token strings")
    token_ids: str = setting("", "per-token list: the completion's token ids")
    logprobs: str = setting("", "per-token list: the behaviour log-prob of each token, what the sampler reported "
                                "(verl / OpenRLHF / slime `rollout_log_probs`, SkyRL `rollout_logprobs`, NeMo-RL "
                                "`generation_logprobs`)")
    train_logprobs: str = setting("", "per-token list: the log-prob the trainer recomputed for each token (verl "
                                      "`old_log_probs`, NeMo-RL `prev_logprobs`): the training side of the mismatch")
    ref_logprobs: str = setting("", "per-token list: log-probability of each token under the reference policy")
    entropies: str = setting("", "per-token list: entropy of each next-token distribution (nats)")
    values: str = setting("", "per-token list: a critic's value before each token (stored as value-import@<run id>)")

    @classmethod
    def parse(cls, pairs: list[str]) -> ColumnMapping:
        """From ``field=column`` strings (``rewards=a,b`` for several components)."""
        known = {f.name for f in fields(cls)}
        kw: dict[str, Any] = {}
        for pair in pairs:
            key, sep, col = pair.partition("=")
            key = key.strip()
            if not sep or key not in known or not col.strip():
                raise ValueError(f"--map {pair!r}: expected field=column with field one of {', '.join(sorted(known))}")
            kw[key] = tuple(c.strip() for c in col.split(",") if c.strip()) if key == "rewards" else col.strip()
        return cls(**kw)

    def as_dict(self) -> dict[str, Any]:
        """The fields that are set."""
        return {f.name: (list(v) if isinstance(v, tuple) else v) for f in fields(self) if (v := getattr(self, f.name))}


# Each format: a ColumnMapping field -> the source names that may fill it, the first present wins.
FORMAT_FIELDS: dict[str, dict[str, tuple[str, ...]]] = {
    "trl": {"prompt": ("prompt",), "completion": ("completion",), "step": ("step",), "advantage": ("advantage",),
            # a reward function's extra logs (or a hand-added column) carrying the data set's answer
            "gold": ("answer", "gold", "ground_truth", "solution")},
    "verl": {"prompt": ("input",), "completion": ("output",), "gold": ("gts",), "reward": ("score",),
             "step": ("step",), "logprobs": ("rollout_log_probs",), "train_logprobs": ("old_log_probs",)},
    "openrlhf": {
        "prompt": ("prompt", "prompts", "query", "input"),
        "completion": ("response", "responses", "output", "completion"),
        "reward": ("reward", "rewards", "score"),
        "step": ("step", "global_step", "train_step", "iteration"),
        "gold": ("gold", "answer", "ground_truth", "gts", "label", "reference"),
        "advantage": ("advantage", "advantages"),
        "finish_reason": ("finish_reason", "stop_reason"),
        "token_texts": ("response_tokens", "tokens", "token_texts", "output_tokens"),
        "token_ids": ("response_token_ids", "response_ids", "output_ids", "token_ids"),
        # the behaviour side: the sampler's (OpenRLHF / slime / verl, SkyRL, NeMo-RL), else the one log-prob logged
        "logprobs": ("rollout_log_probs", "rollout_logprobs", "generation_logprobs", "logprobs", "action_log_probs",
                     "log_probs", "old_logprobs"),
        # the training side, recomputed (verl, NeMo-RL; OpenRLHF's action_log_probs beside its rollout_log_probs)
        "train_logprobs": ("old_log_probs", "prev_logprobs", "action_log_probs"),
        "ref_logprobs": ("ref_logprobs", "base_action_log_probs", "ref_log_probs"),
        "entropies": ("entropies", "entropy"),
        "values": ("values",),
    },
    "generic": {},
}
REQUIRED = {"trl": ("prompt", "completion"), "verl": ("prompt", "completion", "reward"),
            "openrlhf": ("prompt", "completion"), "generic": ("prompt", "completion")}
TOKEN_FIELDS = {  # mapping field -> (store column, type)
    "token_texts": ("token_text", pa.string()), "token_ids": ("token_id", pa.int32()),
    "logprobs": ("logprob", pa.float32()), "train_logprobs": ("train_logprob", pa.float32()),
    "ref_logprobs": ("ref_logprob", pa.float32()),
    "entropies": ("entropy", pa.float32()), "values": ("value", pa.float32())}
_KINDS = {"prompt": {"text", "messages"}, "completion": {"text", "messages"}, "step": {"number"},
          "group": {"text", "number"}, "reward": {"number"}, "advantage": {"number", "list"},
          "finish_reason": {"text"}, **{f: {"list"} for f in TOKEN_FIELDS}}
_CORRECTNESS = {"acc", "accuracy", "correct", "correctness", "is_correct", "exact_match"}


def is_correctness(name: str) -> bool:
    """Whether a reward component is a correctness score (``acc``, ``reward_correct``, ``accuracy_func``, ...)."""
    base = re.sub(r"(_reward|_score|_func)$", "", name.lower().rsplit("/", 1)[-1])
    return base.removeprefix("reward_") in _CORRECTNESS


def arrow_kind(t: pa.DataType) -> str:
    """The kind of value an Arrow type holds: text, number, null, messages, list or other."""
    if pa.types.is_dictionary(t):
        return arrow_kind(t.value_type)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "text"
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return "number"
    if pa.types.is_null(t):
        return "null"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        v = t.value_type
        return "messages" if pa.types.is_struct(v) and v.get_field_index("content") >= 0 else "list"
    return "other"


def value_kind(v: Any) -> str:
    """The kind of one Python value, as :func:`arrow_kind` names them."""
    if v is None:
        return "null"
    if isinstance(v, str):
        return "text"
    if isinstance(v, (bool, int, float)):
        return "number"
    if isinstance(v, list):
        return "messages" if v and isinstance(v[0], dict) and "content" in v[0] else "list"
    return "other"


def resolve(fmt: str, kinds: dict[str, set[str]], user: ColumnMapping | None, file: str) -> ColumnMapping:
    """The mapping of one file: the format's fields found among its columns (``kinds``: column
    -> kinds of its values), then every field ``user`` sets.

    Raises:
        ImportFormatError: a required field or a mapped column is missing, or holds the wrong kind of value.
    """
    if fmt in AGENT_FORMATS:
        return _agent_mapping(fmt, kinds, user, file)
    chosen: dict[str, Any] = {}
    for fld, names in FORMAT_FIELDS[fmt].items():
        ok = _KINDS.get(fld)
        for nm in names:
            if nm in kinds and (ok is None or kinds[nm] & ok or kinds[nm] <= {"null"}):
                chosen[fld] = nm
                break
    train = chosen.get("train_logprobs")
    if train == chosen.get("logprobs") or (train == "action_log_probs" and chosen.get("logprobs") != "rollout_log_probs"):
        chosen.pop("train_logprobs", None)  # one log-prob logged (OpenRLHF without rollout_log_probs): the sampler's
    mapped = set()
    for f in fields(ColumnMapping):
        v = getattr(user, f.name) if user else None
        if v:
            chosen[f.name] = v
            mapped.update([v] if isinstance(v, str) else v)
    absent = sorted(c for c in mapped if c not in kinds)
    missing = [f for f in REQUIRED[fmt] if not chosen.get(f)]
    if absent or missing:
        want = [f"{f} ({' or '.join(FORMAT_FIELDS[fmt].get(f, ())) or 'map a column'})" for f in missing]
        raise ImportFormatError(
            f"{file}: not a {fmt} file: missing {', '.join(want + [repr(c) for c in absent])}; "
            f"it has {', '.join(sorted(kinds)) or 'no fields'}")
    for fld, ok in _KINDS.items():
        col = chosen.get(fld)
        if col and not (kinds[col] & ok or kinds[col] <= {"null"}):
            raise ImportFormatError(f"{file}: column {col!r} ({fld}) holds {'/'.join(sorted(kinds[col]))}, "
                                    f"expected {' or '.join(sorted(ok))}")
    if not chosen.get("rewards"):
        used = {v for k, v in chosen.items() if k != "rewards"}
        numeric = [c for c, k in kinds.items()
                   if "number" in k and k <= {"number", "null"} and c not in used and not c.startswith("__")]
        if fmt in ("trl", "verl"):  # every other number is a reward function / reward_extra_info
            chosen["rewards"] = tuple(numeric)
        elif fmt == "openrlhf":  # only numbers named like rewards: the rest are lengths, KL, ...
            chosen["rewards"] = tuple(c for c in numeric if not c.startswith("ref_") and (
                is_correctness(c) or re.search(r"(^reward_|_reward$|_score$)", c)))
    for col in chosen.get("rewards", ()):
        if not kinds[col] & {"number"} and not kinds[col] <= {"null"}:
            raise ImportFormatError(f"{file}: reward column {col!r} holds {'/'.join(sorted(kinds[col]))}, "
                                    "expected numbers")
    return ColumnMapping(**{k: (tuple(v) if k == "rewards" else v) for k, v in chosen.items()})


def _agent_mapping(fmt: str, kinds: dict[str, set[str]], user: ColumnMapping | None, file: str) -> ColumnMapping:
    """An agent format's mapping: its own fields must be there; a user's may name step, group and gold only."""
    needed, reward = AGENT_FORMATS[fmt]
    missing = [" or ".join(names) for names in needed if not any(n in kinds for n in names)]
    if missing:
        raise ImportFormatError(f"{file}: not a {fmt} file: missing {', '.join(missing)}; "
                                f"it has {', '.join(sorted(kinds)) or 'no fields'}")
    given = user.as_dict() if user else {}
    other = sorted(set(given) - set(AGENT_MAPPING))
    if other:
        raise ImportFormatError(f"{fmt} reads its own fields: a mapping may name {', '.join(AGENT_MAPPING)} only, "
                                f"not {', '.join(other)}")
    return ColumnMapping(reward=reward, **{k: v for k, v in given.items() if k in AGENT_MAPPING})


def columns_of(m: ColumnMapping) -> set[str]:
    """The source columns a mapping reads."""
    return {c for f in fields(m) for c in ([getattr(m, f.name)] if f.name != "rewards" else m.rewards) if c}


def kinds_of_schema(schema: pa.Schema) -> dict[str, set[str]]:
    """Column -> the kinds of its values (what :func:`resolve` takes), from an Arrow schema."""
    return {f.name: {arrow_kind(f.type)} for f in schema}


def kinds_of_records(objs) -> dict[str, set[str]]:
    """Column -> the kinds of its values over records (objects; other values add nothing)."""
    kinds: dict[str, set[str]] = {}
    for obj in objs:
        if isinstance(obj, dict):
            for k, v in obj.items():
                kinds.setdefault(k, set()).add(value_kind(v))
    return kinds


# ----------------------------------------------------------------------------------------- a path's files

def _field_names(path: Path) -> set[str]:
    if path.suffix == ".pt":  # slime's rollout dump: a torch file of samples
        from studio.ingest.train_dumps import read_torch_samples
        first = next((r for _, r in read_torch_samples(path) if isinstance(r, dict)), {})
        return set(first)
    if path.suffix == ".parquet":
        return set(pq.read_schema(path).names)
    if path.suffix == ".json":
        return set(read_table_json(path)[0])
    with open(path, "rb") as f:
        for raw in f:
            if raw.strip():
                try:
                    obj = json.loads(raw)
                except ValueError:
                    raise ImportFormatError(f"{path}: the first line is not JSON") from None
                return set(obj) if isinstance(obj, dict) else set()
    return set()


def detect_format(path: str | Path) -> str:
    """The format of a file or a run directory, from its file names and fields.

    Raises:
        ImportFormatError: nothing to import there, or the fields fit no format (the message lists them).
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise ImportFormatError(f"{p} does not exist")
    if p.is_dir():
        if _trl_dir(p) is not None:
            return "trl"
        files = files_of(p, "generic") or files_of(p, "slime")
        if not files:
            raise ImportFormatError(f"{p}: no .parquet, .jsonl, .pt or completions/*.parquet files to import")
        p = files[0]
    names = _field_names(p)
    agent = _agent_format(p, names)
    if agent:
        return agent
    if p.suffix in (".parquet", ".json") and {"prompt", "completion"} <= names and (
            "advantage" in names or p.name.startswith("completions")):
        return "trl"
    if p.suffix == ".jsonl":
        if {"input", "output", "score"} <= names:
            return "verl"
        if names & {"prompt", "prompts", "query"} and names & {"response", "responses"}:
            return "openrlhf"
        if {"prompt", "completion", "advantage"} <= names:
            return "trl"
    raise ImportFormatError(f"{p}: cannot tell the format from its fields ({', '.join(sorted(names)) or 'none'}); "
                            f"pass one of {', '.join(FORMATS)} (generic with a column mapping)")


def _agent_format(path: Path, names: set[str]) -> str | None:
    """The agent format a file's fields say it is: token ids with a loss mask (verl, SkyRL, TRL), rLLM's
    episodes, chat ``messages``, or Responses ``output`` items (a list of objects with a ``type``)."""
    for fmt in ("verl-agent", "skyrl", "trl-tools", "rllm", "nemo-rl", "slime"):
        if all(names & set(group) for group in AGENT_FORMATS[fmt][0]):
            return fmt
    if "messages" in names:
        return "openai-chat"
    if names & {"output", "items"} and path.suffix == ".jsonl":
        first = _first_object(path)
        items = first.get("output", first.get("items"))
        if isinstance(items, list) and items and all(isinstance(i, dict) and "type" in i for i in items):
            return "openai-responses"
    return None


def _first_object(path: Path) -> dict:
    with open(path, "rb") as f:
        for raw in f:
            if raw.strip():
                obj = json.loads(raw)
                return obj if isinstance(obj, dict) else {}
    return {}


def step_of_name(path: Path) -> int | None:
    """The training step a file name gives (``12.jsonl``, ``step_12``, ``completions_00012``), or None."""
    stem = path.name.split(".")[0]
    m = (re.fullmatch(r"\d+", stem) or re.search(r"step[_-]?(\d+)", stem, re.IGNORECASE)
         or re.fullmatch(r"completions_(\d+)", stem))
    if not m:
        return None
    v = int(m.group(m.lastindex or 0))
    return v if v <= INT32 else None


def _by_step(files: list[Path]) -> list[Path]:
    return sorted(files, key=lambda f: (s if (s := step_of_name(f)) is not None else math.inf, f.name))


def _trl_dir(root: Path) -> Path | None:
    for d in (root / "completions", root):
        if d.is_dir() and any(d.glob("completions_*.parquet")):
            return d
    return None


def files_of(root: Path, fmt: str) -> list[Path]:
    """The files a path stands for: itself, or a directory's shards sorted by step."""
    if root.is_file():
        return [root]
    if fmt == "trl":
        d = _trl_dir(root) or (root / "completions" if (root / "completions").is_dir() else root)
        return _by_step([*d.glob("*.parquet"), *d.glob("*.table.json")])
    jsonl = [f for f in root.glob("*.jsonl") if f.is_file()]
    if fmt == "verl":  # verl names its dumps {step}.jsonl: other JSONL beside them are not rollouts
        numbered = [f for f in jsonl if f.stem.isdigit()]
        return _by_step(numbered or jsonl)
    if fmt == "openrlhf":
        return _by_step(jsonl)
    if fmt == "slime":  # its rollout dumps, {rollout_id} in each name
        return _by_step([*root.glob("*.pt"), *jsonl])
    return _by_step([*root.glob("*.parquet"), *jsonl])


def read_table_json(path: Path) -> tuple[list[str], list]:
    """A logged completions table saved as JSON (``{"columns": [...], "data": [[...], ...]}``)."""
    try:
        obj = json.loads(path.read_bytes())
        cols, data = obj["columns"], obj["data"]
        if not isinstance(cols, list) or not isinstance(data, list):
            raise TypeError
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise ImportFormatError(f"{path}: not a logged table ({{\"columns\": [...], \"data\": [[...]]}}): "
                                f"{exc.__class__.__name__}") from None
    return [str(c) for c in cols], data
