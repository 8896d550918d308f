"""Fork panel: branch the shown rollout at the picked token and read the rollout tree.

Pick a token in the token strip; the panel lists the policy's top-k alternatives there
with their probabilities. Choose one or several (or "as sampled": draw the token again)
and a branch count N: the worker continues from the prefix with each choice forced,
scores every continuation with the reward rule, and the tree below shows each branch's
completions, reward distribution and mean reward (the value of that choice). Forks whose
branch values differ by at least ``PIVOTAL_SPREAD`` are flagged pivotal. Any branch can
be opened in the token strip and branched again. In an agent trajectory any token of an
assistant turn branches (the agent loop continues, tools run again); a token of a tool
response is the environment's, not the policy's: the panel says so instead of offering choices.
"""
from __future__ import annotations

import asyncio
import math

import pandas as pd
import panel as pn
import param

from studio import queries, workers
from studio.queries import forks, lookups
from studio.rewards import rules
from studio.runs.branch import BranchConfig, BranchError, NoPolicyError, branch, masked_fork
from studio.store import StoreError
from studio.workers.vocab import decode_ids, policy_label
from widgets.forms import parameter

from .base.clickable import ClickableHTML
from .base.jobs import Job, failure, start
from .base.state import StudioState
from .base.style import CSS, REDRAWN, banner, esc
from .fork_marks import FORK_CSS, tree_forks, tree_key
from .token_text import VISIBLE_WS, num, token_display

AS_SAMPLED = "as sampled (draw again)"

TREE_CSS = """
.fork-block { border:1px solid #dee2e6; border-radius:8px; padding:6px 8px; margin:6px 0; background:#fff; }
.fork-block.pivotal { border-color:#ffa8a8; box-shadow: inset 3px 0 0 #e03131; }
.fork-head { font-size:12px; color:#495057; display:flex; gap:10px; flex-wrap:wrap; align-items:center; }
.fork-head .ctx { font-family:'DejaVu Sans Mono', monospace; color:#868e96; }
.fork-head .ctx b { color:#212529; background:#fff3bf; padding:0 2px; border-radius:2px; }
table.branches { border-collapse:collapse; width:100%; font-size:12px; margin-top:4px; }
table.branches th { text-align:left; color:#868e96; font-weight:600; font-size:11px; padding:2px 4px; }
table.branches td { padding:2px 4px; border-top:1px solid #f1f3f5; vertical-align:middle; }
table.branches td.value { white-space:nowrap; }
td.choice { font-family:'DejaVu Sans Mono', monospace; font-weight:700; white-space:pre; }
.vbar { display:inline-block; height:9px; border-radius:2px; background:#3b5bdb; vertical-align:middle; }
.vtrack { display:inline-block; width:56px; height:9px; background:#f1f3f5; border-radius:2px; vertical-align:middle;
          margin-right:6px; }
details.comps summary { font-size:12px; color:#3b5bdb; cursor:pointer; margin-top:3px; }
.comp { font-family:'DejaVu Sans Mono', monospace; font-size:12px; padding:1px 4px; border-radius:4px; cursor:pointer;
        display:flex; gap:8px; align-items:center; }
.comp:hover { background:#edf2ff; }
.comp .pre { color:#adb5bd; }
.comp.current { background:#e7f5ff; outline:1px solid #74c0fc; }
.crumbs { font-size:12px; color:#495057; margin:2px 0 4px 0; }
.crumbs .link { margin:0 2px; }
"""


def _dots(rewards: list[float], lo: float, hi: float, width: int = 90) -> str:
    """Every completion's reward as a dot on a small axis (an inline SVG)."""
    span = (hi - lo) or 1.0
    circles = []
    for i, r in enumerate(rewards):
        x = 4 + (min(max(r, lo), hi) - lo) / span * (width - 8)
        y = 5 + (i % 3) * 3
        circles.append(f'<circle cx="{x:.1f}" cy="{y}" r="3" fill="#3b5bdb" fill-opacity="0.55"/>')
    return (f'<svg width="{width}" height="16" style="vertical-align:middle"><line x1="2" y1="14" x2="{width - 2}" '
            f'y2="14" stroke="#ced4da"/>{"".join(circles)}</svg>')


NO_BRANCHES = '<div class="empty">No branches yet: pick a token (unsure ones are marked ▾) and branch.</div>'


