"""Token strip: the rollout as a conversation (system and user turns from the stored chat,
else the prompt as the user's turn; never a chat template's special tokens), the assistant's
turn as every generated token, coloured by a chosen channel, with a hover card (token,
channel value, top-k alternatives with probabilities). The ``<think>`` block sits on a
tinted band labelled "reasoning" and the stated answer is outlined (the task's
``parse_completion`` spans, mapped to tokens by character offsets); the header shows the
extracted answer beside the gold one. Step spans are underlined green (step verified
correct) or red (wrong) where the task verifies steps. Tokens where the policy was unsure
(entropy at or above the session's fork threshold, :mod:`studio.signals.forks`; a branch is
judged as its tree's root) carry a ▾; tokens where the rollout's tree has been branched carry
a ◆ when the branches' values differ by at least ``PIVOTAL_SPREAD`` (pivotal: the choice there
decides the outcome) and a ◇ otherwise, with the value of each choice in the hover card; the
legend says both in words, with the numbers. Under the ``mismatch`` channel (or the sidebar's
"mark corrections") the tokens the sidebar's correction clips or drops are underlined
(:mod:`widgets.mismatch_marks`); a token's card shows its Δ wherever it has one. Clicking a token picks it for branching in the
fork panel. A rollout imported as text alone shows its text and an *Enrich* action that fills
its tokens in place."""
from __future__ import annotations

import collections
import functools
import types
from dataclasses import replace

import numpy as np
import pandas as pd
import panel as pn
import param

from studio import queries
from studio.queries import credit, forks, lookups
from studio.queries import mismatch as mismatch_reads
from studio.signals.advantages import ESTIMATORS
from studio.signals.forks import Threshold, fork_mask
from studio.signals.mismatch import Correction
from studio.signals.steps import aggregate, gated
from studio.store import StoreError
from studio.tasks import Prompt, get_task
from studio.workers.vocab import decode_ids

from .base.clickable import ClickableHTML
from .base.jobs import Job, failure
from .base.state import StudioState
from .base.style import CSS, REDRAWN, SCALES, STEP_SCALE, banner, chip, esc
from .conversation import (
    MARKS_KEY,
    answer_html,
    clipped,
    completion_marks,
    conversation,
    conversation_html,
    gold_of,
    task_named,
)
from .fork_marks import FORK_CSS, branched_key_html, fork_key_html, tree_forks, tree_key
from .mismatch_marks import MARK_CLASS, marks_key_html, no_recomputed_html, verdict_text, with_mismatch
from .mismatch_marks import verdicts as mismatch_verdicts
from .token_card import card_html, listed, masked_html, text_of
from .token_text import num, token_display

# channel_values: the strip's values, which tests and notebooks import from here
from .token_values import channel_values, column_values, fork_flags, missing  # noqa: F401
from .turn_blocks import facts_html, is_trajectory, trajectory_html, trajectory_reads
from .turn_blocks import legend_html as turn_legend_html


@functools.lru_cache(maxsize=32)
def _row_type(columns: tuple[str, ...]):
    return collections.namedtuple("TokenRow", columns, rename=True)


def rows_of(tokens: pd.DataFrame) -> list:
    """The token rows as named tuples of plain values (``itertuples`` makes a new tuple class on
    every call, a tenth of a strip's time)."""
    make = _row_type(tuple(map(str, tokens.columns)))._make
    return [make(r) for r in zip(*(tokens[c].tolist() for c in tokens.columns))]


