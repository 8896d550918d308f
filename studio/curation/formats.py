"""TRL's dataset shapes of the accepted pairs, as SQL over the selected pairs:

- ``preference``: prompt / chosen / rejected (DPO and friends);
- ``unpaired``: prompt / completion / label, every chosen side True and every rejected
  side False, each once (KTO);
- ``stepwise``: prompt / completions (the rollout's steps) / labels (each step's reward
  from a step-reward source above a threshold; the answer after the last step labelled by
  correctness) (PRM training),

in the standard style (strings) or the conversational one (lists of ``role`` / ``content``
messages, which the trainer renders with its tokenizer's chat template).

The prompt is never a templated string (a trainer would template it again). Standard: the
prompt's text (a chat's last user message). Conversational: the prompt's messages, system
prompt and earlier turns included (:func:`prompt_messages`: the stored messages, else those
read back from the text the policy continued, ``rollouts.prompt_text``, or from a templated
``prompts.text`` of an older store, else one user message of the text); chosen / rejected /
completion are one assistant message each. In both styles an end-of-turn marker ending a
completion is cut (the trainer closes the turn). A step pair's shared prefix: standard, it ends the prompt (the
completions continue it); conversational, it starts both assistant messages (a message cannot
end mid-answer; DPO's loss is the same either way, the prefix's log-probabilities cancel
between chosen and rejected). Pairs of agent trajectories, conversational, are message lists with
TRL's tool calls and tool messages (:mod:`studio.curation.trajectories`); standard, the text the
policy saw (a turn pair's shared turns end the prompt).

:func:`_selection_sql` reads the accepted pairs as exported (swaps applied, step pairs' prefix
and continuations, staleness); :func:`_prompts` gives their prompts (registered as
``_prompts``); :func:`_rows_sql` shapes the registered ``_sel`` pairs into one format's rows;
:func:`_step_source` picks the step-reward source of stepwise labels.
:mod:`studio.curation.writer` writes the rows.
"""
from __future__ import annotations

import json
import re

import pyarrow as pa

from studio.curation.build import NOT_SPECIAL
from studio.curation.errors import CurationError, NothingToExport
from studio.curation.stale import _stale_sql
from studio.tasks.chat import END_OF_TURN, last_user, parse_templated, plain_messages

FORMATS = ("preference", "unpaired", "stepwise")
STYLES = ("standard", "conversational")
MESSAGES = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))  # TRL's conversational column
_TURN_END = "(?:" + "|".join(re.escape(m) for m in END_OF_TURN) + r")\s*$"


# the pairs columns an export reads (not params, margins, times: a million pairs read faster)
SELECTED = ("pair_id, kind, prompt_id, build_id, rule, source, rule_version_id, swapped, reviewer, decided_at, note, "
            "prefix, chosen_rollout_id, rejected_rollout_id, chosen_reward, rejected_reward")


def _selection_sql(where: str) -> str:
    """Accepted pairs as exported: swaps applied, the shared prefix (step pairs; else empty),
    the two continuations after it, and each side's run and policy (for the provenance)."""
    cut = "substr({}, length(coalesce(p.prefix, '')) + 1)"
    return f"""
        SELECT p.pair_id, p.kind, p.prompt_id, p.build_id, p.rule, p.source, p.rule_version_id, p.swapped,
               p.reviewer, p.decided_at, p.note,
               CASE WHEN p.swapped THEN p.rejected_rollout_id ELSE p.chosen_rollout_id END AS chosen_id,
               CASE WHEN p.swapped THEN p.chosen_rollout_id ELSE p.rejected_rollout_id END AS rejected_id,
               coalesce(p.prefix, '') AS prefix,
               {cut.format("CASE WHEN p.swapped THEN p.r_text ELSE p.c_text END")} AS chosen,
               {cut.format("CASE WHEN p.swapped THEN p.c_text ELSE p.r_text END")} AS rejected,
               p.c_run, p.r_run, p.c_policy, p.r_policy, p.stale, p.stale_detail
        FROM ({_stale_sql(f"SELECT {SELECTED} FROM pairs WHERE status = 'accepted' AND {where}")}) p"""