def _tree_head(crumbs: list[str], n_branches: int, root: str) -> str:
    return (f'<div class="crumbs">tree: {" › ".join(reversed(crumbs))} · <b>{n_branches}</b> branch rollouts · '
            f'<span class="link" data-click="branches" data-value="{esc(root)}">show all in table</span></div>')


def lone_tree_html(rollout_id: str) -> str:
    """:func:`tree_html` of a rollout that is not a branch and has none (its tree is itself)."""
    crumb = f'<span class="link" data-click="open" data-value="{esc(rollout_id)}">root · {esc(rollout_id[-6:])}</span>'
    return _tree_head([crumb], 0, rollout_id) + NO_BRANCHES


def tree_html(store, rollout_id: str, tree_df: pd.DataFrame, fork_list: list[forks.Fork],
              bounds: tuple[float, float]) -> str:
    """The rollout tree of ``rollout_id``: breadcrumbs to the root, then every fork with its branches."""
    if tree_df.empty:
        return ""
    by_id = tree_df.set_index("rollout_id")
    crumbs, cur = [], rollout_id
    while cur in by_id.index:
        row = by_id.loc[cur]
        tag = "root" if pd.isna(row["parent_rollout_id"]) else f"@{int(row['fork_pos'])} {esc(str(row['fork_token_text']).translate(VISIBLE_WS))!s}"
        crumbs.append(f'<span class="link" data-click="open" data-value="{esc(cur)}">{tag} · {esc(cur[-6:])}</span>')
        cur = row["parent_rollout_id"] if not pd.isna(row["parent_rollout_id"]) else None
    n_branches = int(tree_df["parent_rollout_id"].notna().sum())
    head = _tree_head(crumbs, n_branches, tree_df.iloc[0]["rollout_id"])
    if not fork_list:
        return head + NO_BRANCHES
    lo, hi = bounds
    blocks = []
    prefix_chars = _prefix_chars(store, fork_list)
    for f in fork_list:
        parent_text = by_id.loc[f.parent_rollout_id, "text"] if f.parent_rollout_id in by_id.index else ""
        cut = prefix_chars.get((f.parent_rollout_id, f.pos), 0)
        ctx = parent_text[max(0, cut - 18):cut]
        badge = (f'<span class="badge pivotal" title="branch values differ by ≥ {forks.PIVOTAL_SPREAD}">◆ pivotal</span>'
                 if f.pivotal else "")
        ent = "" if f.entropy is None else f"<span>H {num(f.entropy)} nats</span>"
        rows = []
        for b in f.branches:
            frac = 0.0 if not b.rewards else (min(max(b.value, lo), hi) - lo) / ((hi - lo) or 1.0)
            se = "" if math.isnan(b.stderr) else f"\u00a0±\u00a0{b.stderr:.2f}"
            label = esc(token_display(b.label)[0].translate(VISIBLE_WS)) if b.token_id is not None else "<i>as sampled</i>"
            rows.append(
                f'<tr><td class="choice">{label}</td><td>{"–" if b.p is None else num(b.p)}</td><td>{b.n}</td>'
                f'<td class="value"><span class="vtrack"><span class="vbar" style="width:{frac * 56:.0f}px"></span></span>'
                f'<b>{b.value:.3f}</b>{se}</td><td>{b.accuracy:.0%}</td><td>{_dots(b.rewards, lo, hi, width=60)}</td></tr>')
        comps = []
        sub = tree_df[(tree_df["parent_rollout_id"] == f.parent_rollout_id) & (tree_df["fork_pos"] == f.pos)]
        for r in sub.itertuples(index=False):
            cur_cls = " current" if r.rollout_id == rollout_id else ""
            pre, post = r.text[:cut], r.text[cut:]
            comps.append(f'<div class="comp{cur_cls}" data-click="open" data-value="{esc(r.rollout_id)}">'
                         f'<span style="min-width:44px">{num(r.reward, ".2f")}</span>'
                         f'<span>{"✓" if (r.accuracy or 0) >= 1 else "✗"}</span>'
                         f'<span><span class="pre">{esc(pre[-12:])}</span>{esc(post)}</span></div>')
        blocks.append(
            f'<div class="fork-block{" pivotal" if f.pivotal else ""}" data-fork-pos="{f.pos}">'
            f'<div class="fork-head"><span>token <b>{f.pos}</b> of {esc(f.parent_rollout_id[-6:])}</span>'
            f'<span class="ctx">…{esc(ctx)}<b>{esc(token_display(f.parent_token)[0])}</b></span>{ent}'
            f'<span>spread <b>{f.spread:.3f}</b></span>{badge}</div>'
            f'<table class="branches"><tr><th>choice</th><th>p</th><th>n</th><th title="the mean reward of the completions after this choice">value</th>'
            f'<th>correct</th><th>rewards</th></tr>{"".join(rows)}</table>'
            f'<details class="comps"><summary>{len(sub)} completions (click one to open it; branch it again there)'
            f'</summary>{"".join(comps)}</details></div>')
    return head + "".join(blocks)