def strip_html(tokens: pd.DataFrame, channel: str, advantage=None,
               alt_texts: list[list[str]] | None = None, step_ok: dict[int, bool | None] | None = None,
               compact: bool = False, fork_threshold: float | None = None, picked: int | None = None,
               clickable: bool = False, steps: pd.DataFrame | None = None,
               step_values: dict[int, float] | None = None,
               step_advantages: dict[int, float] | None = None, rollout_id: str | None = None,
               think: tuple[int, int] | None = None, answer: tuple[int, int] | None = None,
               explored: dict[int, forks.Fork] | None = None, states: list[str | None] | None = None,
               correction: Correction | None = None, marked: bool = False) -> str:
    """HTML of a token strip (of ``rollout_id``, named in its ``data-rollout``). Every token and alternative is escaped: shown, never run.

    With ``fork_threshold`` set, forking tokens get the ``fork`` class (a ▾ above them);
    ``explored`` (position → the tree's fork there, :func:`studio.queries.forks.forks_on`) gives
    the tokens branched at the ``pivot`` class (a ◆) or, when the branches' values barely differ,
    ``branched`` (a ◇), and their card the value of each choice; ``picked`` outlines one
    position; ``clickable`` makes tokens report clicks.
    ``steps`` (``step_idx, start_pos, end_pos``) boxes each step's tokens, with a bar under
    them coloured by ``step_values[step_idx]`` (hatched when the source has no value), and,
    with ``step_advantages``, a second bar with the step's group-normalised advantage.
    ``think`` and ``answer`` are token index ranges (:func:`completion_marks`): the first sits on
    a band labelled "reasoning" (a step box open where it starts or ends moves the band's edge
    to the box's, so the HTML nests), the second is outlined.
    ``states`` (:func:`widgets.mismatch_marks.verdicts` of ``correction``) puts each token's verdict in
    its card and, ``marked``, underlines the clipped and dropped ones.
    Tokens the policy did not write (``trained`` False: a tool response's) are greyed, never coloured
    by the channel nor clickable; ``compact`` folds each run of them into one chip.
    """
    scale = SCALES[channel]
    rows = rows_of(tokens)  # every column read once: a DataFrame column costs more than a small strip's HTML
    entropy = [r.entropy for r in rows]
    column = [getattr(r, channel) for r in rows] if channel in tokens.columns else None
    trained = [r.trained is not False for r in rows] if "trained" in tokens.columns else [True] * len(rows)
    values = column_values(column, entropy, channel, advantage, fork_threshold, trained)
    is_fork = fork_flags(entropy, fork_threshold)
    step_ok = step_ok or {}
    opens, closes = {}, {}
    if steps is not None and len(steps):
        for k, a, b in zip(steps["step_idx"].tolist(), steps["start_pos"].tolist(), steps["end_pos"].tolist()):
            if int(a) not in opens and int(b) not in closes and int(a) <= int(b):
                opens[int(a)], closes[int(b)] = int(k), int(k)
    step_values = step_values or {}
    explored = explored or {}
    rid = f' data-rollout="{esc(rollout_id)}"' if rollout_id else ""
    parts = [f'<div class="strip{" compact" if compact else ""}" data-channel="{esc(channel)}"{rid}>']
    in_box = False
    in_think, think_open = False, think is not None
    colors: dict = {}  # value -> (background, text colour): a strip repeats its values (a sequence advantage: one)
    for i, row in enumerate(rows):
        if not trained[i]:
            parts.append(masked_html(rows, trained, i, compact))
            continue
        if think_open and not in_box and think[0] <= i <= think[1]:
            parts.append('<span class="think-block"><span class="think-label">reasoning</span>')
            in_think, think_open = True, False
        if row.pos in opens and not in_box:
            parts.append(f'<span class="stepbox" data-step="{opens[row.pos]}"><span class="sbody">')
            in_box = True
        text = text_of(row)
        shown, special = token_display(text)
        v = values[i]
        cls = "tok"
        if special:
            cls += " special"
        step = None if missing(row.step_idx) else int(row.step_idx)
        if step is not None and step_ok.get(step) is not None:
            cls += " step-ok" if step_ok[step] else " step-bad"
        if is_fork[i]:
            cls += " fork"
        tried = explored.get(row.pos)
        if tried is not None:
            cls += " pivot" if tried.pivotal else " branched"
        verdict = states[i] if states is not None else None
        if marked and verdict in MARK_CLASS:
            cls += " " + MARK_CLASS[verdict]
        if picked is not None and row.pos == picked:
            cls += " picked"
        if think is not None and think[0] <= i <= think[1]:
            cls += " think"
        if answer is not None and answer[0] <= i <= answer[1]:
            cls += " answer" + (" a-first" if i == answer[0] else "") + (" a-last" if i == answer[1] else "")
        if v not in colors:
            colors[v] = scale.colors(v)
        bg, fg = colors[v]
        card = "" if compact else card_html(row, channel, v, alt_texts[i] if alt_texts else None, step, is_fork[i],
                                        tried, verdict_text(verdict, correction) if verdict else None)
        vtxt = "" if v is None else f"{v:.4f}"
        click = f' data-click="token" data-value="{row.pos}"' if clickable else ""
        parts.append(f'<span class="{cls}" data-pos="{row.pos}" data-channel-value="{vtxt}"{click} '
                     f'style="background:{bg};color:{fg if not special else "#868e96"}">{esc(shown)}{card}</span>'
                     '<wbr>')  # a line may break between any two tokens (JSON's punctuation allows no break)
        if in_box and row.pos in closes:
            k = closes[row.pos]
            sv = step_values.get(k)
            if sv is None or sv != sv:
                bar = '<span class="sbar none" title="no step reward">–</span>'
            else:
                sbg, sfg = STEP_SCALE.colors(sv)
                bar = (f'<span class="sbar" data-step-value="{sv:.4f}" title="step {k + 1}: {sv:+.4f}" '
                       f'style="background:{sbg};color:{sfg}">{num(sv, "+.2f")}</span>')
            abar = ""
            if step_advantages:
                sa = step_advantages.get(k)
                abg, afg = SCALES["advantage"].colors(sa)
                abar = ('<span class="sbar abar none" title="no step advantage">–</span>' if sa is None else
                        f'<span class="sbar abar" data-step-adv="{sa:.4f}" title="step {k + 1} advantage: {sa:+.4f}" '
                        f'style="background:{abg};color:{afg}">{num(sa, "+.2f")}</span>')
            parts.append(f"</span>{bar if step_values else ''}{abar}</span>")
            in_box = False
        if text == "\n":
            parts.append("<br>")
        if in_think and not in_box and i >= think[1]:
            parts.append("</span>")
            in_think = False
    if in_box:
        parts.append("</span></span>")
    if in_think:
        parts.append("</span>")
    parts.append("</div>")
    return "".join(parts)


