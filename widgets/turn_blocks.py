"""An agent trajectory as a conversation, as the token strip and the static export draw it.

A trajectory's completion is a sequence of turns (``studio.queries.turns``), shown in order after
the prompt's system and user turns:

- an assistant turn: its tokens, as the token strip draws them (coloured by the channel, hover
  cards, forks, clickable to branch), and, when it ends in a tool call, the call as its own block
  (the tool's name, its arguments as pretty JSON);
- a tool turn: the tool's response as a greyed block tagged "masked" (its tokens are not the
  policy's: not trained, no statistics, never coloured by the channel), with a red edge and the
  error when the call failed;
- a user or system turn inside the completion (an import's): its text, as the prompt's turns.

Under a turn sit its per-turn rewards, one signed bar per source on :data:`TURN_SCALE`, and its
turn-level advantage on the advantage scale. Everything from a model, a tool or a user is
escaped and wraps: a ``<script>`` in a tool's output is text, a 20 kB line of JSON breaks inside
its block (no horizontal scroll).
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from studio.queries import credit
from studio.queries.turns import turn_rewards_of, turns_of
from studio.signals.turns import TurnCredit
from studio.store import Store

from .base.style import SCALES, STEP_SCALE, Scale, esc
from .conversation import turn_rows_html
from .token_text import num

TURN_SCALE = replace(STEP_SCALE, name="turn", label="turn reward",
                     help="bars under a turn: its reward from each source (a rule's turn_reward, an import's "
                          "per-turn scores, information gain ig-…), signed: red below 0, blue above")
TURN_ADVANTAGE_SCALE = replace(SCALES["advantage"], name="turn-advantage", label="turn advantage",
                               help="the turn's reward normalised over the group's turns, discounted to go "
                                    "(the credit panel's per-turn settings)")
PRETTY_MAX = 4000  # arguments longer than this are shown as written (pretty JSON of a huge call only adds lines)

MASKED_KEY = ('<div class="legend turn-key"><span class="key"><span class="masked-swatch"></span>tool response: masked '
              '(not trained, no statistics)</span><span class="key"><span class="failed-swatch"></span>failed call</span>'
              '<span class="key"><span class="call-swatch"></span>tool call</span></div>')


@dataclass
class TrajectoryReads:
    """What the strip shows of a trajectory besides its tokens (:func:`trajectory_reads`)."""

    turns: pd.DataFrame  # studio.queries.turns.turns_of
    rewards: pd.DataFrame  # its turn_rewards rows, every source
    advantages: dict[int, float]  # assistant turn index -> its turn advantage (under ``source``)
    source: str | None  # the per-turn reward source the advantages come from (None: no per-turn rewards)


def trajectory_reads(store: Store, rollout_id: str, rule_version_id: str | None = None, source: str = "",
                     how: TurnCredit = TurnCredit()) -> TrajectoryReads:  # noqa: B008  (a frozen dataclass)
    """A trajectory's turns, per-turn rewards, and each assistant turn's advantage over its group
    (``studio.queries.credit.turn_advantages`` under ``how``, the sidebar's per-turn settings) from
    one source: ``source`` (the sidebar's pick) when it gave this rollout per-turn rewards, else the
    shown rule version when it did, else the first source by name."""
    rewards = turn_rewards_of(store, [rollout_id])
    sources = sorted(set(rewards["source"]))
    if not sources:
        return TrajectoryReads(turns_of(store, rollout_id), rewards, {}, None)
    source = source if source in sources else rule_version_id if rule_version_id in sources else sources[0]
    adv = credit.turn_advantages(store, rollout_id, source, how, rule_version_id)
    acting = adv[adv["role"] == "assistant"]
    return TrajectoryReads(turns_of(store, rollout_id), rewards,
                           dict(zip(acting["turn_idx"].astype(int), acting["advantage"].astype(float), strict=True)),
                           source)


def is_trajectory(tokens: pd.DataFrame) -> bool:
    """Whether a rollout's tokens span more than one turn (``turn_idx`` past 0): an agent trajectory."""
    return "turn_idx" in tokens.columns and len(tokens) > 0 and int(tokens["turn_idx"].max()) > 0


def pretty_args(args: str | None) -> str:
    """A call's arguments as indented JSON; as written when they are not JSON or very long."""
    if not args:
        return ""
    if len(args) > PRETTY_MAX:
        return args
    try:
        return json.dumps(json.loads(args), indent=2, ensure_ascii=False)
    except (ValueError, TypeError):
        return args


def call_html(tool_name: str | None, tool_args: str | None) -> str:
    """The tool call an assistant turn ends in: the tool's name and its arguments."""
    args = pretty_args(tool_args)
    return (f'<div class="tool-call"><div class="t-head"><span class="t-icon">⚙</span><span class="t-what">call</span>'
            f'<b class="t-name">{esc(tool_name or "?")}</b></div>'
            + (f'<div class="t-body">{esc(args)}</div>' if args else "") + "</div>")


def reply_html(tool_name: str | None, content: str | None, error: str | None, n_tokens: int | None) -> str:
    """A tool turn: the response the policy saw, greyed and tagged masked; a failed call's error in red."""
    size = f'<span class="t-size">{n_tokens} tok</span>' if n_tokens else ""
    err = f'<div class="t-error"><b>call failed</b> · {esc(error)}</div>' if error else ""
    body = f'<div class="t-body">{esc(content)}</div>' if content else ""
    return (f'<div class="tool-reply{" failed" if error else ""}"><div class="t-head"><span class="t-icon">⚙</span>'
            f'<b class="t-name">{esc(tool_name or "tool")}</b><span class="masked-tag" title="not trained: the '
            f'policy did not write these tokens; they have no statistics">masked</span>{size}</div>{err}{body}</div>')


def bar_html(label: str, value: float | None, scale: Scale, kind: str) -> str:
    """One signed bar: ``value`` from the track's middle, coloured on ``scale``, with its number."""
    if value is None or value != value:
        return (f'<span class="tbar {kind} none" title="{esc(label)}: none"><span class="tb-src">{esc(label)}</span>'
                '<span class="tb-track"></span><span class="tb-val">–</span></span>')
    half = max(abs(scale.lo), abs(scale.hi))
    f = max(-1.0, min(1.0, float(value) / half))
    bg, _ = scale.colors(value)
    left, width = (50.0, f * 50.0) if f >= 0 else (50.0 + f * 50.0, -f * 50.0)
    return (f'<span class="tbar {kind}" data-value="{value:.4f}" title="{esc(label)}: {value:+.4f}">'
            f'<span class="tb-src">{esc(label)}</span><span class="tb-track"><span class="tb-fill" '
            f'style="left:{left:.1f}%;width:{width:.1f}%;background:{bg}"></span></span>'
            f'<span class="tb-val">{num(value, "+.2f")}</span></span>')


def bars_html(rewards: dict[str, float], advantage: float | None) -> str:
    """A turn's reward bars (one per source) and its advantage bar; empty when it has neither."""
    bars = [bar_html(src, v, TURN_SCALE, "reward") for src, v in rewards.items()]
    if advantage is not None:
        bars.append(bar_html("advantage", advantage, TURN_ADVANTAGE_SCALE, "adv"))
    return f'<div class="turn-bars">{"".join(bars)}</div>' if bars else ""


def legend_html(reads: TrajectoryReads) -> str:
    """The trajectory's keys: masked / failed / call blocks, and the bars' scales when there are bars."""
    out = MASKED_KEY
    if len(reads.rewards):
        sources = ", ".join(sorted(set(reads.rewards["source"])))
        out += replace(TURN_SCALE, label=f"turn reward · {sources}").legend_html(compact=True)
    if reads.advantages:
        out += replace(TURN_ADVANTAGE_SCALE, label=f"turn advantage · {reads.source}").legend_html(compact=True)
    return out


def facts_html(turns: pd.DataFrame) -> str:
    """The header's line on a trajectory: its turns, tool calls and failed calls."""
    n_calls = int(((turns["role"] == "assistant") & turns["tool_name"].notna()).sum())
    n_failed = int(((turns["role"] == "tool") & turns["error"].notna()).sum())
    failed = f' · <b class="bad">{n_failed}</b> failed' if n_failed else ""
    return f'<span class="traj-facts"><b>{len(turns)}</b> turns · <b>{n_calls}</b> tool calls{failed}</span>'


def trajectory_html(prompt_turns: list[dict[str, str]], reads: TrajectoryReads, positions: np.ndarray,
                    draw: Callable[[int, int], str] | None) -> str:
    """The whole conversation: the prompt's turns, then each turn of the completion in order.

    ``reads``: its turns, per-turn rewards and turn advantages; ``positions``: its tokens' ``pos`` in
    order; ``draw(a, b)``: the strip of token rows ``a .. b-1`` (an assistant turn's tokens), None
    when the rollout has no tokens (imported as text: each turn's text is shown).
    """
    rewards: dict[int, dict[str, float]] = {}
    r = reads.rewards
    for k, src, v in zip(r["turn_idx"], r["source"], r["value"], strict=True):
        rewards.setdefault(int(k), {})[str(src)] = None if pd.isna(v) else float(v)
    rows = [turn_rows_html(prompt_turns)]
    for t in reads.turns.itertuples(index=False):
        k = int(t.turn_idx)
        name, args, content, error = (None if pd.isna(v) else str(v) for v in (t.tool_name, t.tool_args, t.content, t.error))
        has_tokens = not (pd.isna(t.start_pos) or pd.isna(t.end_pos))
        a, b = (int(np.searchsorted(positions, int(t.start_pos))), int(np.searchsorted(positions, int(t.end_pos)))) \
            if has_tokens else (0, 0)
        bars = bars_html(rewards.get(k, {}), reads.advantages.get(k) if t.role == "assistant" else None)
        if t.role == "tool":
            body = reply_html(name, content, error, b - a if has_tokens else None)
        elif t.role == "assistant":
            said = draw(a, b) if draw is not None and b > a else \
                f'<div class="strip plain-text">{esc(content or "")}</div>'
            body = said + (call_html(name, args) if name is not None else "")
        else:  # a user or system turn the completion holds (an import's): its text
            body = f'<div class="say inside">{esc(content or "")}</div>'
        role = t.role if t.role in ("system", "user", "assistant", "tool") else "other"
        rows.append(f'<div class="turn {role} in-completion" data-turn="{k}"><span class="role">{esc(t.role)}'
                    f'<span class="t-idx">turn {k + 1}</span></span><div class="say-strip">{body}{bars}</div></div>')
    return f'<div class="convo trajectory">{"".join(rows)}</div>'