def _prefix_chars(store, fork_list: list[forks.Fork]) -> dict[tuple[str, int], int]:
    """Characters of each fork's parent before the fork (to grey out the shared prefix)."""
    return lookups.prefix_chars(store, [(f.parent_rollout_id, f.pos) for f in fork_list])


class ForkPanel(pn.viewable.Viewer):
    """Alternatives at the picked token, the branch form, and the rollout tree."""

    state = param.ClassSelector(class_=StudioState, doc="Shared studio state.")
    choices = param.ListSelector(default=[], objects=[], doc="Alternatives to force at the fork.")
    n = parameter(BranchConfig, "n")
    temperature = parameter(BranchConfig, "temperature", step=0.1)
    running = param.Boolean(default=False, doc="A branch request is in flight.")

    def __init__(self, can_run: bool = True, **params):
        super().__init__(**params)
        self._can_run = can_run
        self._ids: dict[str, int | None] = {}
        self._job = Job(on_running=self._running)  # a branch request, cancellable
        self._attach: str | None = None
        self._tree_drawn_at = -1
        self._head = pn.pane.HTML("", stylesheets=[CSS, FORK_CSS], sizing_mode="stretch_width", margin=(0, 5), **REDRAWN,
                                  css_classes=["fork-head-info"])
        self._choice_box = pn.widgets.CheckBoxGroup.from_param(
            self.param.choices, name="", inline=True, css_classes=["fork-choices"], margin=(0, 8),
            sizing_mode="stretch_width",
            stylesheets=[":host .bk-input-group { flex-wrap: wrap; column-gap: 14px; row-gap: 2px; }"
                         " :host label { font-family: 'DejaVu Sans Mono', monospace; font-size: 12px; }"])
        self._go = pn.widgets.Button(name="Branch", color="primary", width=90, css_classes=["branch-button"])
        self._stop = pn.widgets.Button(name="Cancel", color="light", width=80, disabled=True,
                                       css_classes=["branch-cancel"])
        self._attach_btn = pn.widgets.Button(name="Attach the session policy and branch", color="warning",
                                             visible=False, css_classes=["attach-policy"])
        self._status = pn.pane.HTML("", stylesheets=[CSS], sizing_mode="stretch_width", margin=(0, 5),
                                    css_classes=["branch-status"])
        if can_run:  # browse-only sessions get no callback that could start the model
            self._go.on_click(self._on_branch)
            self._stop.on_click(lambda e: self._job.cancel())
            self._attach_btn.on_click(self._on_attach)
        self._tree = ClickableHTML(object="", stylesheets=[CSS, TREE_CSS], sizing_mode="stretch_width", **REDRAWN,
                                   margin=(0, 5), css_classes=["fork-tree"])
        self._tree.on_click(self._on_tree_click)
        if can_run:
            form = pn.FlexBox(  # the buttons wrap below the inputs in a narrow card
                pn.widgets.IntInput.from_param(self.param.n, name=f"N per choice (1-{self.param.n.bounds[1]})",
                                               width=120, css_classes=["branch-n"]),
                pn.widgets.FloatInput.from_param(self.param.temperature, name="Temperature", width=100),
                pn.Column(pn.Spacer(height=18), pn.Row(self._go, self._stop)),
                flex_wrap="wrap", align_items="flex-start", sizing_mode="stretch_width",
            )
            parts = [self._choice_box, form, self._attach_btn, self._status]
        else:
            parts = [pn.pane.HTML(banner("info", "Browsing only: branching runs the policy, which is for the "
                                                 "studio's admins."), stylesheets=[CSS], sizing_mode="stretch_width")]
        self._form = pn.Column(*parts, visible=False, sizing_mode="stretch_width")
        self._layout = pn.Column(self._head, self._form, self._tree, sizing_mode="stretch_width")
        state = self.state
        state.add_preloader(self._preload)
        self._render_pick()
        self._render_tree()

    def _preload(self, rollout_id: str, group_id: str, found: dict, fresh: bool) -> None:
        """Read ahead the tree :meth:`_render_tree` draws (the token strip's preloader, which marks
        the tree's forks, may have read it already)."""
        if ("lineage", rollout_id) not in found:
            found[("lineage", rollout_id)] = forks.lineage(self.state.store, rollout_id)
        key = tree_key(rollout_id, self.state.refresh + fresh)
        if key not in found:
            found[key] = tree_forks(self.state.store, rollout_id, found[("lineage", rollout_id)])

    # -- the picked token --------------------------------------------------------------

    @param.depends("state.fork_pos", "state.rollout_id", watch=True)
    def _render_pick(self) -> None:
        st = self.state
        self._attach = None
        self._attach_btn.visible = False
        self._status.object = ""
        if not st.rollout_id or st.fork_pos < 0:
            self._form.visible = False
            self._head.object = ('<div class="empty">Click a token in the strip to branch there: its top '
                                 'alternatives appear here. Tokens where the policy was unsure are marked '
                                 '<span class="fork-mark"></span>; branching shows whether the choice there '
                                 'decides the outcome (pivotal: <span class="pivot-mark">◆</span>).</div>')
            return
        try:
            ro = queries.rollout(st.store, st.rollout_id)
            tok = lookups.token_at(st.store, st.rollout_id, st.fork_pos)
            refused = masked_fork(st.store, st.rollout_id, st.fork_pos)
        except StoreError as exc:
            self._head.object = banner("error", str(exc))
            return
        if refused:  # a tool response's token: the policy did not write it, there is nothing to branch on
            self._form.visible = False
            self._head.object = banner("warn", refused)
            return
        if ro is None or tok.empty:
            self._form.visible = False
            self._head.object = '<div class="empty">That token is not in the store.</div>'
            return
        t = tok.iloc[0]
        ids = [int(i) for i in t["topk_ids"]]
        texts = decode_ids(ro.get("policy"), ids)
        self._ids = {}
        labels = []
        for tid, txt, lp in zip(ids, texts, t["topk_logprobs"]):
            shown = token_display(txt)[0].translate(VISIBLE_WS)
            label = f"{shown}  p {num(math.exp(lp))}" + ("  ← sampled" if tid == int(t["token_id"]) else "")
            self._ids[label] = tid
            labels.append(label)
        if int(t["token_id"]) not in ids:  # the sampled token was outside the top-k: offer it too
            shown = token_display(t["token_text"])[0].translate(VISIBLE_WS)
            label = f"{shown}  p {num(math.exp(t['logprob']))}  ← sampled"
            self._ids[label] = int(t["token_id"])
            labels.append(label)
        self._ids[AS_SAMPLED] = None
        labels.append(AS_SAMPLED)
        sampled = next(lab for lab, i in self._ids.items() if i == int(t["token_id"]))
        best_other = next((lab for lab in labels if self._ids[lab] not in (None, int(t["token_id"]))), None)
        self.param.choices.objects = labels
        self.choices = [sampled] + ([best_other] if best_other else [])
        shown = esc(token_display(t["token_text"])[0].translate(VISIBLE_WS))
        self._head.object = (
            f'<div class="meta-line"><span>fork at token <b>{int(t["pos"])}</b>: <b class="c-tok">{shown}</b></span>'
            f'<span>entropy <b>{num(t["entropy"])}</b> nats</span><span>p(token) <b>{num(math.exp(t["logprob"]))}</b></span>'
            f'<span>choose alternatives to force, N completions each</span></div>')
        self._form.visible = True
        if self._can_run:
            workers.warm(ro.get("policy") or st.policy_path)

    # -- branching ---------------------------------------------------------------------

    def _on_attach(self, event) -> None:
        self._attach = self.state.policy_path
        self._attach_btn.visible = False
        start(self._on_branch)

    def _running(self, on: bool) -> None:
        self.running = on
        self._go.disabled, self._stop.disabled = on, not on

    async def _on_branch(self, event=None) -> None:
        st = self.state
        if not self._can_run or self.running or st.fork_pos < 0:
            return
        chosen = [self._ids[c] for c in self.choices if c in self._ids]
        with self._job.claim() as cancel:
            total = len(chosen) * self.n
            self._status.object = banner("info", f"branching: {len(chosen)} choice(s) × {self.n} = {total} "
                                                 "completions…")
            parent = st.rollout_id
            try:
                res = await branch(st.store, parent, st.fork_pos, chosen,
                                   BranchConfig(n=int(self.n), temperature=float(self.temperature)),
                                   policy_path=self._attach, cancel=cancel)
            except NoPolicyError as exc:
                self._status.object = banner("warn", str(exc))
                self._attach_btn.name = f"Attach {policy_label(st.policy_path)} policy and branch"
                self._attach_btn.visible = bool(st.policy_path)
                return
            except (BranchError, StoreError) as exc:
                self._status.object = banner("error", str(exc))
                return
            except Exception as exc:  # anything else (a policy that will not load, a rollout it cannot read):
                self._status.object = banner("error", failure("branching", exc))  # never 'branching: …' forever
                return
        if res.status == "done":
            try:
                also = await rules.score_new_run(st.store, res.run_id, st.rule_version)
            except Exception as exc:  # stored, but not scored by the session's rule: say so in place
                also = f"not scored with {st.rule_version or 'the active rule'}: {type(exc).__name__}: {exc}"
            self._status.object = banner("info" if not also or also.startswith("also") else "warn",
                                         f"{res.rollouts} branch completions stored and scored "
                                         f"(run {res.run_id[-6:]}, on {res.device}{'; ' + also if also else ''}).")
            self._render_tree()  # the result first: let it reach the browser before other views reload
            self._tree_drawn_at = st.refresh + 1
            await asyncio.sleep(0.05)
            st.refresh += 1
        elif res.status == "cancelled":
            self._status.object = banner("warn", "cancelled: nothing was stored.")
        else:
            self._status.object = banner("error", f"branching failed: {res.error or res.status}")

    # -- the tree ----------------------------------------------------------------------

    @param.depends("state.rollout_id", watch=True)
    def _render_tree(self) -> None:
        st = self.state
        if not st.rollout_id:
            self._tree.object = ""
            return
        try:
            tree = st.preloaded(tree_key(st.rollout_id, st.refresh), lambda: tree_forks(
                st.store, st.rollout_id,
                st.preloaded(("lineage", st.rollout_id), lambda: forks.lineage(st.store, st.rollout_id))))
            if tree is None:  # most rollouts: one read, not the tree's four
                self._tree.object = lone_tree_html(st.rollout_id)
                return
            self._tree.object = tree_html(st.store, st.rollout_id, *tree, queries.reward_bounds(st.store))
        except StoreError as exc:
            self._tree.object = banner("error", str(exc))

    @param.depends("state.refresh", watch=True)
    def _on_refresh(self) -> None:
        if self.state.refresh != self._tree_drawn_at:  # not already drawn by this panel's own branch
            self._render_tree()

    def _on_tree_click(self, kind: str, value: str) -> None:
        if kind == "open" and value:
            with pn.io.hold():
                self.state.open_rollout(value)
        elif kind == "branches" and value:
            self.state.branches_of = value

    def __panel__(self):
        return self._layout