def prompt_messages(text: str, messages: str | list | None = None,
                    prompt_text: str | None = None) -> tuple[str, list[dict[str, str]]]:
    """A prompt as exported: ``(plain text, messages)``, never a templated string.

    The messages are the stored ones, else those a chat template rendered into the text the
    policy continued, else into ``text`` (an older store kept a templated prompt there), else
    one user message of ``text``.

    >>> prompt_messages("Hi", '[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]')[1]
    [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'Hi'}]
    >>> prompt_messages("<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n")
    ('Hi', [{'role': 'user', 'content': 'Hi'}])
    >>> prompt_messages("Q: 2+3=")
    ('Q: 2+3=', [{'role': 'user', 'content': 'Q: 2+3='}])
    """
    text = text or ""
    if isinstance(messages, str):
        messages = json.loads(messages)
    msgs = plain_messages(messages) if isinstance(messages, list) and messages else None
    templated = parse_templated(text)
    if templated is not None:
        text = last_user(templated)
    if msgs is None and prompt_text:
        msgs = parse_templated(prompt_text)
    return text, msgs or templated or [{"role": "user", "content": text}]


def _prompts(cur, style: str) -> pa.Table:
    """The selected pairs' prompts (``prompt_id``, ``text``, ``messages``: :func:`prompt_messages`),
    read once per prompt."""
    conv = style == "conversational"
    seen = """LEFT JOIN (
            SELECT prompt_id, min(prompt_text) AS prompt_text FROM rollouts
            WHERE prompt_text IS NOT NULL AND rollout_id IN (SELECT chosen_id FROM _sel UNION SELECT rejected_id FROM _sel)
            GROUP BY prompt_id) ro USING (prompt_id)""" if conv else ""
    rows = cur.execute(f"""
        SELECT pr.prompt_id, pr.text, pr.messages, {'ro.prompt_text' if conv else 'NULL'}
        FROM (SELECT DISTINCT prompt_id FROM _sel) s JOIN prompts pr USING (prompt_id) {seen}""").fetchall()
    ids, texts, msgs = [], [], []
    for pid, text, stored, seen_text in rows:
        t, m = prompt_messages(text, stored if conv else None, seen_text)
        ids.append(pid)
        texts.append(t)
        msgs.append(m if conv else None)
    return pa.table({"prompt_id": pa.array(ids, pa.string()), "text": pa.array(texts, pa.string()),
                     "messages": pa.array(msgs, MESSAGES)})


def _texts_sql(style: str = "standard", trajectories: bool = False) -> str:
    """prompt / chosen / rejected of the registered ``_sel`` pairs and ``_prompts``: standard,
    strings (the prefix ends the prompt); conversational, the prompt's messages and the
    assistant's text (the prefix starts it), or with ``trajectories`` the message lists of the
    registered ``_conv`` (:func:`studio.curation.trajectories.trajectory_texts`). An end-of-turn
    marker ending a side is cut: the trainer closes the turn (the template, or its EOS token)."""
    if trajectories:
        return "SELECT pair_id, prompt, chosen, rejected FROM _conv"
    conv = style == "conversational"
    side = f"regexp_replace({'s.prefix || ' if conv else ''}s.{{0}}, '{_TURN_END}', '') AS {{0}}"
    prompt = "pp.messages" if conv else "pp.text || s.prefix"
    return (f"SELECT s.pair_id, {prompt} AS prompt, {side.format('chosen')}, {side.format('rejected')} "
            "FROM _sel s LEFT JOIN _prompts pp USING (prompt_id)")


def _msg(role: str, col: str) -> str:
    return f"[{{'role': '{role}', 'content': {col}}}]"


