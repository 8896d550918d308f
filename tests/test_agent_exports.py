"""Agent trajectories from store to trainer: turn-level pairs (siblings that share turns up to k and
differ at turn k), conversational exports with TRL's tool calls and tool messages, standard
exports with the text the policy saw, and a real ``DPOTrainer`` step on such an export.

The trajectories are written the way the agent loop writes them (``generation_rows`` of
``Generation``s with turns and a loss mask; token ids from the sample agent policy's tokenizer);
the word problem is ``calculator_agent``'s.
"""
from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from backends import Generation, Turn
from sample_data import AGENT_POLICY_DIR, CHAT_POLICY_DIR
from studio import curation
from studio.curation import PairRule, build_pairs
from studio.store import Store
from studio.store.records import generation_rows, now, prompt_rows
from studio.tasks import get_task
from studio.tasks.tool_calls import MARKERS, call_text, format_response

V = "agent@1"
QUESTION = "Ann packs 37 boxes of 24 pens and gives away 118. How many pens are left?"


def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(AGENT_POLICY_DIR if (AGENT_POLICY_DIR / "config.json").exists()
                                         else CHAT_POLICY_DIR)


def call(expression: str, before: str = "") -> tuple:
    return ("assistant", before + call_text("calculator", {"expression": expression}), "calculator",
            json.dumps({"expression": expression}), None)


def answer(text: str, error: str | None = None) -> tuple:
    return ("tool", format_response(error=error) if error else format_response(text), "calculator", None, error)


def final(n: int) -> tuple:
    return ("assistant", f"\\boxed{{{n}}}<|im_end|>", None, None, None)


def trajectory(tok, turns: list[tuple], sample_idx: int = 0) -> Generation:
    """A trajectory as the agent loop hands it over: each turn's tokens, tool turns masked with no statistics."""
    ids, texts, mask, out = [], [], [], []
    for role, text, name, args, error in turns:
        t_ids = tok(text, add_special_tokens=False)["input_ids"]
        start = len(ids)
        ids += t_ids
        texts += [tok.decode([i]) for i in t_ids]
        mask += [role == "assistant"] * len(t_ids)
        out.append(Turn(role, start, len(ids), text, tool_name=name, tool_args=args if role == "assistant" else None,
                        error=error))
    m = np.array(mask)
    lp = np.where(m, -0.5, np.nan).astype(np.float32)
    text = "".join(t[1] for t in turns).removesuffix("<|im_end|>")  # the end token that stopped it is not text
    return Generation(prompt_index=0, sample_idx=sample_idx, prompt=QUESTION, text=text,
                      token_ids=np.array(ids), token_texts=texts, logprobs=lp, entropies=-lp,
                      topk_ids=np.where(m[:, None], 1, -1).repeat(2, 1),
                      topk_logprobs=np.where(m[:, None], -1.0, np.nan).repeat(2, 1), finish_reason="stop",
                      loss_mask=m, turns=out)


TWO_CALLS = [call("37*24", "Pens packed: "), answer("888"), call("888-118"), answer("770")]
MISREAD = [call("37*24", "Pens packed: "), answer("888"), call("888-18"), answer("870")]  # turn 2: a wrong argument
# the sampled group (one prompt): the right trajectory, one that passed a wrong argument at turn 2, one that never
# called the tool, and one whose call failed; then a branch of the second inside its turn 2 that got it right
GROUP = {"good": (TWO_CALLS + [final(770)], 1.0), "misread": (MISREAD + [final(870)], 0.0),
         "no_call": ([final(900)], 0.0), "failed": ([call("37*2 4"), answer("", "invalid syntax in '37*2 4'"),
                                                      final(74)], 0.0)}
BRANCH = ([*TWO_CALLS[:2], call("888 - 118"), answer("770"), final(770)], 1.0)


