"""Group view: every completion sampled for one prompt, side by side, with reward
components and GRPO advantage, flagged when all rewards are equal (no learning signal). An agent
trajectory's card adds its turns, tool calls, failed calls and length as chips, and its strip
folds each tool response (masked: not trained) into one grey chip.

✓ / ✗ on a card and the header's count of correct ones are the rollout's own correctness
(``correct``: its task's check of the final answer, or an import's field; – when there is no
gold answer), whatever rule version is shown; the header names the version the rewards come
from (several, per card, when each rollout's latest scoring differs).

The grid is one HTML pane built from the group scored from point reads (``queries.scored_group``,
as the token strip's header is) and one read of its tokens, so switching groups stays cheap
when many sessions browse at once; a selection change only moves the highlight in the cached
cards.
"""
from __future__ import annotations

import pandas as pd
import panel as pn
import param

from studio import queries
from studio.queries import credit
from studio.signals.advantages import EQUAL_TOL, ESTIMATORS
from studio.store import StoreError

from .base.clickable import MarkedHTML
from .base.state import StudioState
from .base.style import CSS, REDRAWN, SCALES, banner, chip, esc
from .token_strip import step_verdicts, strip_html

GRID_CSS = """
.grid { display:flex; flex-wrap:wrap; gap:8px; }
.group-card { width:290px; border:1px solid #dee2e6; border-radius:8px; padding:6px 8px; background:#fff; }
.group-card.selected { border:2px solid #3b5bdb; padding:5px 7px; }
"""


NEWEST_GROUPS = 50  # the picker's groups when no table gives a page of them


