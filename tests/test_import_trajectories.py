"""Importing agent trajectories, each framework's on a fixture written the way it writes it
(``tests/data/imports/``, made by ``make_fixtures.py`` with the sample chat policy's token ids).

Field names are read from each framework's code:
verl ``verl/experimental/agent_loop/agent_loop.py`` (``AgentLoopOutput``) and ``tool_agent_loop.py``
(``extra_fields.turn_scores`` / ``tool_rewards``, 0.0 log-probs on tool tokens); SkyRL
``skyrl/train/generators/base.py`` (``GeneratorOutput``) and ``skyrl_gym_generator.py`` (step-wise rows,
``is_last_step``, a step's reward on its last token); TRL ``trl/trainer/grpo_trainer.py`` (a
``rollout_func``'s ``prompt_ids`` / ``completion_ids`` / ``logprobs`` / ``env_mask``, the tool loop's
``tool_mask`` and ``{'error': …}`` tool messages); rLLM ``rllm/types.py`` (``Episode.to_dict``,
``Trajectory``, ``Step``); OpenAI chat messages with ``tool_calls`` and ``tool`` messages; OpenAI Responses
items ``message``, ``function_call``, ``function_call_output``.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from studio.face.cli import import_ as import_cli
from studio.ingest.errors import ImportFormatError, MalformedInput
from studio.ingest.formats import detect_format
from studio.ingest.importers import import_run
from studio.store import Store

DATA = Path(__file__).parent / "data" / "imports"
TOKENIZER = "sample-chat"  # the fixtures' token ids are the sample chat policy's
FIXTURES = {"verl-agent": "verl_agent_loop.jsonl", "skyrl": "skyrl_generator_output.jsonl",
            "trl-tools": "trl_rollout_func.parquet", "rllm": "rllm_episodes.jsonl",
            "openai-chat": "openai_chat.jsonl", "openai-responses": "openai_responses.jsonl"}
# the four samples of every fixture: a working call, a failing call, two calls in one turn, no call
CALLS = [1, 1, 2, 0]
EXPRESSIONS = [['{"expression": "37*24"}'], ['{"expression": "37 x 24"}'],
               ['{"expression": "125*16"}', '{"expression": "2000+9"}'], []]


def lines(name: str) -> list[dict]:
    return [json.loads(raw) for raw in (DATA / name).read_text().splitlines()]


def rollouts(store: Store):
    return store.df("SELECT * FROM rollouts ORDER BY rollout_id")


def turns(store: Store, rid: str) -> list[tuple]:
    """(role, start, end, content, tool name, arguments, call id, error) of each turn, NULL as None."""
    return [tuple(None if pd.isna(v) else v for v in r) for r in store.df(
        "SELECT role, start_pos, end_pos, content, tool_name, tool_args, tool_call_id, error FROM turns "
        "WHERE rollout_id = ? ORDER BY turn_idx", [rid]).itertuples(index=False)]


def calls_of(store: Store, rid: str) -> list[str]:
    return [t[5] for t in turns(store, rid) if t[0] == "assistant" and t[5] is not None]


@pytest.fixture()
def store(empty_store):
    return empty_store


@pytest.mark.parametrize("fmt", list(FIXTURES))
def test_every_fixture_is_detected_and_imports_its_trajectories_with_their_calls(store, fmt):
    path = DATA / FIXTURES[fmt]
    assert detect_format(path) == fmt
    rep = import_run(store, path, tokenizer=TOKENIZER)
    ro = rollouts(store)
    assert rep.n_rollouts == len(ro) == 4
    assert ro.n_tool_calls.tolist() == CALLS
    for rid, want in zip(ro.rollout_id, EXPRESSIONS, strict=True):
        assert calls_of(store, rid) == want  # tool name and arguments, JSON text as the policy wrote it
        assert all(t[4] == "calculator" for t in turns(store, rid) if t[0] == "tool")
    assert (ro.n_turns == store.df("SELECT rollout_id, count(*) AS n FROM turns GROUP BY ALL ORDER BY rollout_id")
            .n.to_numpy()).all()
    assert ro.text.str.contains(r"\\boxed\{", regex=True).all()


@pytest.mark.parametrize("fmt", ["verl-agent", "skyrl", "trl-tools"])
def test_the_loss_mask_reaches_the_store_with_no_statistics_on_tool_tokens(store, fmt):
    path = DATA / FIXTURES[fmt]
    recs = pq.read_table(path).to_pylist() if path.suffix == ".parquet" else lines(path.name)
    mask_field = {"verl-agent": "response_mask", "skyrl": "loss_masks", "trl-tools": "env_mask"}[fmt]
    lp_field = {"verl-agent": "response_logprobs", "skyrl": "rollout_logprobs", "trl-tools": "logprobs"}[fmt]
    zeros = sum(v == 0 for r in recs for v in r[mask_field])
    import_run(store, path, tokenizer=TOKENIZER)
    assert store.scalar("SELECT count(*) FROM tokens WHERE NOT trained") == zeros == 170
    assert store.scalar("SELECT count(*) FROM tokens WHERE trained AND logprob IS NULL") == 0
    assert store.scalar("SELECT count(*) FROM tokens WHERE NOT trained AND logprob IS NOT NULL") == 0
    # the trained tokens' log-probs are the framework's, in order (SkyRL: its steps joined)
    want = [lp for r in recs for lp, m in zip(r[lp_field], r[mask_field], strict=True) if m]
    got = store.df("SELECT logprob FROM tokens WHERE trained ORDER BY rollout_id, pos").logprob.tolist()
    assert got == pytest.approx(want, abs=1e-6)
    # each token's turn: a tool turn's tokens are exactly the untrained ones
    assert store.scalar("""SELECT count(*) FROM tokens k JOIN turns t ON t.rollout_id = k.rollout_id
                           AND t.turn_idx = k.turn_idx WHERE (t.role = 'tool') = k.trained""") == 0
    assert store.scalar("SELECT count(*) FROM tokens WHERE token_text IS NULL") == 0  # decoded with the tokenizer


def test_verl_agent_loop_keeps_prompt_messages_rewards_and_tool_rewards_per_turn(store):
    recs = lines(FIXTURES["verl-agent"])
    rep = import_run(store, DATA / FIXTURES["verl-agent"], tokenizer=TOKENIZER)
    ro = rollouts(store)
    vid = rep.rule_versions[0]
    totals = store.df("SELECT r.value FROM rewards r JOIN rollouts o USING (rollout_id) WHERE component = 'total' "
                      "ORDER BY o.rollout_id").value.tolist()
    assert totals == [r["reward_score"] for r in recs] == [1.0, 0.0, 1.0, 1.0]
    assert ro.correct.tolist() == [True, False, True, True]  # reward_extra_info's acc
    msgs = json.loads(store.scalar("SELECT messages FROM prompts WHERE prompt_id = ?", [ro.prompt_id[0]]))
    assert msgs == recs[0]["extra_fields"]["raw_prompt"]
    assert ro.prompt_text[0].startswith("<|im_start|>system\n")  # the templated prompt the policy read
    tr = store.df("SELECT rollout_id, turn_idx, source, value FROM turn_rewards ORDER BY rollout_id, turn_idx")
    assert set(tr.source) == {vid}
    # a tool reward is the calling turn's: sample 3 made two calls in its first assistant turn
    got = [(list(ro.rollout_id).index(r), i, v) for r, i, v in zip(tr.rollout_id, tr.turn_idx, tr.value, strict=True)]
    assert got == [(0, 0, 0.1), (1, 0, -0.1), (2, 0, 0.1), (2, 1, 0.1)]


def test_skyrl_step_wise_rows_join_into_trajectories_with_their_step_rewards(store):
    recs = lines(FIXTURES["skyrl"])
    assert len(recs) == 7  # 2 + 2 + 2 + 1 steps
    import_run(store, DATA / FIXTURES["skyrl"], tokenizer=TOKENIZER)
    ro = rollouts(store)
    steps = [[r for r in recs if r["trajectory_ids"] == {"instance_id": f"calc-{k // 2}", "repetition_id": k % 2}]
             for k in range(4)]
    assert ro.n_tokens.tolist() == [sum(len(s["response_ids"]) for s in st) for st in steps]
    assert ro.group_id.nunique() == 2  # one GRPO group per instance_id
    assert ro.finish_reason.tolist() == ["stop"] * 4
    # the reward sits on the last step's assistant tokens: the turn that answered
    tr = store.df("SELECT rollout_id, turn_idx, value FROM turn_rewards ORDER BY rollout_id")
    last = [max(i for i, t in enumerate(turns(store, rid)) if t[0] == "assistant") for rid in ro.rollout_id]
    got = {(rid, i): v for rid, i, v in tr.itertuples(index=False)}
    assert got == {(rid, n): 1.0 for rid, n, ok in zip(ro.rollout_id, last, [1, 0, 1, 1], strict=True) if ok}


def test_trl_rollout_function_rows_keep_reward_functions_and_advantage(store):
    table = pq.read_table(DATA / FIXTURES["trl-tools"]).to_pylist()
    import_run(store, DATA / FIXTURES["trl-tools"], tokenizer=TOKENIZER)
    ro = rollouts(store)
    assert ro.train_step.tolist() == [3] * 4
    assert ro.train_advantage.tolist() == [r["advantage"] for r in table]
    assert ro.correct.tolist() == [r["accuracy_reward"] == 1.0 for r in table]
    assert store.scalar("SELECT count(*) FROM prompts") == 2  # the templated prompt read back: one per problem


def test_rllm_episode_steps_are_assistant_turns_after_what_they_observed(store):
    recs = lines(FIXTURES["rllm"])
    import_run(store, DATA / FIXTURES["rllm"], tokenizer=TOKENIZER)
    ro = rollouts(store)
    assert ro.finish_reason.tolist() == ["stop"] * 4  # env_done
    first = turns(store, ro.rollout_id[0])
    assert [t[0] for t in first] == ["assistant", "tool", "assistant"]
    assert first[1][3] == "888"  # the tool message's text
    # observation tokens (the next step's prompt past the last response) are masked, in the tool turn's span
    obs = sum(len(b["prompt_ids"]) - len(a["prompt_ids"]) - len(a["response_ids"])
              for r in recs for t in r["trajectories"] for a, b in zip(t["steps"], t["steps"][1:], strict=False))
    assert store.scalar("SELECT count(*) FROM tokens WHERE NOT trained") == obs > 0
    assert (first[1][1], first[1][2]) == (first[0][2], first[2][1])
    # each step's reward on its assistant turn; the episode's is_correct as a correctness component
    tr = store.df("SELECT turn_idx, value FROM turn_rewards WHERE rollout_id = ? ORDER BY turn_idx",
                  [ro.rollout_id[0]])
    assert tr.values.tolist() == [[0, 0.0], [2, 1.0]]
    assert ro.correct.tolist() == [r["is_correct"] for r in recs]


def test_chat_and_responses_give_the_same_conversation_with_the_failed_call_marked(store, tmp_path):
    import_run(store, DATA / FIXTURES["openai-chat"])
    chat = [turns(store, rid) for rid in rollouts(store).rollout_id]
    ro = rollouts(store)
    assert ro.n_tool_errors.tolist() == [0, 1, 0, 0]
    failed = chat[1][1]
    assert failed[0] == "tool" and failed[7] == "invalid expression: '37 x 24'"  # TRL's {'error': …} content
    assert chat[0][0][6] == "call_00" and chat[0][1][6] == "call_00"  # the call and its answer, by id
    prompt = json.loads(store.scalar("SELECT messages FROM prompts WHERE prompt_id = ?", [ro.prompt_id[0]]))
    assert [m["role"] for m in prompt] == ["system", "user"]  # the messages before the first assistant message
    assert store.scalar("SELECT count(*) FROM tokens") == 0
    other = Store.open(tmp_path / "r.duckdb")
    try:
        import_run(other, DATA / FIXTURES["openai-responses"])
        resp = [turns(other, rid) for rid in rollouts(other).rollout_id]
        assert resp == chat
        assert rollouts(other).n_tool_errors.tolist() == [0, 1, 0, 0]
    finally:
        other.close()


def test_token_ids_without_a_tokenizer_are_kept_undecoded(store):
    import_run(store, DATA / FIXTURES["verl-agent"])
    assert store.scalar("SELECT count(*) FROM tokens WHERE token_text IS NULL") == \
        store.scalar("SELECT count(*) FROM tokens") == 528
    assert store.scalar("SELECT count(*) FROM tokens WHERE NOT trained") == 170
    with pytest.raises(ImportFormatError, match="no tokenizer.json"):
        import_run(store, DATA / FIXTURES["verl-agent"], tokenizer=DATA)
    rep = import_run(store, DATA / FIXTURES["skyrl"])  # no prompt messages either: the ids tell prompts apart
    texts = store.df("SELECT DISTINCT p.text FROM rollouts r JOIN prompts p USING (prompt_id) WHERE run_id = ?",
                     [rep.run_id]).text.tolist()
    assert len(texts) == 2 and all("import with a tokenizer" in t for t in texts)


def test_a_single_turn_import_counts_one_assistant_turn(store, tmp_path):
    f = tmp_path / "dump.jsonl"
    f.write_text(json.dumps({"prompt": "2+2?", "response": "4", "reward": 1.0}) + "\n")
    import_run(store, f)
    assert rollouts(store)[["n_turns", "n_tool_calls", "n_tool_errors"]].values.tolist() == [[1, 0, 0]]


# ----------------------------------------------------------------------------------- bad input

def _verl_bad(rec: dict) -> dict:
    rec = dict(rec)
    rec["response_mask"] = rec["response_mask"][:-1]
    return rec


def _too_many_scores(rec: dict) -> dict:
    rec = json.loads(json.dumps(rec))
    rec["extra_fields"]["turn_scores"] = [0.5] * 9
    return rec


def _tool_before_call(rec: dict) -> dict:
    rec = json.loads(json.dumps(rec))
    rec["messages"][3]["tool_call_id"] = "call_99"
    return rec


def _unknown_role(rec: dict) -> dict:
    rec = json.loads(json.dumps(rec))
    rec["messages"][3]["role"] = "observer"
    return rec


BAD = {  # case -> (format, broken record, what the message says)
    "mask length": ("verl-agent", _verl_bad, "'response_mask' has 123 entries but 'response_ids' has 124 tokens"),
    "per-turn rewards": ("verl-agent", _too_many_scores, "turn_scores' has 9 scores but the response has 2 assistant"),
    "out of order": ("openai-chat", _tool_before_call, "answers call 'call_99', which no earlier assistant message"),
    "unknown role": ("openai-chat", _unknown_role, "message 3 has role 'observer'"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_trajectory_is_named_by_file_and_line_and_the_rest_imports(store, tmp_path, case):
    fmt, breaks, message = BAD[case]
    recs = lines(FIXTURES[fmt])
    recs[0] = breaks(recs[0])
    f = tmp_path / FIXTURES[fmt]
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    with pytest.raises(MalformedInput) as exc:
        import_run(store, f, tokenizer=TOKENIZER)
    assert f"{f}:1: " in str(exc.value) and message in str(exc.value)
    assert store.scalar("SELECT count(*) FROM rollouts") == store.scalar("SELECT count(*) FROM turns") == 0
    rep = import_run(store, f, on_error="skip", tokenizer=TOKENIZER)
    assert (rep.n_rollouts, rep.n_skipped) == (3, 1)
    assert store.scalar("SELECT count(DISTINCT rollout_id) FROM turns") == 3


def test_a_skyrl_trajectory_without_its_last_step_is_refused_on_each_of_its_lines(store, tmp_path):
    recs = lines(FIXTURES["skyrl"])
    f = tmp_path / "steps.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in recs[:-2]))  # the third trajectory's last step is missing
    rep = import_run(store, f, on_error="skip", tokenizer=TOKENIZER)
    assert rep.n_rollouts == 2
    assert [(p.line, "has no step with is_last_step true" in p.message) for p in rep.skipped] == [(5, True)]


def test_call_arguments_that_are_not_json_are_kept_as_the_policy_wrote_them(store, tmp_path):
    rec = lines(FIXTURES["openai-chat"])[0]
    rec["messages"][2]["tool_calls"][0]["function"]["arguments"] = '{"expression": 37*24'
    f = tmp_path / "chat.jsonl"
    f.write_text(json.dumps(rec) + "\n")
    import_run(store, f)
    rid = rollouts(store).rollout_id[0]
    assert calls_of(store, rid) == ['{"expression": 37*24']
    assert rollouts(store).n_tool_calls.tolist() == [1]


def test_the_cli_imports_a_fixture_with_a_tokenizer(tmp_path, capsys):
    db = tmp_path / "s.duckdb"
    assert import_cli.main([str(DATA / FIXTURES["verl-agent"]), "--db", str(db), "--tokenizer", TOKENIZER]) == 0
    assert "4 rollouts, 528 tokens" in capsys.readouterr().out
    s = Store.open(db)
    try:
        assert s.scalar("SELECT count(*) FROM tokens WHERE NOT trained") == 170
        assert s.scalar("SELECT count(*) FROM turns") == 11
    finally:
        s.close()
    assert import_cli.main([str(DATA / FIXTURES["rllm"]), "--db", str(db), "--map", "prompt=x"]) == 2
    assert "rllm reads its own fields" in capsys.readouterr().err


def test_an_imported_mask_gives_no_credit_to_tool_tokens_and_its_turn_rewards_are_a_source(store):
    from studio.queries.credit import token_advantages, turn_advantages
    from studio.signals.advantages import Credit

    rep = import_run(store, DATA / FIXTURES["verl-agent"], tokenizer=TOKENIZER)
    rid = rollouts(store).rollout_id[1]  # the failed call: reward 0 against a group mean of 0.5
    trained = store.df("SELECT trained FROM tokens WHERE rollout_id = ? ORDER BY pos", [rid]).trained.to_numpy()
    weights = token_advantages(store, rid, Credit()).values
    assert (weights[~trained] == 0).all() and (weights[trained] != 0).all()
    turn = turn_advantages(store, rid, rep.rule_versions[0])
    assert turn.role.tolist() == ["assistant", "tool", "assistant"]
    assert turn.reward.tolist()[0] == -0.1


def test_a_completion_logged_as_tool_using_messages_keeps_its_turns_in_the_classic_formats(store, tmp_path):
    msgs = lines(FIXTURES["openai-chat"])[1]["messages"]
    f = tmp_path / "board.jsonl"  # OpenRLHF / RL-Logging-Board: prompt and response, here as messages
    f.write_text("".join(json.dumps({"prompt": msgs[:2], "response": msgs[2:], "reward": r, "step": 1}) + "\n"
                         for r in (0.0, 1.0)) + json.dumps({"prompt": "2+2?", "response": "4", "reward": 1.0}) + "\n")
    assert detect_format(f) == "openrlhf"
    import_run(store, f)
    ro = rollouts(store)
    assert ro[["n_turns", "n_tool_calls", "n_tool_errors"]].values.tolist() == [[3, 1, 1], [3, 1, 1], [1, 0, 0]]
    assert [t[0] for t in turns(store, ro.rollout_id[0])] == ["assistant", "tool", "assistant"]
    assert calls_of(store, ro.rollout_id[0]) == ['{"expression": "37 x 24"}']


def test_a_tailed_agent_dump_imports_the_lines_appended_since(store, tmp_path):
    from studio.ingest.tail import Tailer

    recs = (DATA / FIXTURES["verl-agent"]).read_text().splitlines(keepends=True)
    d = tmp_path / "dump"
    d.mkdir()
    f = d / "0.jsonl"
    f.write_text("".join(recs[:2]) + recs[2][:40])  # the third line still being written
    tailer = Tailer(store, d, tokenizer=TOKENIZER)
    assert tailer.poll().n_rollouts == 2
    f.write_text("".join(recs))
    assert tailer.poll().n_rollouts == 2
    assert store.scalar("SELECT count(*) FROM tokens WHERE NOT trained") == 170
    assert store.scalar("SELECT count(DISTINCT rollout_id) FROM turns") == 4


def test_enriching_an_imported_trajectory_leaves_its_tool_tokens_without_statistics(store):
    from studio.runs import enrich

    rep = import_run(store, DATA / FIXTURES["trl-tools"], tokenizer=TOKENIZER)
    assert enrich.needs_enrich(store, run_id=rep.run_id).missing.tolist() == ["stats"] * 4  # no entropies
    enrich.enrich_sync(store, "sample-chat", run_id=rep.run_id)
    assert store.scalar("SELECT count(*) FROM tokens WHERE NOT trained AND (logprob IS NOT NULL OR entropy IS NOT "
                        "NULL OR topk_ids IS NOT NULL)") == 0
    assert store.scalar("SELECT count(*) FROM tokens WHERE trained AND entropy IS NULL") == 0
    assert enrich.needs_enrich(store, run_id=rep.run_id).empty


def test_a_tailed_step_wise_skyrl_dump_waits_for_a_trajectorys_last_step(store, tmp_path):
    from studio.ingest.tail import Tailer

    recs = (DATA / FIXTURES["skyrl"]).read_text().splitlines(keepends=True)
    d = tmp_path / "dump"
    d.mkdir()
    f = d / "steps.jsonl"
    f.write_text("".join(recs[:5]))  # the third trajectory's first step, its last one not written yet
    tailer = Tailer(store, d, tokenizer=TOKENIZER)
    rep = tailer.poll()
    assert (rep.n_rollouts, rep.n_skipped) == (2, 0)
    f.write_text("".join(recs))
    rep = tailer.poll()
    assert (rep.n_rollouts, rep.n_skipped) == (2, 0)
    assert rollouts(store).n_tokens.tolist() == [124, 148, 223, 33]
