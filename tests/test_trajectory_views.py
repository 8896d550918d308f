"""Seeing an agent trajectory: the strip as a conversation with tool blocks, the weight channel on
masked tokens, the group cards, the table's turns column and filters, the static export.

``write_trajectories`` builds trajectories the way the agent loop returns them
(``backends.Generation`` with ``Turn``s and a loss mask, tokens from the chat policy's tokenizer) and
stores them through ``generation_rows``; the Chromium tests (``tests/ui/test_trajectories.py``) serve it.
"""
from __future__ import annotations

import html
import json
import re

import numpy as np
import pandas as pd
import pytest

from backends import Generation, Turn
from sample_data import CHAT_POLICY_DIR, ROLLOUTS_DIR
from studio import queries
from studio.queries.table import RolloutFilter, rollout_table_count
from studio.queries.turns import has_trajectories
from studio.rewards import default_rule
from studio.runs.generation import ingest
from studio.store import Store
from studio.store.runs import start_run
from studio.tasks import Prompt, get_task

HOSTILE = "<script>alert(1)</script>"
# a 20 kB JSON answer on one line (a search tool's dump)
LONG_JSON = json.dumps({"rows": [{"id": i, "name": f"item-{i:05d}", "tags": ["alpha", "beta", "gamma"]}
                                 for i in range(300)]}, separators=(",", ":"))


def _call(tool: str, args: str) -> str:
    return f'<tool_call>{{"name": "{tool}", "arguments": {args}}}</tool_call>'


def _reply(text: str) -> str:
    return f"<tool_response>{text}</tool_response>"


# (role, text, tool_name, tool_args, error) per turn; prompt "Q: 372+489-57=" (gold 804)
CALC = '{"expression": "372+489"}'
TRAJECTORIES = {
    "ok": [("assistant", _call("calculator", CALC), "calculator", CALC, None),
           ("tool", _reply("861"), "calculator", None, None),
           ("assistant", "861-57=804;A:804", None, None, None)],
    "retry": [("assistant", _call("calculator", '{"expression": 372+}'), "calculator", '{"expression": 372+}', None),
              ("tool", _reply("error: the call is not valid JSON"), "calculator", None,
               "the call is not valid JSON: Expecting value: line 1 column 41"),
              ("assistant", _call("calculator", CALC), "calculator", CALC, None),
              ("tool", _reply("861"), "calculator", None, None),
              ("assistant", "861-57=814;A:814", None, None, None)],
    "hostile": [("assistant", _call("search", '{"q": "372+489"}'), "search", '{"q": "372+489"}', None),
                ("tool", _reply(HOSTILE + LONG_JSON), "search", None, None),
                ("assistant", "372+489=861;861-57=804;A:804", None, None, None)],
    "alone": [("assistant", "372+489=851;851-57=794;A:794", None, None, None)],
}
PROMPT = Prompt("Q: 372+489-57=", {"answer": "804", "solution": "372+489=861;861-57=804;A:804"})


def _generation(tok, index: int, turns: list[tuple], rng: np.random.Generator) -> Generation:
    """A Generation as the agent loop returns it: the policy's tokens with statistics, the tools' masked."""
    ids, spans = [], []
    for _role, text, *_ in turns:
        piece = tok.encode(text)
        spans.append((len(ids), len(ids) + len(piece)))
        ids += piece
    ids.append(tok.convert_tokens_to_ids("<|im_end|>"))
    spans[-1] = (spans[-1][0], len(ids))
    T = len(ids)
    mask = np.ones(T, dtype=bool)
    for (role, *_), (a, b) in zip(turns, spans, strict=True):
        mask[a:b] = role != "tool"
    lp = np.where(mask, -rng.uniform(0, 3, T), np.nan).astype(np.float32)
    ent = np.where(mask, rng.uniform(0, 2, T), np.nan).astype(np.float32)
    topk = np.where(mask[:, None], rng.integers(0, 500, (T, 3)), -1)
    topk_lp = np.where(mask[:, None], np.sort(-rng.uniform(0, 4, (T, 3)), 1)[:, ::-1], np.nan).astype(np.float32)
    texts = [tok.decode([i]) for i in ids]
    return Generation(
        prompt_index=0, sample_idx=index, prompt=PROMPT.text, text="".join(texts), token_ids=np.array(ids),
        token_texts=texts, logprobs=lp, entropies=ent, topk_ids=topk, topk_logprobs=topk_lp, finish_reason="stop",
        loss_mask=mask, turns=[Turn(role, a, b, text, tool_name=name, tool_args=args, error=error)
                               for (role, text, name, args, error), (a, b) in zip(turns, spans, strict=True)])