class GroupView(pn.viewable.Viewer):
    """The completions of the state's group as a grid of cards."""

    state = param.ClassSelector(class_=StudioState, doc="Shared studio state.")
    group = param.Selector(default="", objects=[""], doc="The group to show (prompt · run).")
    open_sample = param.Selector(default=None, objects=[], allow_None=True,
                                 doc="The completion of this group to open in the token strip.")

    def __init__(self, **params):
        super().__init__(**params)
        self._labels: dict[str, str] = {}
        self._samples: dict[str, str] = {}  # "#3" -> rollout_id
        self._cached: tuple[list[dict], dict[str, pd.DataFrame], tuple] | None = None  # rows, tokens, key
        self._cards: dict[str, str] = {}  # channel -> the cached group's cards
        self._picker = pn.widgets.Select.from_param(self.param.group, name="Group (of the table's page)", width=420,
                                                    css_classes=["group-picker"])
        self._opener = pn.widgets.RadioButtonGroup.from_param(self.param.open_sample, name="Open in token strip",
                                                              color="light", css_classes=["open-picker"])
        self._header = pn.pane.HTML("", stylesheets=[CSS], sizing_mode="stretch_width", margin=(0, 5), **REDRAWN)
        self._grid = MarkedHTML(object="", stylesheets=[CSS, GRID_CSS], sizing_mode="stretch_width", **REDRAWN,
                                  css_classes=["group-grid"])
        self._layout = pn.Column(pn.Row(self._picker, self._opener), self._header, self._grid,
                                 sizing_mode="stretch_width")
        self.state.add_preloader(self._preload)
        self._refresh_choices()
        self._render()

    def _picker_key(self, page_groups: list[str] | None = None, group_id: str | None = None) -> tuple:
        st = self.state
        return ("groups", st.rule_version or None, tuple(st.page_groups if page_groups is None else page_groups),
                st.group_id if group_id is None else group_id)

    def _load_choices(self) -> None:
        key = self._picker_key()
        self._labels = self.state.preloaded(key, lambda: self._groups(*key[1:]))
        self.param.group.objects = [""] + list(self._labels)

    @param.depends("state.refresh", "state.page_groups", watch=True)
    def _refresh_choices(self) -> None:
        self._load_choices()
        self._sync_from_state()

    @param.depends("state.group_id", watch=True)
    def _sync_from_state(self) -> None:
        if self.state.group_id and self.state.group_id not in self._labels.values():  # e.g. opened from another view
            self._load_choices()
        label = next((k for k, v in self._labels.items() if v == self.state.group_id), "")
        if label != self.group:
            self.group = label

    @param.depends("group", watch=True)
    def _push_to_state(self) -> None:
        gid = self._labels.get(self.group, "")
        if gid and gid != self.state.group_id:
            self.state.group_id = gid

    @param.depends("open_sample", watch=True)
    def _open(self) -> None:
        rid = self._samples.get(self.open_sample or "")
        if rid and rid != self.state.rollout_id:
            with pn.io.hold():
                self.state.rollout_id = rid

    def _group_key(self, group_id: str) -> tuple:
        st = self.state
        return ("group", group_id, st.credit(), st.rule_version or None)

    def _load(self, key: tuple, scored: queries.ScoredGroup | None = None) -> tuple[list[dict], dict, dict]:
        """The group's rows (scored), tokens and per-token advantages (token-level estimators only):
        store reads only, so it can run on a thread (:meth:`_preload`)."""
        _, group_id, cr, rule_version = key
        st = self.state
        if not group_id:
            return [], {}, {}
        if scored is None:
            scored = queries.scored_group(st.store, rule_version_id=rule_version, credit=cr, group_id=group_id)
        rows = scored.rows
        toks = queries.tokens_of(st.store, [r["rollout_id"] for r in rows]) if rows else {}
        adv = {}
        if rows and ESTIMATORS[cr.estimator].level == "token":  # per-token values vary along each completion
            adv = {r["rollout_id"]: credit.token_advantages(st.store, r["rollout_id"], cr, rule_version, scored).values
                   for r in rows}
        return rows, toks, adv

    def _preload(self, rollout_id: str, group_id: str, found: dict, fresh: bool) -> None:
        """Read ahead a newly selected group (on a thread: see StudioState.select), from the scored
        group the token strip's preloader read when it is this one; after new rows, the picker's
        groups too."""
        if fresh:  # the table's preloader ran first: the groups of its page as it will be
            key = self._picker_key(found.get(("page_groups",)), group_id)
            found[key] = self._groups(*key[1:])
        elif group_id == self.state.group_id:  # the same group: only the highlight moves
            return
        key = self._group_key(group_id)
        found[key] = rows, toks, adv = self._load(key, found.get(("scored_group",) + key[1:]))
        channel = self.state.channel  # its cards drawn here too: the event loop then only sets them
        found[("group_cards", key, channel)] = self._cards_html(rows, toks, adv, channel)

    def _groups(self, rule_version: str | None, page_groups: tuple[str, ...], shown: str) -> dict[str, str]:
        """The picker's labels -> group ids: the groups on the table's page and the shown group
        (with no table, as in a notebook's ``group_view``, the store's newest groups)."""
        labels = {}
        st = self.state
        if page_groups:
            gs = queries.groups(st.store, rule_version_id=rule_version, group_ids=list({*page_groups, shown} - {""}))
        else:
            gs = queries.groups(st.store, rule_version_id=rule_version, limit=NEWEST_GROUPS)
            if shown and shown not in set(gs["group_id"]):
                gs = pd.concat([queries.groups(st.store, rule_version_id=rule_version, group_ids=[shown]), gs])
        for g in gs.itertuples():
            flag = " · all equal" if g.all_equal else ""
            labels[f"{g.prompt} · {g.run} · {g.size}×{flag} [{g.group_id[-6:]}]"] = g.group_id
        return labels

    @param.depends("state.group_id", "state.refresh", "state.estimator", "state.kl_beta", "state.reference",
                   "state.gae_gamma", "state.gae_lam", "state.value_source", "state.rule_version", watch=True)
    def _render(self) -> None:
        """Load the group (scored from point reads, as the token strip's header is) and its tokens,
        and draw it."""
        st = self.state
        self._cached = None
        self._cards = {}
        key = self._group_key(st.group_id)
        try:
            rows, toks, self._token_adv = st.preloaded(key, lambda: self._load(key))
        except StoreError as exc:  # e.g. a query past its time limit: say so in place
            self._header.object, self._grid.object = banner("error", str(exc)), ""
            return
        except ValueError as exc:  # an estimator setting that cannot be used: say which
            self._header.object, self._grid.object = banner("error", str(exc)), ""
            return
        self._samples = {f"#{int(r['sample_idx'])}": r["rollout_id"] for r in rows}
        self.param.open_sample.objects = list(self._samples)
        if not st.group_id or not rows:
            msg = "Select a rollout or a group to compare its completions." if not st.group_id else "This group has no rollouts."
            self._header.object, self._grid.object = f'<div class="empty">{esc(msg)}</div>', ""
            return
        self._cached = (rows, toks, key)
        first = rows[0]
        gold = queries.prompt_of_row(first).gold.get("answer", "?")
        rewards = pd.Series([r["reward"] for r in rows], dtype=float)  # NaN: not scored (skipped below)
        n_ok = sum(1 for r in rows if r.get("correct") is True)
        n_checked = sum(1 for r in rows if r.get("correct") is not None)
        head = (f'<div class="meta-line"><span>prompt <b>{esc(first["prompt"])}</b></span>'
                f'<span>gold <b>{esc(gold)}</b></span><span><b>{len(rows)}</b> completions</span>'
                f'<span><b>{n_ok}</b> correct'
                f'{"" if n_checked == len(rows) else f" ({len(rows) - n_checked} unchecked)"}</span>'
                f'<span>mean reward <b>{rewards.mean():.3f}</b></span>'
                f'<span>std <b>{rewards.std(ddof=1) if len(rows) > 1 else 0:.3f}</b></span>'
                f'{trajectories_html(rows)}<span class="reward-version">{esc(version_label(rows, key[3]))}</span></div>')
        if len(rows) > 1 and rewards.max() - rewards.min() <= EQUAL_TOL:
            head += banner("warn", f"All {len(rows)} rewards are equal ({rewards.iloc[0]:.3f}): every group-relative "
                                   "advantage is 0 and this group gives no learning signal.")
        self._header.object = head
        self._draw()

    @param.depends("state.channel", "state.rollout_id", watch=True)
    def _draw(self) -> None:
        """Draw the cached group's cards for the current channel and mark the selected one: no
        query, and the cards are drawn once per group and channel (a click within the group sends
        only the id of the card to mark: the browser moves the highlight)."""
        if self._cached is None:
            return
        rows, toks, key = self._cached
        st = self.state
        if st.channel not in self._cards:
            self._cards[st.channel] = st.preloaded(("group_cards", key, st.channel),
                                                   lambda: self._cards_html(rows, toks, self._token_adv, st.channel))
        self._grid.param.update(object=self._cards[st.channel], marked=st.rollout_id)
        current = next((k for k, v in self._samples.items() if v == st.rollout_id), None)
        if current != self.open_sample:
            self.open_sample = current

    @staticmethod
    def _cards_html(rows: list[dict], toks: dict, token_adv: dict, channel: str) -> str:
        """The group's cards coloured by ``channel``: string work only (a thread draws them ahead)."""
        names = sorted({c for r in rows for c in r["components"] if c != "total"})
        agents = any(_count(r, "n_turns", 1) > 1 for r in rows)  # every card then says its turns, a single answer's too
        cards = "".join(GroupView._card(r, toks.get(r["rollout_id"]), names, token_adv, channel, agents) for r in rows)
        return f'<div class="grid">{cards}</div>'

    @staticmethod
    def _card(row: dict, toks: pd.DataFrame | None, components: list[str], token_adv: dict, channel: str,
              agents: bool = False) -> str:
        ok = row.get("correct")
        comps = "".join(f'<span>{esc(c)} <b>{row["components"][c]:.2f}</b></span>' for c in components
                        if row["components"].get(c) is not None)
        adv = token_adv.get(row["rollout_id"], row["advantage"]) if token_adv else row["advantage"]
        strip = strip_html(toks, channel, adv, None, step_verdicts(row), compact=True) \
            if toks is not None else '<div class="empty">no tokens stored</div>'
        reward = float("nan") if row["reward"] is None else row["reward"]
        return (f'<div class="group-card" data-rollout="{esc(row["rollout_id"])}" data-mark="{esc(row["rollout_id"])}">'
                f'<div class="meta-line"><b>#{int(row["sample_idx"])}</b>'
                f'{"<b class=ok>✓</b>" if ok else "<span>–</span>" if ok is None else "<b class=bad>✗</b>"}'
                f'<span title="{esc(row.get("rule_version_id") or "no reward")}">reward <b>{reward:.3f}</b></span>'
                f'<span>adv {chip(row["advantage"], SCALES["advantage"])}</span></div>'
                f'{trajectory_chips(row) if agents else ""}<div class="meta-line">{comps}</div>{strip}</div>')

    def __panel__(self):
        return self._layout


