"""The strip's mismatch channel on literal token frames: each token's Δ beside its row, the scale's
colours and words, the hover card's numbers, the correction's verdicts and marks; the sidebar's
Mismatch card setting the session's correction."""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest

from studio.signals.mismatch import PRESETS, Correction
from widgets.base.style import SCALES
from widgets.mismatch_marks import marks_key_html, no_recomputed_html, verdicts, with_mismatch
from widgets.token_strip import rows_of, strip_html
from widgets.token_values import channel_values


def _tokens() -> pd.DataFrame:
    """Four tokens: two with Δ, one without a recomputed log-prob, one tool token (no behaviour log-prob)."""
    return pd.DataFrame({
        "pos": [0, 1, 2, 3], "token_id": [5, 6, 7, 8], "token_text": ["The", " cat", " sat", "⚙"],
        "logprob": [-1.0, -0.5, -0.2, np.nan], "entropy": [0.8, 0.3, 0.1, np.nan],
        "topk_ids": [[9, 5, 4], [6, 2, 3], [7, 1, 2], pd.NA],
        "topk_logprobs": [[-0.7, -1.0, -2.0], [-0.5, -1.5, -2.5], [-0.2, -2.0, -3.0], pd.NA],
        "step_idx": [pd.NA] * 4, "turn_idx": [0, 0, 0, 1], "trained": [True, True, True, False]})


def _recomputed() -> pd.DataFrame:
    # token 0: the trainer gives it e times the sampler's probability; token 1: half the log-prob gap down
    return pd.DataFrame({"pos": [0, 1, 3], "train_logprob": [0.0, -0.75, -0.1], "train_rank": [1, 2, 1]})


def test_delta_is_train_minus_behaviour_and_missing_where_either_is():
    t = with_mismatch(_tokens(), _recomputed())
    d = t["mismatch"].tolist()
    assert d[:2] == pytest.approx([1.0, -0.25])
    assert math.isnan(d[2])  # not recomputed
    assert math.isnan(d[3])  # a tool token: no behaviour log-prob, never a Δ
    assert channel_values(t, "mismatch", None)[:2] == pytest.approx([1.0, -0.25])
    assert channel_values(t, "mismatch", None)[2:] == [None, None]
    # tokens read without any recomputation: the channel has no value, nothing fails
    assert channel_values(_tokens(), "mismatch", None) == [None] * 4


def test_the_scale_is_centred_at_zero_blue_below_red_above_and_says_so():
    scale = SCALES["mismatch"]
    assert scale.colors(0.0)[0] == "#f7f7f7"
    r, g, b = (int(scale.colors(-0.8)[0][i:i + 2], 16) for i in (1, 3, 5))
    assert b > r  # the trainer gives the token less probability: blue
    r, g, b = (int(scale.colors(0.8)[0][i:i + 2], 16) for i in (1, 3, 5))
    assert r > b  # more: red
    assert scale.colors(None)[0] == "#f1f3f5"  # no Δ: neutral grey
    assert scale.lo == -scale.hi
    legend = scale.legend_html()
    assert "Δ = log π_train − log π_behaviour" in legend
    assert "blue = the trainer gives the token less probability than the sampler, red = more" in legend
    assert "grey = no Δ (not recomputed, or a tool token)" in legend


def test_tis_clips_the_tokens_whose_ratio_passes_the_cap_and_leaves_tokens_without_delta_out():
    d = np.array([1.0, -0.25, np.nan, math.log(1.5)])
    assert verdicts(d, Correction("tis", cap=2.0)) == ["clipped", "kept", None, "kept"]
    assert verdicts(d, Correction("tis", cap=1.2)) == ["clipped", "kept", None, "clipped"]
    assert verdicts(np.array([np.nan, np.nan]), Correction()) == [None, None]


def test_a_sequence_rule_rejects_every_token_with_delta_of_its_sequence():
    d = np.array([0.02, np.nan, 0.01])  # geometric-mean ratio exp(0.015) > 1.001
    assert verdicts(d, Correction("geo", cap=1.001, low=0.999)) == ["rejected", None, "rejected"]
    assert verdicts(d / 100, Correction("geo", cap=1.001, low=0.999)) == ["kept", None, "kept"]
    key = re.sub(r"<[^>]+>", " ", marks_key_html(["rejected", None, "rejected"], Correction("geo", 1.001, 0.999)))
    assert "sequence rejected : all 2 dropped" in re.sub(r"\s+", " ", key)