def _within(marked: tuple[int, int] | None, a: int, b: int) -> tuple[int, int] | None:
    """A token range (inclusive) as it falls in rows ``a .. b-1``, counted from ``a`` (None: outside)."""
    if marked is None or marked[1] < a or marked[0] >= b:
        return None
    return max(marked[0], a) - a, min(marked[1], b - 1) - a


def step_verdicts(rollout: dict) -> dict[int, bool | None]:
    """Per-step correctness of a stored rollout, from its task's parser ({} if unknown)."""
    try:
        task = get_task(rollout["task"])
        prompt = queries.prompt_of_row(rollout)
        return {i: s.correct for i, s in enumerate(task.parse_completion(prompt, rollout["text"]).steps)}
    except (KeyError, ValueError):
        return {}


# Every state value the strip's HTML depends on: its redraw watches them, and the HTML drawn ahead
# on a thread for a click is keyed by them (a value changed meanwhile draws again).
SHOWN = ("rollout_id", "channel", "refresh", "fork_pos", "fork_mode", "fork_q", "fork_min", "fork_abs", "fork_scope",
         "table_filter",
         "estimator", "kl_beta", "reference", "gae_gamma", "gae_lam", "value_source", "segmenter", "step_pattern",
         "step_source", "step_agg", "gate_tau", "rule_version", "turn_source", "turn_norm", "turn_gamma", "turn_gate",
         "mismatch_source", "mm_method", "mm_cap", "mm_low", "mm_threshold", "mm_marks")