def _count(row: dict, name: str, default: int) -> int:
    """A rollout's trajectory count (``n_turns``, ``n_tool_calls``, ``n_tool_errors``; NULL: a single answer's)."""
    v = row.get(name)
    return default if v is None or pd.isna(v) else int(v)


def trajectory_chips(row: dict) -> str:
    """A card's line in a group of agent trajectories: its turns, tool calls, failed calls and tokens."""
    n_turns = _count(row, "n_turns", 1)
    failed = _count(row, "n_tool_errors", 0)
    n_tokens = "" if pd.isna(row.get("n_tokens")) else f'<span><b>{int(row["n_tokens"])}</b> tok</span>'
    calls = _count(row, "n_tool_calls", 0)
    return (f'<div class="traj-chips"><span><b>{n_turns}</b> turn{"s" if n_turns != 1 else ""}</span><span>⚙ <b>{calls}'
            f'</b> call{"s" if calls != 1 else ""}</span><span{" class=bad" if failed else ""}>✗ <b>{failed}</b> failed</span>{n_tokens}</div>')


def trajectories_html(rows: list[dict]) -> str:
    """The group header's line on its trajectories: turns and tool calls per trajectory, failed calls
    (nothing when every completion is a single answer)."""
    turns = [_count(r, "n_turns", 1) for r in rows]
    if max(turns, default=1) <= 1:
        return ""
    calls = sum(_count(r, "n_tool_calls", 0) for r in rows)
    failed = sum(_count(r, "n_tool_errors", 0) for r in rows)
    return (f'<span>turns <b>{sum(turns) / len(rows):.1f}</b> · tool calls <b>{calls / len(rows):.1f}</b> per trajectory'
            f' · <b>{failed}</b> of {calls} calls failed</span>')


def version_label(rows: list[dict], asked: str | None) -> str:
    """Which rule version the group's rewards come from: the one asked for, the one every card's
    latest scoring is, or, when they differ, each with its number of cards."""
    if asked:
        return f"rewards: {asked}"
    versions = pd.Series([r.get("rule_version_id") for r in rows], dtype=object).dropna()
    if versions.empty:
        return "no rewards stored"
    counts = versions.value_counts()
    if len(counts) == 1:
        return f"rewards (latest scoring): {counts.index[0]}"
    return ("rewards from each rollout's latest scoring, " + str(len(counts)) + " versions (scales may differ): "
            + ", ".join(f"{v} ×{n}" for v, n in counts.items()))