def _rows_sql(fmt: str, style: str, opts: dict) -> tuple[str, list]:
    """The exported rows of the registered ``_sel`` pairs (and ``_prompts``; ``_conv`` when
    ``opts["trajectories"]``), in TRL's columns."""
    traj = bool(opts.get("trajectories"))
    conv = style == "conversational" and not traj  # a trajectory's sides are message lists already
    if fmt == "preference":
        cols = (f"prompt, {_msg('assistant', 'chosen')} AS chosen, {_msg('assistant', 'rejected')} AS rejected"
                if conv else "prompt, chosen, rejected")
        return f"SELECT {cols} FROM ({_texts_sql(style, traj)}) ORDER BY pair_id", []
    if fmt == "unpaired":
        # every side once; a completion both chosen and rejected has no clear label: left out by default
        keep = "" if opts.get("conflicts") == "keep" else "QUALIFY count(*) OVER (PARTITION BY prompt, completion) = 1"
        cols = f"prompt, {_msg('assistant', 'completion')} AS completion, label" if conv else "prompt, completion, label"
        return f"""
            WITH t AS ({_texts_sql(style, traj)}),
            sides AS (SELECT prompt, chosen AS completion, true AS label, pair_id FROM t
                      UNION ALL SELECT prompt, rejected, false, pair_id FROM t),
            once AS (SELECT prompt, completion, label, min(pair_id) AS first FROM sides
                     GROUP BY prompt, completion, label {keep})
            SELECT {cols} FROM once ORDER BY first, label DESC""", []
    # stepwise: each distinct rollout of the pairs, cut into its steps (token ranges of the step source)
    answer = """UNION ALL
            SELECT rid, n_steps, accuracy >= ? FROM ans WHERE accuracy IS NOT NULL""" if opts["answer_step"] else ""
    return f"""
        WITH ids AS (
            SELECT rid, any_value(vid) AS vid, min(pair_id) AS first FROM (
                SELECT chosen_id AS rid, rule_version_id AS vid, pair_id FROM _sel
                UNION ALL SELECT rejected_id, rule_version_id, pair_id FROM _sel) GROUP BY rid),
        st AS (
            SELECT s.rollout_id AS rid, s.start_pos, s.value,
                   row_number() OVER (PARTITION BY s.rollout_id ORDER BY s.step_idx) - 1 AS k,
                   count(*) OVER (PARTITION BY s.rollout_id) AS n_steps,
                   max(s.end_pos) OVER (PARTITION BY s.rollout_id) AS last_end
            FROM step_rewards s JOIN ids ON ids.rid = s.rollout_id
            WHERE s.source = ? AND s.start_pos IS NOT NULL),
        tk AS (SELECT t.rollout_id AS rid, t.pos, t.token_text FROM tokens t
               WHERE t.rollout_id IN (SELECT rid FROM st) AND {NOT_SPECIAL}),
        piece AS (
            SELECT tk.rid, tk.pos, tk.token_text,
                   CASE WHEN st.last_end IS NOT NULL AND tk.pos > st.last_end THEN st.n_steps
                        ELSE coalesce(st.k, 0) END AS k
            FROM tk ASOF LEFT JOIN st ON tk.rid = st.rid AND tk.pos >= st.start_pos),
        texts AS (SELECT rid, k, string_agg(token_text, '' ORDER BY pos) AS text FROM piece GROUP BY rid, k),
        ans AS (  -- the answer's label: the rollout's own correctness ('correct'), or a component of the version
            SELECT DISTINCT st.rid, st.n_steps,
                   CASE WHEN ? = 'correct' THEN ro.correct::DOUBLE ELSE acc.value END AS accuracy
            FROM st JOIN ids USING (rid) JOIN rollouts ro ON ro.rollout_id = st.rid
            LEFT JOIN rewards acc ON acc.rollout_id = st.rid AND acc.rule_version_id = ids.vid
                 AND acc.component = ?),
        labels AS (SELECT rid, k, value > ? AS label FROM st {answer})
        SELECT pr.text AS prompt, list(x.text ORDER BY x.k) AS completions, list(l.label ORDER BY x.k) AS labels
        FROM texts x JOIN labels l USING (rid, k) JOIN ids USING (rid)
        JOIN rollouts ro ON ro.rollout_id = x.rid JOIN _prompts pr ON pr.prompt_id = ro.prompt_id
        GROUP BY x.rid, pr.text, ids.first ORDER BY ids.first, x.rid""", (
        [opts["step_source"], opts["correct_component"], opts["correct_component"], float(opts["step_threshold"])]
        + ([float(opts["correct_threshold"])] if opts["answer_step"] else []))


def _step_source(cur, given: str | None) -> str:
    """The step-reward source for stepwise labels: ``given``, else the only source that scored
    steps of the exported rollouts, else the pairs' version when it is one."""
    sources = [r[0] for r in cur.execute("""
        SELECT DISTINCT source FROM step_rewards WHERE rollout_id IN
            (SELECT chosen_id FROM _sel UNION SELECT rejected_id FROM _sel) ORDER BY 1""").fetchall()]
    if given is not None:
        if given not in sources:
            raise NothingToExport(f"step-reward source {given!r} scored no step of the exported rollouts"
                                  + (f"; sources there: {', '.join(sources)}" if sources else
                                     "; none has step rewards yet (apply a rule with step_reward, or compute "
                                     "PRM / information-gain step scores in the Advantages & steps tab)"))
        return given
    if not sources:
        raise NothingToExport("none of the exported rollouts has step rewards: apply a rule with step_reward, "
                              "or compute PRM / information-gain step scores, then export stepwise again")
    versions = [r[0] for r in cur.execute("SELECT DISTINCT rule_version_id FROM _sel").fetchall()]
    if len(sources) == 1:
        return sources[0]
    if len(versions) == 1 and versions[0] in sources:
        return versions[0]
    raise CurationError(f"the exported rollouts have step rewards from {len(sources)} sources "
                        f"({', '.join(sources)}); say which one labels the steps")