def agent_store(path: Path) -> tuple[Store, dict[str, str]]:
    """The trajectories above in a store, scored by ``V`` (total = correct)."""
    store = Store.open(path)
    tok = tokenizer()
    task = get_task("calculator_agent")
    prompt = replace(task.make_prompts(1, seed=0)[0], text=QUESTION, gold={"answer": 770},
                     messages=({"role": "user", "content": QUESTION},))
    names = list(GROUP)
    rows = generation_rows("run1", task, [prompt], [trajectory(tok, GROUP[k][0], i) for i, k in enumerate(names)])
    ids = dict(zip(names, rows.rollouts["rollout_id"], strict=True))
    turn_2 = rows.turns[(rows.turns["rollout_id"] == ids["misread"]) & (rows.turns["turn_idx"] == 2)]
    branch = generation_rows("run2", task, [prompt], [trajectory(tok, BRANCH[0])])
    # forked at the last token that both second calls share (the fork is inside turn 2)
    shared = len(tok(BRANCH[0][0][1] + BRANCH[0][1][1] + '<tool_call>{"name": "calculator", "arguments": '
                     '{"expression": "888', add_special_tokens=False)["input_ids"])
    assert int(turn_2["start_pos"].iloc[0]) < shared < int(turn_2["end_pos"].iloc[0])
    branch.rollouts["parent_rollout_id"], branch.rollouts["fork_pos"] = ids["misread"], shared
    ids["branch"] = branch.rollouts["rollout_id"].iloc[0]
    t = now()
    store.write({"runs": pd.DataFrame([{"run_id": r, "kind": k, "name": r, "policy": "agent", "task": task.name,
                                        "created_at": t, "status": "done"}
                                       for r, k in (("run1", "generate"), ("run2", "branch"))]),
                 "prompts": prompt_rows(task, [prompt]),
                 "rule_versions": pd.DataFrame([{"rule_version_id": V, "name": "agent", "source": "# literal",
                                                 "sha256": "0", "created_at": t, "note": ""}])})
    store.write(rows.frames())
    store.write(branch.frames())
    rewards = {**{k: v for k, (_, v) in GROUP.items()}, "branch": BRANCH[1]}
    store.write({"rewards": pd.DataFrame([(ids[k], V, "total", v) for k, v in rewards.items()],
                                         columns=["rollout_id", "rule_version_id", "component", "value"])})
    return store, ids


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The store with every level's pairs built and accepted."""
    store, ids = agent_store(tmp_path_factory.mktemp("agent") / "agent.duckdb")
    for level in ("turn", "completion"):
        curation.accept(store, build_id=build_pairs(store, PairRule("all_pairs", level=level),
                                                    rule_version_id=V).build_id)
    yield store, ids
    store.close()


def start_of(store: Store, rollout_id: str, turn: int) -> int:
    return int(store.scalar("SELECT start_pos FROM turns WHERE rollout_id = ? AND turn_idx = ?", [rollout_id, turn]))


def test_turn_pairs_are_siblings_that_share_turns_up_to_k_and_differ_at_k(built):
    store, ids = built
    got = store.df("SELECT chosen_rollout_id c, rejected_rollout_id r, prefix, prefix_tokens k FROM pairs "
                   "WHERE kind = 'turn'")
    by = {(ids_of(ids, c), ids_of(ids, r)): (p, k) for c, r, p, k in got.itertuples(index=False)}
    two_turns = TWO_CALLS[0][1] + TWO_CALLS[1][1]  # the first call and its answer, as the policy saw them
    assert by == {
        # group members: the right trajectory and the misread one share turns 0-1 and differ at turn 2
        ("good", "misread"): (two_turns, start_of(store, ids["good"], 2)),
        # ... and differ from the others at turn 0
        ("good", "no_call"): ("", 0), ("good", "failed"): ("", 0),
        # fork siblings: the branch inside turn 2 and its parent (turn 2 is where they differ, not the fork token)
        ("branch", "misread"): (two_turns, start_of(store, ids["branch"], 2)),
    }
    again = build_pairs(store, PairRule("all_pairs", level="turn"), rule_version_id=V)
    assert again.added == 0 and again.pairs == 4  # built again: the same pairs, nothing new