def fork_controls(state: StudioState) -> pn.Column:
    """The sidebar's fork rule: which tokens the strip marks unsure (▾). The mode, then only the
    settings that act in it: the top share q, the minimum entropy and the scope for "top share",
    the threshold for "absolute"."""
    top, absolute = (state.param.fork_mode.rx() == mode for mode in ("top share", "absolute"))
    number = dict(sizing_mode="stretch_width", margin=(2, 5))
    return pn.Column(
        pn.widgets.RadioButtonGroup.from_param(state.param.fork_mode, name="Mark unsure tokens by", color="light",
                                               sizing_mode="stretch_width", css_classes=["fork-mode"]),
        pn.Row(pn.widgets.FloatInput.from_param(state.param.fork_q, name="Top share q", css_classes=["fork-q"],
                                                **number),
               pn.widgets.FloatInput.from_param(state.param.fork_min, name="Min entropy (nats)",
                                                css_classes=["fork-min"], **number),
               visible=top, sizing_mode="stretch_width", margin=0),
        pn.widgets.Select.from_param(state.param.fork_scope, name="Top share of the tokens of", visible=top,
                                     options={"the run (a branch: its root's)": "run",
                                              "the training step (a branch: its root's)": "step",
                                              "the table's filter": "filter"},
                                     css_classes=["fork-scope"], **number),
        pn.widgets.FloatInput.from_param(state.param.fork_abs, name="Threshold (nats)", visible=absolute,
                                         css_classes=["fork-abs"], **number),
        sizing_mode="stretch_width")