def test_a_hover_card_gives_both_log_probs_probabilities_ranks_delta_ratio_and_verdict():
    t = with_mismatch(_tokens(), _recomputed())
    html = strip_html(t, "entropy", states=verdicts(t["mismatch"].to_numpy(), Correction("tis", cap=2.0)),
                      correction=Correction("tis", cap=2.0))
    card = re.search(r'data-pos="0".*?<span class="card">(.*?)</table></span>', html).group(1)
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", card))
    assert "log-prob p rank" in text
    assert "behaviour -1.000 0.368 2" in text  # rank 2 of the sampler's top-3
    assert "train 0.000 1.000 1" in text
    assert "+1.0000 · 2.718" in text  # Δ and the ratio e
    assert "clipped to C = 2" in text
    assert "entropy" in text and "0.800" in text
    card1 = re.sub(r"<[^>]+>", " ", re.search(r'data-pos="1".*?<span class="card">(.*?)</table></span>', html).group(1))
    assert "-0.2500 · 0.7788" in card1 and "kept" in card1
    # a token without Δ shows no mismatch lines; beyond the top-k the behaviour rank reads "> k"
    assert "mm-card" not in re.search(r'data-pos="2".*?</table></span>', html).group(0)
    odd = with_mismatch(_tokens().assign(token_id=[1, 6, 7, 8]), _recomputed())
    assert "<td>&gt; 3</td>" in strip_html(odd, "mismatch")


def test_marks_underline_the_clipped_and_dropped_tokens_only_when_asked():
    t = with_mismatch(_tokens(), _recomputed())
    c = Correction("tis", cap=2.0)
    states = verdicts(t["mismatch"].to_numpy(), c)
    marked = strip_html(t, "mismatch", states=states, correction=c, marked=True)
    assert re.search(r'class="tok[^"]*mm-clipped[^"]*" data-pos="0"', marked)
    assert not re.search(r'class="tok[^"]*mm-[a-z]+[^"]*" data-pos="1"', marked)
    assert "mm-clipped" not in strip_html(t, "entropy", states=states, correction=c, marked=False)
    key = re.sub(r"<[^>]+>", " ", marks_key_html(states, c))
    assert re.search(r"clipped \(weight reduced\)\s+1", key) and re.search(r"masked \(dropped\)\s+0", key)
    assert "2 tokens with Δ" in key


def test_a_strip_without_recomputed_log_probs_says_what_to_do():
    note = no_recomputed_html("")
    assert "Rescore it in the Mismatch tab" in note and "import it with both columns" in note
    t = with_mismatch(_tokens(), None)
    assert t["mismatch"].isna().all()
    assert all(r.mismatch != r.mismatch for r in rows_of(t))


def test_the_sidebar_card_sets_the_correction_from_a_preset_and_back_to_custom(seeded_store):
    from widgets.base.state import StudioState
    from widgets.mismatch_controls import CUSTOM, mismatch_controls

    state = StudioState(store=seeded_store)
    controls = mismatch_controls(state)
    preset = next(w for w in controls.select() if "mm-preset" in (w.css_classes or []))
    name, want = next(iter(PRESETS.items()))
    preset.value = name
    assert state.correction() == want and state.mm_preset == name
    state.mm_cap = want.cap + 1.5  # edited by hand: no preset any more
    assert state.mm_preset == "" and preset.value == CUSTOM
    assert state.correction().cap == want.cap + 1.5
    # two frameworks ship the same correction: the one picked stays named
    twins = [n for n, c in PRESETS.items() if list(PRESETS.values()).count(c) > 1]
    preset.value = twins[-1]
    assert state.mm_preset == twins[-1] and preset.value == twins[-1]


def test_sidebar_fields_that_make_no_correction_keep_the_last_one_and_say_why(seeded_store):
    """A cap edited to 0, or a band whose low end passes the cap, never breaks the strip, the table or the tab:
    the last correction the fields made stays in use, and the card says what is wrong."""
    from widgets.base.state import StudioState
    from widgets.mismatch_controls import mismatch_controls

    state = StudioState(store=seeded_store)
    controls = mismatch_controls(state)
    state.param.update(mm_method="icepop", mm_cap=5.0, mm_low=0.5)
    good = state.correction()
    assert state.correction_problem() == ""
    state.mm_cap = 0.3  # below the band's low end
    assert state.correction() == good and "low" in state.correction_problem()
    formula = next(w for w in controls.select() if "mm-formula" in (w.css_classes or []))
    assert "banner error" in formula.object and "stays in use" in formula.object
    state.mm_cap = 6.0
    assert state.correction().cap == 6.0 and state.correction_problem() == ""