def write_trajectories(store: Store) -> dict[str, str]:
    """One group of the four :data:`TRAJECTORIES` (scored by the arithmetic rule, with per-turn rewards
    from two sources on their assistant turns) in a run "agent"; returns name -> rollout id."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(CHAT_POLICY_DIR)
    task = get_task("arithmetic")
    rng = np.random.default_rng(0)
    gens = [_generation(tok, i, turns, rng) for i, turns in enumerate(TRAJECTORIES.values())]
    run_id = start_run(store, "generate", "agent", str(CHAT_POLICY_DIR), task.name, {})
    ingest(store, run_id, task, [PROMPT], gens, default_rule(task), None)
    ids = dict(zip(TRAJECTORIES, store.df("SELECT rollout_id FROM rollouts WHERE run_id = ? ORDER BY sample_idx",
                                          [run_id])["rollout_id"], strict=True))
    rows = []
    for name, turns in TRAJECTORIES.items():
        for k, (role, *_) in enumerate(turns):
            if role == "assistant":
                rows.append({"rollout_id": ids[name], "turn_idx": k, "source": "rule-turns", "value": 0.5 - 0.4 * k})
                rows.append({"rollout_id": ids[name], "turn_idx": k, "source": "ig-sample", "value": 0.25 * (k - 1)})
    store.write({"turn_rewards": pd.DataFrame(rows)})
    return ids


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    store = Store.open(tmp_path_factory.mktemp("traj") / "s.duckdb", seed_dir=ROLLOUTS_DIR)
    ids = write_trajectories(store)
    yield store, ids
    store.close()


def _strip(store: Store, rollout_id: str, channel: str = "entropy") -> tuple[str, str, str]:
    """(header, legend, strip) HTML of a rollout as the served token strip draws it."""
    from widgets.base.state import StudioState
    from widgets.token_strip import TokenStrip

    state = StudioState(store=store, channel=channel)
    view = TokenStrip(state=state)
    state.open_rollout(rollout_id)
    header, legend, strip = view.__panel__().objects[:3]
    return header.object, legend.object, strip.object


def test_weight_is_zero_on_every_masked_token(world):
    from widgets.token_values import channel_values

    store, ids = world
    toks = queries.tokens(store, ids["retry"])
    masked = ~toks["trained"].to_numpy()
    assert masked.sum() == 44 + 26  # the two tool responses' tokens
    weight = np.array(channel_values(toks, "weight", 1.5, fork_threshold=0.0), dtype=float)
    assert (weight[masked] == 0).all() and (weight[~masked] == 1.5).all()
    # unknown on the policy's tokens without an advantage, but never on a masked one: it is not in the loss
    unknown = channel_values(toks, "weight", None, fork_threshold=0.0)
    assert all(v == 0 for v, m in zip(unknown, masked, strict=True) if m)
    assert all(v is None for v, m in zip(channel_values(toks, "advantage", 1.5), masked, strict=True) if m)


def test_the_strip_reads_a_trajectory_as_a_conversation(world):
    store, ids = world
    header, legend, strip = _strip(store, ids["retry"], "weight")
    assert re.findall(r'<div class="turn (\w+)', strip) == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert "<b>5</b> turns · <b>2</b> tool calls · <b class=\"bad\">1</b> failed" in header
    # two calls, their arguments as pretty JSON (the first as written: it is not JSON)
    calls = re.findall(r'<div class="tool-call">.*?</div></div>', strip, re.S)
    assert len(calls) == 2 and all("calculator" in c for c in calls)
    assert "{&quot;expression&quot;: 372+}" in calls[0] and '{\n  &quot;expression&quot;: &quot;372+489&quot;\n}' in calls[1]
    # the tool responses: greyed blocks tagged masked, the failed one with its error
    replies = re.findall(r'<div class="tool-reply( failed)?">', strip)
    assert replies == [" failed", ""] and strip.count('class="masked-tag"') == 2
    assert "call failed</b> · the call is not valid JSON: Expecting value" in strip
    # the policy's tokens alone are drawn as tokens, coloured; none of a tool's
    toks = queries.tokens(store, ids["retry"])
    drawn = [int(p) for p in re.findall(r'<span class="tok[^"]*" data-pos="(\d+)"', strip)]
    assert drawn == toks.loc[toks["trained"], "pos"].tolist()
    # under each assistant turn: a bar per reward source and the turn advantage
    assert strip.count('class="tbar reward"') == 3 * 2 and strip.count('class="tbar adv"') == 3
    assert "turn reward · ig-sample, rule-turns" in legend and "turn advantage · ig-sample" in legend
    assert "tool response: masked" in legend


def test_hostile_tool_output_is_escaped_whole(world):
    store, ids = world
    _, _, strip = _strip(store, ids["hostile"])
    assert "<script>" not in strip and "&lt;script&gt;alert(1)&lt;/script&gt;" in strip
    body = re.search(r'<div class="tool-reply">.*?<div class="t-body">(.*?)</div>', strip, re.S).group(1)
    assert len(body) > 20_000 and html.unescape(body) == f"<tool_response>{HOSTILE}{LONG_JSON}</tool_response>"


def test_a_single_answer_looks_as_before(world):
    store, _ = world
    rid = store.scalar("SELECT rollout_id FROM rollouts WHERE n_turns = 1 ORDER BY rollout_id LIMIT 1")
    header, legend, strip = _strip(store, rid)
    assert 'class="convo"' in strip and "trajectory" not in strip and "tool-" not in strip and "tbar" not in strip
    assert "turns" not in header and "masked" not in legend


def test_a_trajectory_imported_as_text_shows_each_turn_s_text(world):
    store, ids = world
    rid = "r-text-only"
    ro = store.df("SELECT * FROM rollouts WHERE rollout_id = ?", [ids["retry"]])
    ro["rollout_id"], ro["n_tokens"], ro["group_id"] = rid, None, "g-text-only"
    turns = store.df("SELECT * FROM turns WHERE rollout_id = ?", [ids["retry"]])
    turns["rollout_id"], turns["start_pos"], turns["end_pos"] = rid, None, None
    store.write({"rollouts": ro, "turns": turns})
    try:
        _, _, strip = _strip(store, rid)
    finally:  # the other tests count the world's rollouts
        with store.transaction() as cur:
            cur.execute("DELETE FROM turns WHERE rollout_id = ?", [rid])
            cur.execute("DELETE FROM rollouts WHERE rollout_id = ?", [rid])
    assert re.findall(r'<div class="turn (\w+)', strip)[1:] == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert "861-57=814;A:814" in strip and strip.count('class="tool-call"') == 2 and "call failed" in strip


def test_group_cards_count_turns_calls_and_failures(world):
    from widgets.base.state import StudioState
    from widgets.group_view import GroupView

    store, ids = world
    state = StudioState(store=store)
    view = GroupView(state=state)
    state.open_rollout(ids["retry"])
    header, grid = view.__panel__().objects[1:3]
    cards = dict(zip(re.findall(r'data-rollout="([^"]+)"', grid.object), grid.object.split('class="group-card')[1:],
                     strict=True))
    assert "<b>5</b> turns" in cards[ids["retry"]] and "⚙ <b>2</b> calls" in cards[ids["retry"]]
    assert "<span class=bad>✗ <b>1</b> failed</span>" in cards[ids["retry"]]
    assert "<b>1</b> turn<" in cards[ids["alone"]]  # a single answer among trajectories says so too
    # a tool's response folds into one chip: the 15,845 tokens of the hostile one are not drawn one by one
    assert "⚙ 15845 tok" in cards[ids["hostile"]] and cards[ids["hostile"]].count('class="tok') < 200
    assert "turns <b>3.0</b> · tool calls <b>1.0</b> per trajectory · <b>1</b> of 4 calls failed" in header.object


def test_filters_keep_trajectories_by_turns_tool_and_failures(world):
    store, ids = world
    total = queries.rollout_count(store)

    def kept(**kw) -> set[str]:
        f = RolloutFilter(**kw)
        rows = set(queries.rollout_table(store, f)["rollout_id"])
        assert rollout_table_count(store, f) == len(rows)
        return rows

    assert kept(min_turns=3) == {ids["ok"], ids["retry"], ids["hostile"]}
    assert kept(min_turns=4) == {ids["retry"]}
    assert kept(tool="search") == {ids["hostile"]} and kept(tool="calculator") == {ids["ok"], ids["retry"]}
    assert kept(tool_errors=True) == {ids["retry"]} and len(kept(tool_errors=False)) == total - 1
    assert kept(tool="calculator", tool_errors=False) == {ids["ok"]}
    # a reward range with them (one version's rows, cut by creation time first) and a sort by reward
    assert kept(min_turns=3, reward_min=0.05) == {ids["hostile"]}
    f = RolloutFilter(min_turns=2)
    assert set(queries.rollout_table(store, f, sort=("reward", True))["rollout_id"]) == kept(min_turns=2)
    # the turns column sorts every row by the number of turns
    assert queries.rollout_table(store, RolloutFilter(limit=3), sort=("turns", True))["rollout_id"].tolist()[0] \
        == ids["retry"]
    # the Python API shares them
    from studio.face.api import Studio

    assert set(Studio(store, None).rollouts(min_turns=4, tool="calculator", tool_errors=True)["rollout_id"]) \
        == {ids["retry"]}


def test_the_table_shows_turns_and_its_filters_only_with_trajectories(world, tmp_path):
    from widgets.base.state import StudioState
    from widgets.rollout_table import RolloutTable

    plain = Store.open(tmp_path / "plain.duckdb", seed_dir=ROLLOUTS_DIR)
    assert not has_trajectories(plain)
    table = RolloutTable(state=StudioState(store=plain))
    assert not table._trajectory_filters.visible and "turns" in table._table.hidden_columns
    plain.close()

    store, ids = world
    assert has_trajectories(store)
    table = RolloutTable(state=StudioState(store=store))
    assert table._trajectory_filters.visible and "turns" not in table._table.hidden_columns
    assert table.param.tool.objects == ["any tool", "calculator", "search"]
    table.param.update(min_turns=3, tool_failures="some failed")
    assert table.state.table_filter.min_turns == 3 and table.state.table_filter.tool_errors is True
    shown = table._table.value
    assert shown["rollout_id"].tolist() == [ids["retry"]] and shown["turns"].tolist() == ["5·2⚙·1✗"]
    assert "<b>1</b> of" in table._count.object


def test_the_static_export_shows_the_same_blocks(world, tmp_path):
    from studio.face.api import Studio

    store, ids = world
    s = Studio(store, None)
    page = s.save_html(tmp_path / "r.html", rollout=ids["retry"]).read_text()
    assert page.count('<div class="tool-reply') == 2 and page.count('<div class="tool-call">') == 2
    assert "call failed" in page and page.count('class="tbar') >= 9
    gid = store.scalar("SELECT group_id FROM rollouts WHERE rollout_id = ?", [ids["retry"]])
    page = s.save_html(tmp_path / "g.html", group=gid).read_text()
    # the prompt's turn once; every trajectory's tool turns kept (1 + 2 + 1)
    assert page.count('<div class="turn user">') == 1 and page.count('<div class="tool-reply') == 4
    assert "<script>alert" not in page