def ids_of(ids: dict[str, str], rollout_id: str) -> str:
    return next(k for k, v in ids.items() if v == rollout_id)


def plain(messages: list[dict]) -> list[dict]:
    """Messages without the keys a row's other messages brought in (null here)."""
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


def key(messages: list[dict]) -> str:
    return json.dumps(plain(messages), sort_keys=True)


def calling(expression: str, before: str = "") -> dict:
    return {"role": "assistant", "content": before,
            "tool_calls": [{"type": "function", "function": {"name": "calculator",
                                                             "arguments": {"expression": expression}}}]}


def tool(content: str) -> dict:
    return {"role": "tool", "name": "calculator", "content": content}


def said(text: str) -> dict:
    return {"role": "assistant", "content": text}


USER = {"role": "user", "content": QUESTION}


def load(path: Path, filetype: str, cache: Path):
    import datasets

    if filetype == "datasets":
        return datasets.load_from_disk(str(path))
    if filetype == "parquet":
        return datasets.load_dataset("parquet", data_files=str(path), split="train", cache_dir=str(cache))
    return datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(cache))


@pytest.mark.parametrize("filetype", ["jsonl", "parquet", "datasets"])
def test_a_conversational_export_of_turn_pairs_keeps_tool_calls_and_tool_messages(built, tmp_path, filetype):
    from trl.data_utils import is_conversational

    store, ids = built
    name = {"jsonl": "turns.jsonl", "parquet": "turns.parquet", "datasets": "turns"}[filetype]
    out = curation.export(store, tmp_path / name, "preference", "conversational", kinds=["turn"])
    ds = load(out.path, filetype, tmp_path / "cache")
    assert len(ds) == out.rows == 4 and all(is_conversational(r) for r in ds)
    rows = {(key(r["chosen"]), key(r["rejected"])): plain(r["prompt"]) for r in ds}
    shared = [USER, calling("37*24", "Pens packed: "), tool("888")]  # turns 0-1 join the prompt as messages
    right = [calling("37*24", "Pens packed: "), tool("888"), calling("888-118"), tool("770"), said("\\boxed{770}")]
    misread = key([calling("888-18"), tool("870"), said("\\boxed{870}")])
    assert rows == {
        (key(right[2:]), misread): shared,
        (key(right), key([said("\\boxed{900}")])): [USER],
        (key(right), key([calling("37*2 4"), tool("error: invalid syntax in '37*2 4'"), said("\\boxed{74}")])): [USER],
        (key([calling("888 - 118"), tool("770"), said("\\boxed{770}")]), misread): shared,  # the branch
    }
    assert out.provenance["trajectories"]["arguments"] == "objects"
    text = json.dumps([r["prompt"] + r["chosen"] + r["rejected"] for r in ds])
    assert not any(m in text for m in MARKERS)  # no call or response markup left in a message: the template adds it


def test_completion_pairs_of_trajectories_export_every_turn_as_messages(built, tmp_path):
    store, ids = built
    out = curation.export(store, tmp_path / "kto.jsonl", "unpaired", "conversational", kinds=["completion"])
    rows = [json.loads(x) for x in out.path.read_text().splitlines()]
    assert all(plain(r["prompt"]) == [USER] for r in rows)
    good = [plain(r["completion"]) for r in rows if r["label"]]
    assert good == [[calling("37*24", "Pens packed: "), tool("888"), calling("888-118"), tool("770"),
                     said("\\boxed{770}")]]
    assert len(rows) == 4  # the right one, and the three the group's pairs reject


