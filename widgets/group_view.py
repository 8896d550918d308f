"""Group view: every completion sampled for one prompt, side by side, with reward
components and GRPO advantage, flagged when all rewards are equal (no learning signal)."""
from __future__ import annotations

import panel as pn
import param

from studio import queries
from studio.advantages import EQUAL_TOL
from studio.store import StoreError

from .state import StudioState
from .style import CSS, SCALES, banner, chip, esc
from .token_strip import step_verdicts, strip_html

SELECTED, UNSELECTED = "#3b5bdb", "#dee2e6"


class GroupView(pn.viewable.Viewer):
    """The completions of the state's group as a grid of cards."""

    state = param.ClassSelector(class_=StudioState, doc="Shared studio state.")
    group = param.Selector(default="", objects=[""], doc="The group to show (prompt · run).")

    def __init__(self, **params):
        super().__init__(**params)
        self._labels: dict[str, str] = {}
        self._cards: dict[str, tuple[pn.Column, pn.widgets.Button]] = {}
        self._picker = pn.widgets.Select.from_param(self.param.group, name="Group", width=420)
        self._header = pn.pane.HTML("", stylesheets=[CSS], sizing_mode="stretch_width", margin=(0, 5))
        self._grid = pn.FlexBox(sizing_mode="stretch_width", css_classes=["group-grid"])
        self._layout = pn.Column(self._picker, self._header, self._grid, sizing_mode="stretch_width")
        self._refresh_choices()
        self._render()

    @param.depends("state.refresh", watch=True)
    def _refresh_choices(self) -> None:
        gs = queries.groups(self.state.store)
        self._labels = {}
        for g in gs.itertuples():
            flag = " · all equal" if g.all_equal else ""
            self._labels[f"{g.prompt} · {g.run} · {g.size}×{flag} [{g.group_id[-6:]}]"] = g.group_id
        self.param.group.objects = [""] + list(self._labels)
        self._sync_from_state()

    @param.depends("state.group_id", watch=True)
    def _sync_from_state(self) -> None:
        label = next((k for k, v in self._labels.items() if v == self.state.group_id), "")
        if label != self.group:
            self.group = label

    @param.depends("group", watch=True)
    def _push_to_state(self) -> None:
        gid = self._labels.get(self.group, "")
        if gid and gid != self.state.group_id:
            self.state.group_id = gid

    @param.depends("state.group_id", "state.channel", "state.refresh", watch=True)
    def _render(self) -> None:
        try:
            self._show()
        except StoreError as exc:  # e.g. a query past its time limit: say so in place
            self._header.object, self._grid.objects = banner("error", str(exc)), []

    def _show(self) -> None:
        st = self.state
        self._cards = {}
        if not st.group_id:
            self._header.object = '<div class="empty">Select a rollout or a group to compare its completions.</div>'
            self._grid.objects = []
            return
        df = queries.group(st.store, st.group_id)
        if df.empty:
            self._header.object = '<div class="empty">This group has no rollouts.</div>'
            self._grid.objects = []
            return
        first = df.iloc[0]
        gold = queries.prompt_of_row(first.to_dict()).gold.get("answer", "?")
        rewards = df["reward"].astype(float)
        n_ok = int((df["accuracy"] >= 1).sum())
        head = (f'<div class="meta-line"><span>prompt <b>{esc(first["prompt"])}</b></span>'
                f'<span>gold <b>{esc(gold)}</b></span><span><b>{len(df)}</b> completions</span>'
                f'<span><b>{n_ok}</b> correct</span><span>mean reward <b>{rewards.mean():.3f}</b></span>'
                f'<span>std <b>{rewards.std(ddof=1) if len(df) > 1 else 0:.3f}</b></span></div>')
        if len(df) > 1 and rewards.max() - rewards.min() <= EQUAL_TOL:
            head += banner("warn", f"All {len(df)} rewards are equal ({rewards.iloc[0]:.3f}): every GRPO "
                                   "advantage is 0 and this group gives no learning signal.")
        self._header.object = head
        self._grid.objects = [self._card(row, df.attrs.get("components", [])) for _, row in df.iterrows()]
        self._highlight()

    def _card(self, row, components: list[str]) -> pn.Column:
        st = self.state
        toks = queries.tokens(st.store, row["rollout_id"])
        ok = row["accuracy"] is not None and row["accuracy"] >= 1
        comps = "".join(f'<span>{esc(c)} <b>{row[c]:.2f}</b></span>' for c in components if row[c] is not None)
        html = (f'<div class="meta-line"><b>#{int(row["sample_idx"])}</b>'
                f'{"<b class=ok>✓</b>" if ok else "<b class=bad>✗</b>"}'
                f'<span>reward <b>{row["reward"]:.3f}</b></span>'
                f'<span>adv {chip(row["advantage"], SCALES["advantage"])}</span></div>'
                f'<div class="meta-line">{comps}</div>'
                + strip_html(toks, st.channel, row["advantage"], None, step_verdicts(row.to_dict()), compact=True))
        button = pn.widgets.Button(name="Open tokens", button_type="light", width=110, height=28, margin=(0, 5))
        button.on_click(lambda e, rid=row["rollout_id"]: setattr(st, "rollout_id", rid))
        card = pn.Column(pn.pane.HTML(html, stylesheets=[CSS], sizing_mode="stretch_width", margin=0), button,
                         width=300, margin=4, css_classes=["group-card"],
                         styles={"border": f"1px solid {UNSELECTED}", "border-radius": "8px", "padding": "6px",
                                 "background": "#ffffff"})
        self._cards[row["rollout_id"]] = (card, button)
        return card

    @param.depends("state.rollout_id", watch=True)
    def _highlight(self) -> None:
        """Mark the card of the rollout open in the token strip (no re-query)."""
        for rid, (card, button) in self._cards.items():
            chosen = rid == self.state.rollout_id
            card.styles = dict(card.styles, border=f"1px solid {SELECTED if chosen else UNSELECTED}")
            button.button_type = "primary" if chosen else "light"

    def __panel__(self):
        return self._layout