class _Shown(types.SimpleNamespace):
    """The state's :data:`SHOWN` values at one moment (and its store), with the state's derived
    settings computed from them, not from the state as it is by the time they are used."""

    credit = StudioState.credit
    segmentation = StudioState.segmentation
    turn_credit = StudioState.turn_credit
    fork_rule = StudioState.fork_rule
    correction = StudioState.correction

    def key(self) -> tuple:
        return ("strip_html",) + tuple(getattr(self, name) for name in SHOWN)


class TokenStrip(pn.viewable.Viewer):
    """The selected rollout's tokens, coloured by the state's channel; forks marked, a
    click picks a token for branching (``state.fork_pos``)."""

    state = param.ClassSelector(class_=StudioState, doc="Shared studio state.")

    def __init__(self, **params):
        super().__init__(**params)
        self._header = pn.pane.HTML("", sizing_mode="stretch_width", stylesheets=[CSS], margin=(0, 5), **REDRAWN,
                                    css_classes=["strip-header"])
        self._legend = pn.pane.HTML("", sizing_mode="stretch_width", stylesheets=[CSS, FORK_CSS], margin=(0, 5),
                                    **REDRAWN, css_classes=["strip-legend"])
        self._strip = ClickableHTML(object="", sizing_mode="stretch_width", stylesheets=[CSS, FORK_CSS], margin=(0, 5),
                                    **REDRAWN, css_classes=["token-strip"])
        self._strip.on_click(self._on_click)
        self._thresholds: dict[tuple, Threshold] = {}
        # a rollout imported as text: its tokens come from teacher forcing by the Generate policy
        self._enrich = pn.widgets.Button(name="Enrich this rollout with the Generate policy", button_type="primary",
                                         visible=False, width=300, margin=(0, 5))
        self._enrich.on_click(self._on_enrich)
        self._enriching = Job(lambda on: setattr(self._enrich, "disabled", on))
        self._layout = pn.Column(self._header, self._legend, self._strip, self._enrich, sizing_mode="stretch_width")
        self.state.add_preloader(self._preload)
        self._render()

    def _view_key(self, s) -> tuple:
        return ("rollout_view", s.rollout_id, s.credit(), s.rule_version or None, s.segmentation())

    def _snapshot(self, **changes) -> _Shown:
        """The state values the strip's HTML depends on (:data:`SHOWN`), as they are, or as ``changes``
        will make them."""
        st = self.state
        return _Shown(store=st.store, **{name: changes.get(name, getattr(st, name)) for name in SHOWN})

    def _preload(self, rollout_id: str, group_id: str, found: dict, fresh: bool) -> None:
        """Read ahead what :meth:`_show` shows for ``rollout_id`` and draw it (on a thread: see
        StudioState.select; the event loop that serves every page then only sets the HTML), with the
        rollout's group as scored for the header, which the group view draws from."""
        st = self.state
        s = self._snapshot(rollout_id=rollout_id, refresh=st.refresh + fresh,
                           fork_pos=st.fork_pos if rollout_id == st.rollout_id else -1)  # a new rollout: none picked
        key = self._view_key(s)
        view = credit.rollout_view(st.store, *key[1:])
        found[key] = view
        if view is None:
            return
        found[("scored_group", view.group.group_id, key[2], key[3])] = view.group
        found[("lineage", rollout_id)] = forks.lineage(st.store, rollout_id)  # the fork panel's read too
        found[tree_key(rollout_id, s.refresh)] = tree_forks(st.store, rollout_id, found[("lineage", rollout_id)])
        # drawn here too (a run or scope not seen yet: its fork threshold, a quantile over its tokens)
        found[s.key()] = self._compose(s, lambda k, compute: found[k] if k in found else compute())

    def _on_click(self, kind: str, value: str) -> None:
        if kind == "token" and value.isdigit():
            self.state.fork_pos = int(value)

    @param.depends("state.rollout_id", watch=True)
    def _new_rollout(self) -> None:
        self.state.fork_pos = -1
        self._show_enrich()

    def _show_enrich(self) -> None:
        facts = lookups.rollout_facts(self.state.store, self.state.rollout_id) if self.state.rollout_id else None
        self._enrich.visible = facts is not None and facts["n_tokens"] is None

    async def _on_enrich(self, event=None) -> None:
        """Teacher-force the shown text-only rollout through the Generate policy (``studio.runs.enrich``):
        its tokens, log-probs and entropies appear in place, and it can be branched."""
        from studio.runs import enrich

        rid, policy = self.state.rollout_id, self.state.policy_path or "sample"
        if self._enriching.running or not rid:
            return
        with self._enriching.claim():
            self._header.object = banner("info", f"Enriching {rid} with {policy}…")
            try:
                report = await enrich.enrich(self.state.store, policy, rollout_ids=[rid])
            except Exception as exc:  # a policy that cannot load, a store error: said in place
                self._header.object = banner("error", failure("enriching this rollout", exc))
                return
        if report.skipped:
            self._header.object = banner("error", f"not enriched: {report.skipped[0][1]}")
            return
        self._show_enrich()
        self.state.param.update(refresh=self.state.refresh + 1)

    @param.depends(*(f"state.{name}" for name in SHOWN), watch=True)
    def _render(self) -> None:
        try:
            self._show()
        except StoreError as exc:  # e.g. a query past its time limit: say so in place
            self._header.object, self._strip.object = banner("error", str(exc)), ""
        except ValueError as exc:  # a bad segmentation pattern or estimator setting: say which
            self._header.object, self._strip.object = banner("error", str(exc)), ""
        except Exception as exc:  # never keep the previous rollout's strip under a new selection
            self._header.object = banner("error", failure(f"showing rollout {self.state.rollout_id}", exc))
            self._strip.object = ""

    def _threshold_key(self, ro: dict, s) -> tuple:
        # the rollout's run stands for its tree root's: every rollout of a branch run has one root
        rule = s.fork_rule()
        return (rule, ro["run_id"], ro.get("train_step") if rule.scope == "step" else None,
                s.table_filter if rule.scope == "filter" else None, s.refresh)

    def threshold(self, ro: dict, s: _Shown) -> Threshold:
        """The fork threshold for this rollout's scope (cached per scope, rule and refresh)."""
        key = self._threshold_key(ro, s)
        if key not in self._thresholds:
            if len(self._thresholds) > 64:
                self._thresholds.clear()
            self._thresholds[key] = forks.threshold(s.store, key[0], ro["rollout_id"], s.table_filter)
        return self._thresholds[key]

    def _show(self) -> None:
        s = self._snapshot()
        self._legend.object, self._header.object, self._strip.object = self.state.preloaded(
            s.key(), lambda: self._compose(s, self.state.preloaded))

    def _compose(self, s: _Shown, preloaded) -> tuple[str, str, str]:
        """The legend, header and strip HTML for the state values ``s``: store reads (through
        ``preloaded(key, compute)``, what a preloader read) and string work only, so it runs on a
        thread as well as on the event loop."""
        if not s.rollout_id:
            return (SCALES[s.channel].legend_html(),
                    '<div class="empty">Select a rollout in the table to see its tokens.</div>', "")
        cr = s.credit()
        # the header, tokens, per-token advantages and steps: the group scored once, the tokens read once
        key = self._view_key(s)
        view = preloaded(key, lambda: credit.rollout_view(s.store, *key[1:]))
        if view is None:
            return (SCALES[s.channel].legend_html(),
                    f'<div class="empty">Rollout {esc(s.rollout_id)} is not in this store.</div>', "")
        ro, toks, tc, steps = view.rollout, view.tokens, view.credit, view.steps
        # Δ against the session's source: in every token's card; coloured and marked on request
        toks = with_mismatch(toks, preloaded(("rollout_mismatch", s.rollout_id, s.mismatch_source, s.refresh),
                                             lambda: mismatch_reads.rollout_mismatch(s.store, s.rollout_id,
                                                                                     s.mismatch_source)))
        has_delta, cor = bool(toks["mismatch"].notna().any()), s.correction()
        states = mismatch_verdicts(toks["mismatch"].to_numpy(), cor) if has_delta else None
        marked = s.channel == "mismatch" or s.mm_marks
        mm_key = marks_key_html(states, cor) if has_delta and marked else (
            no_recomputed_html(s.mismatch_source) if s.channel == "mismatch" else "")
        thr = self.threshold(ro, s)
        sv, sa, step_line = {}, {}, ""
        if s.step_source:
            sr = credit.step_rewards(s.store, s.rollout_id, s.step_source, s.segmentation(),
                                     s.reference or None, float(s.kl_beta))
            if len(sr):
                steps = sr[["step_idx", "start_pos", "end_pos"]]
                sv = dict(zip(sr["step_idx"].astype(int), sr["value"]))
                sa = credit.group_step_advantages(s.store, s.rollout_id, s.step_source, s.segmentation(),
                                                  s.reference or None, float(s.kl_beta))
                agg = aggregate(sr["value"].to_numpy(), s.step_agg)
                gated_r = gated(float(ro["reward"]), sr["value"].to_numpy(), float(s.gate_tau)) \
                    if ro.get("reward") is not None and not pd.isna(ro["reward"]) else None
                step_line = (f'<span>steps <b>{len(sr)}</b> · {esc(s.step_agg)} <b>{num(agg, "+.3f")}</b>'
                             + (f' · gated R (τ={s.gate_tau:g}) <b>{num(gated_r, "+.3f")}</b>' if gated_r is not None else "")
                             + "</span>")
            else:
                step_line = f'<span class="lg-help">no step rewards from {esc(s.step_source)} for this rollout</span>'
        est_note = "" if tc.values is not None else (
            f'<div class="legend"><span class="lg-help">advantage: {esc(tc.note or "no reward")}</span></div>')
        legend = SCALES[s.channel].legend_html()
        if s.channel in ("advantage", "weight"):
            legend += f'<div class="legend"><span class="lg-name">estimator</span><span>{esc(cr.describe())}</span></div>'
        if sv:
            legend += replace(STEP_SCALE, label=f"step reward · {s.step_source}").legend_html(compact=True)
            legend += replace(SCALES["advantage"], label="step advantage",
                              help="second bar: (r − group mean) / group std over all step rewards of the group, "
                                   "summed over this and later steps (process supervision)").legend_html(compact=True)
        flat = sorted({int(i) for ids in toks["topk_ids"] for i in listed(ids)})
        names = dict(zip(flat, decode_ids(ro.get("policy"), flat)))
        alts = [[names.get(int(i), f"#{i}") for i in listed(ids)] for ids in toks["topk_ids"]]
        comps = " ".join(f"<span>{esc(k)} <b>{v:.2f}</b></span>" for k, v in ro["components"].items() if k != "total")
        facts = preloaded(("rollout_facts", s.rollout_id, s.refresh),
                          lambda: lookups.rollout_facts(s.store, s.rollout_id)) or {}
        task = task_named(facts.get("task") or ro.get("task"))
        prompt = Prompt(facts.get("prompt") or ro.get("prompt") or "", gold_of(facts.get("gold") or ro.get("gold")))
        turns = conversation(facts or {"prompt": prompt.text}, task)
        verdict = answer_html(facts, task, prompt, ro.get("text") or "")
        n_forks = int(fork_mask(toks["entropy"].fillna(-1).to_numpy(), thr.value).sum()) if thr.value is not None else 0
        tree = preloaded(tree_key(s.rollout_id, s.refresh), lambda: tree_forks(
            s.store, s.rollout_id, preloaded(("lineage", s.rollout_id), lambda: forks.lineage(s.store, s.rollout_id))))
        explored = forks.forks_on(*tree, s.rollout_id) if tree is not None else {}
        n_pivotal = sum(f.pivotal for f in explored.values())
        is_branch = bool(ro.get("parent_rollout_id")) and not pd.isna(ro.get("parent_rollout_id"))
        branch = ""
        if ro.get("parent_rollout_id") and not pd.isna(ro.get("fork_pos")):
            branch = f'<span>branch of <b>{esc(ro["parent_rollout_id"])}</b> at token {int(ro["fork_pos"])}</span>'
        adv_label = "advantage" if ESTIMATORS[cr.estimator].level == "sequence" else "A₀"
        reward = "–" if ro["reward"] is None or pd.isna(ro["reward"]) else f"{ro['reward']:.3f}"
        vid = ro.get("rule_version_id")
        version = "" if not vid or pd.isna(vid) else f' <span class="version" title="the reward version shown">({esc(vid)})</span>'
        finish = "" if ro.get("finish_reason") is None or pd.isna(ro["finish_reason"]) else f' · {esc(ro["finish_reason"])}'
        trajectory = is_trajectory(toks) or (toks.empty and (ro.get("n_turns") or 1) > 1)
        traj = preloaded(("trajectory", s.rollout_id, s.rule_version or None, s.refresh, s.turn_source, s.turn_credit()),
                         lambda: trajectory_reads(s.store, s.rollout_id, s.rule_version or None, s.turn_source,
                                                  s.turn_credit())) if trajectory else None  # turns, rewards, advantages
        header = (
            f'<div class="meta-line"><span>prompt <b title="{esc(prompt.text)}">{esc(clipped(prompt.text, 48))}</b></span>{verdict}'
            f'<span>reward <b>{reward}</b>{version}</span><span>{adv_label} {chip(tc.sequence, SCALES["advantage"])}</span>'
            f'{comps}<span>{len(toks)} tokens{finish} · <b>{n_forks}</b> unsure'
            f'{f" · <b>{n_pivotal}</b> pivotal" if n_pivotal else ""}</span>{branch}'
            f'{step_line}{facts_html(traj.turns) if trajectory else ""}</div>')
        if trajectory:
            legend += turn_legend_html(traj)
        if toks.empty and trajectory:  # imported as text: each turn's text
            return legend, header, trajectory_html(turns, traj, np.zeros(0), None)
        if toks.empty:  # imported as text only: show the text; Enrich fills its tokens
            text = ro.get("text")
            body = (f'<div class="strip plain-text">{esc(text)}</div>' if isinstance(text, str) and text
                    else '<div class="empty">(an empty completion)</div>')
            return legend, header, (conversation_html(turns, body) + banner(
                "info", "This rollout was imported as text: it has no token rows yet. Enrich it (the button below, or "
                        "a whole run in the tab Import & enrich) to see its tokens, log-probs and entropy, and to "
                        "branch from it."))
        think, answer = (None, None) if task is None else completion_marks(task, prompt, [text_of(r) for r in rows_of(
            toks[["token_text", "token_id"]])])
        verdicts = step_verdicts(ro)

        def draw(a: int = 0, b: int = len(toks)) -> str:  # the strip of token rows a .. b-1 (one turn's)
            values = tc.values[a:b] if tc.values is not None and np.ndim(tc.values) else tc.values
            return strip_html(toks.iloc[a:b], s.channel, values, alts[a:b], verdicts,
                              fork_threshold=thr.value, picked=s.fork_pos if s.fork_pos >= 0 else None,
                              clickable=True, steps=steps, step_values=sv, step_advantages=sa, rollout_id=s.rollout_id,
                              think=_within(think, a, b), answer=_within(answer, a, b), explored=explored,
                              states=states[a:b] if states else None, correction=cor, marked=marked)

        marks = MARKS_KEY if think is not None or answer is not None else ""
        body = trajectory_html(turns, traj, toks["pos"].to_numpy(), draw) if trajectory \
            else conversation_html(turns, draw())
        return (legend + mm_key + fork_key_html(thr, is_branch) + branched_key_html(explored) + marks + est_note,
                header, body)

    def __panel__(self):
        return self._layout