def test_a_standard_export_keeps_the_text_as_the_policy_saw_it(built, tmp_path):
    store, ids = built
    out = curation.export(store, tmp_path / "std.jsonl", "preference", "standard", kinds=["turn"])
    rows = [json.loads(x) for x in out.path.read_text().splitlines()]
    seen = "".join(t[1] for t in TWO_CALLS[:2])
    assert {(r["prompt"], r["chosen"], r["rejected"]) for r in rows if r["prompt"] != QUESTION} == {
        (QUESTION + seen, "".join(t[1] for t in TWO_CALLS[2:]) + "\\boxed{770}",
         "".join(t[1] for t in MISREAD[2:]) + "\\boxed{870}"),
        (QUESTION + seen, "".join(t[1] for t in BRANCH[0][2:4]) + "\\boxed{770}",
         "".join(t[1] for t in MISREAD[2:]) + "\\boxed{870}"),
    }
    assert all("<tool_call>" in r["chosen"] + r["prompt"] for r in rows)


def test_a_call_that_could_not_be_read_stays_the_text_the_policy_wrote():
    from studio.curation.trajectories import turn_messages

    broken = '<tool_call>{"name": "calculator", "arguments": {"expression": 37*24}</tool_call>'
    msgs = turn_messages([{"role": "assistant", "content": broken, "tool_name": None, "tool_args": None},
                          {"role": "tool", "content": "<tool_response>error: not valid JSON</tool_response>",
                           "tool_name": None, "error": "not valid JSON"}])
    assert msgs == [said(broken), {"role": "tool", "name": None, "content": "error: not valid JSON"}]


# ---------------------------------------------------------------------------- a TRL DPO step on the export

# the sample agent policy's ChatML, with tool calls and tool answers written inside the assistant's message as the
# policy writes and reads them (<tool_call>{json}</tool_call><tool_response>…</tool_response>): what the trainer
# tokenises is then the text the policy saw
TOOL_TEMPLATE = (
    "{%- set inline = ['assistant', 'tool'] %}"
    "{%- for m in messages %}"
    "{%- if m.role in inline %}"
    "{%- if loop.first or messages[loop.index0 - 1].role not in inline %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    "{%- if m.role == 'assistant' %}{{- m.content or '' }}"
    "{%- for c in m.tool_calls or [] %}"
    "{{- '<tool_call>' + {'name': c.function.name, 'arguments': c.function.arguments} | tojson + '</tool_call>' }}"
    "{%- endfor %}"
    "{%- else %}{{- '<tool_response>' + m.content + '</tool_response>' }}{%- endif %}"
    "{%- if (loop.last and not add_generation_prompt) or (not loop.last and messages[loop.index0 + 1].role not in "
    "inline) %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt and messages[-1].role not in inline %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.mark.skipif(not (AGENT_POLICY_DIR / "config.json").exists(), reason="the sample agent policy is not built")
@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
def test_a_conversational_turn_pair_export_trains_one_dpo_step(built, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM
    from trl import DPOConfig, DPOTrainer

    store, ids = built
    out = curation.export(store, tmp_path / "dpo.jsonl", "preference", "conversational")
    ds = load(out.path, "jsonl", tmp_path / "cache")
    tok = tokenizer()
    tok.chat_template = TOOL_TEMPLATE
    model = AutoModelForCausalLM.from_pretrained(AGENT_POLICY_DIR)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = DPOConfig(output_dir=str(tmp_path / "dpo"), per_device_train_batch_size=4, max_steps=1, learning_rate=1e-3,
                     beta=0.1, max_length=256, logging_steps=1, report_to="none", use_cpu=True, bf16=False,
                     save_strategy="no", disable_tqdm=True, seed=0)
    trainer = DPOTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
    # the trainer's sequences are the trajectories as the policy saw them: prompt, its turns, the tool's answers
    seen = {tok.decode(r["prompt_ids"] + r["chosen_ids"]) for r in trainer.train_dataset}
    rendered = tok.apply_chat_template([USER], tokenize=False, add_generation_prompt=True)
    good = store.scalar("SELECT text FROM rollouts WHERE rollout_id = ?", [ids["good"]])
    assert rendered + good + "<|im_end|>\n" in seen
    result = trainer.train()
    assert trainer.state.global_step == 1 and math.isfinite(result.training_loss)
    assert any(not torch.equal(p.detach(), before[n]) for n, p in model.named_parameters())
