"""The shipped process reward model (PRM) and value model, through backends.process_models.

Held-out data are the shipped sample rollouts: prompts the builds never train on, sampled
with another seed (``make_rollouts``). Thresholds sit below what the shipped models
measured (``*/training_log.json``): PRM AUC 0.770 on these steps, value model AUC 0.801
at the last token and a 0.63 correlation between a prompt's V(s_0) and its solve rate.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from backends.process_models import (
    load_value_model,
    prm_step_scores,
    prm_version,
    value_model_version,
    value_scores,
)
from backends.types import PolicyLoadError
from sample_data import POLICY_DIR, PRM_DIR, VALUE_MODEL_DIR
from sample_data.build_prm import auc, shipped_rollouts
from studio.tasks import get_task

PRM_AUC = 0.770  # measured on the shipped rollouts' steps (prm/training_log.json)
VALUE_AUC_LAST = 0.801  # V at the last completion token vs final-answer correctness
VALUE_PROMPT_CORR = 0.629  # per prompt: V(s_0) vs the share of its 8 samples that are right


@pytest.fixture(scope="module")
def rollouts():
    return shipped_rollouts(get_task("arithmetic"))


@pytest.fixture(scope="module")
def step_scores(rollouts):
    return prm_step_scores(PRM_DIR, [r.prompt.text for r in rollouts], [r.text for r in rollouts],
                           [[s.end for s in r.steps] for r in rollouts])


@pytest.fixture(scope="module")
def prompt_ids(rollouts):
    tok = load_value_model(VALUE_MODEL_DIR).tokenizer
    return [tok(r.prompt.text)["input_ids"] for r in rollouts]


@pytest.fixture(scope="module")
def values(rollouts, prompt_ids):
    return value_scores(VALUE_MODEL_DIR, prompt_ids, [r.ids for r in rollouts])


def test_models_are_shipped_small():
    for folder, arch in ((PRM_DIR, "GPT2ForSequenceClassification"), (VALUE_MODEL_DIR, "GPT2ForTokenClassification")):
        assert (folder / "model.safetensors").stat().st_size < 1_000_000
        assert {"config.json", "tokenizer.json", "tokenizer_config.json", "training_log.json"} <= {
            p.name for p in folder.iterdir()}
        config = json.loads((folder / "config.json").read_text())
        assert config["architectures"] == [arch] and len(config["id2label"]) == 1
    assert prm_version(PRM_DIR).startswith("prm@") and value_model_version(VALUE_MODEL_DIR).startswith("value_model@")


def test_prm_separates_correct_from_incorrect_heldout_steps(rollouts, step_scores):
    scores = [x for xs in step_scores for x in xs]
    labels = [float(bool(s.correct)) for r in rollouts for s in r.steps]
    assert len(scores) == len(labels) == 784 and all(0.0 < x < 1.0 for x in scores)
    a = auc(scores, labels)
    assert a >= PRM_AUC - 0.1 and a > 0.7, a
    right = np.mean([x for x, y in zip(scores, labels) if y])
    wrong = np.mean([x for x, y in zip(scores, labels) if not y])
    assert right - wrong > 0.1, (right, wrong)


def test_prm_batched_scores_equal_one_at_a_time(rollouts, step_scores):
    picks = sorted({i for i in range(0, len(rollouts), 37)} | {max(range(len(rollouts)), key=lambda i: len(
        rollouts[i].text))})
    for i in picks:
        r = rollouts[i]
        single = prm_step_scores(PRM_DIR, [r.prompt.text], [r.text], [[s.end for s in r.steps]], batch=1)[0]
        np.testing.assert_allclose(single, step_scores[i], atol=1e-5)
    # the score of a step is the score of the text through its end, whatever else is asked for
    r = rollouts[picks[-1]]
    ends = [s.end for s in r.steps]
    assert len(ends) >= 2
    alone = prm_step_scores(PRM_DIR, [r.prompt.text], [r.text[:ends[0]]], [[ends[0]]])[0][0]
    assert alone == pytest.approx(step_scores[picks[-1]][0], abs=1e-5)


def test_prm_inputs_are_checked():
    assert prm_step_scores(PRM_DIR, [], [], []) == []
    assert prm_step_scores(PRM_DIR, ["Q: 1+2="], ["1+2=3;A:3"], [[]]) == [[]]
    with pytest.raises(ValueError, match="one of each"):
        prm_step_scores(PRM_DIR, ["Q: 1+2="], ["1+2=3;A:3"], [])
    with pytest.raises(ValueError, match="outside the completion"):
        prm_step_scores(PRM_DIR, ["Q: 1+2="], ["1+2=3"], [[9]])


def test_value_scores_read_the_state_before_each_completion_token(rollouts, prompt_ids, values):
    import torch

    vm = load_value_model(VALUE_MODEL_DIR)
    for i in range(0, len(rollouts), 53):
        p, c = prompt_ids[i], rollouts[i].ids
        assert len(values[i]) == len(c)
        ids = torch.tensor([p + c], device=vm.device)
        with torch.inference_mode():
            direct = torch.sigmoid(vm.model(input_ids=ids).logits[0, :, 0].float()).cpu().numpy()
        np.testing.assert_allclose(values[i], [direct[len(p) + t - 1] for t in range(len(c))], atol=1e-5)
        # V(s_0) depends on the prompt only: the same for every completion of it
        assert value_scores(VALUE_MODEL_DIR, [p], [c[:1]])[0][0] == pytest.approx(values[i][0], abs=1e-5)


def test_value_batched_scores_equal_one_at_a_time(rollouts, prompt_ids, values):
    for i in range(3, len(rollouts), 41):
        single = value_scores(VALUE_MODEL_DIR, [prompt_ids[i]], [rollouts[i].ids], batch=1)[0]
        np.testing.assert_allclose(single, values[i], atol=1e-5)
    assert value_scores(VALUE_MODEL_DIR, [prompt_ids[0]], [[]]) == [[]]
    with pytest.raises(ValueError, match="at least one token"):
        value_scores(VALUE_MODEL_DIR, [[]], [rollouts[0].ids])


def test_value_model_predicts_the_policy_s_success(rollouts, values):
    correct = [float(r.correct) for r in rollouts]
    a = auc([v[-1] for v in values], correct)
    assert a >= VALUE_AUC_LAST - 0.1 and a > 0.7, a
    by_prompt: dict[str, list[tuple[float, float]]] = {}
    for r, v in zip(rollouts, values):
        by_prompt.setdefault(r.prompt.text, []).append((v[0], float(r.correct)))
    v0 = np.array([np.mean([a for a, _ in g]) for g in by_prompt.values()])
    rate = np.array([np.mean([b for _, b in g]) for g in by_prompt.values()])
    corr = float(np.corrcoef(v0, rate)[0, 1])
    assert corr >= VALUE_PROMPT_CORR - 0.15 and corr > 0.4, corr
    assert v0[rate >= 0.5].mean() - v0[rate < 0.5].mean() > 0.15
    # calibrated on average: the mean value of the start state is near the mean success
    assert abs(np.mean([v[0] for v in values]) - np.mean(correct)) < 0.1


def test_bad_folders_give_a_specific_error(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(PolicyLoadError, match="process reward model folder .* does not exist"):
        prm_step_scores(missing, ["Q: 1+2="], ["1+2=3"], [[5]])
    with pytest.raises(PolicyLoadError, match="value model folder .* does not exist"):
        value_scores(missing, [[1]], [[2]])
    with pytest.raises(PolicyLoadError, match="does not exist"):
        prm_version(missing)
    with pytest.raises(PolicyLoadError, match="does not exist"):
        value_model_version(missing)
    # the wrong head: a policy, or the other process model
    with pytest.raises(PolicyLoadError, match="not a process reward model: it holds a GPT2LMHeadModel"):
        prm_step_scores(POLICY_DIR, ["Q: 1+2="], ["1+2=3"], [[5]])
    with pytest.raises(PolicyLoadError, match="not a value model: it holds a GPT2LMHeadModel"):
        value_scores(POLICY_DIR, [[1]], [[2]])
    with pytest.raises(PolicyLoadError, match="not a process reward model: it holds a GPT2ForTokenClassification"):
        prm_step_scores(VALUE_MODEL_DIR, ["Q: 1+2="], ["1+2=3"], [[5]])
    with pytest.raises(PolicyLoadError, match="not a value model: it holds a GPT2ForSequenceClassification"):
        value_model_version(PRM_DIR)
    # a config that claims the head its weights lack: the loader notices the missing weights
    fake = tmp_path / "relabelled_policy"
    shutil.copytree(POLICY_DIR, fake)
    config = json.loads((fake / "config.json").read_text())
    config.update(architectures=["GPT2ForSequenceClassification"], num_labels=1)
    (fake / "config.json").write_text(json.dumps(config))
    with pytest.raises(PolicyLoadError, match="not a trained process reward model: its weights lack score.weight"):
        prm_step_scores(fake, ["Q: 1+2="], ["1+2=3"], [[5]])
    with pytest.raises(PolicyLoadError, match="is a file"):
        prm_step_scores(PRM_DIR / "config.json", ["Q: 1+2="], ["1+2=3"], [[5]])


# ---------------------------------------------------------------------------- in the studio

def test_prm_steps_are_stored_as_a_step_reward_source(seeded_store):
    """prm_steps scores each segmented step in a worker and stores exactly what the PRM
    says for prompt + completion through that step; a second call adds nothing."""
    from studio.queries import credit
    from studio.runs.credit_models import prm_steps
    from studio.workers.sync import run_sync

    rids = seeded_store.df("SELECT rollout_id FROM rollouts ORDER BY rollout_id LIMIT 24")["rollout_id"].tolist()
    source = run_sync(prm_steps, seeded_store, PRM_DIR, rids)
    assert source == "prm-" + prm_version(PRM_DIR) and source in credit.step_sources(seeded_store)
    rows = seeded_store.df("""SELECT ro.rollout_id, ro.text, p.text AS prompt FROM rollouts ro JOIN prompts p
                              USING (prompt_id) WHERE list_contains(?, rollout_id)""", [rids])
    n = 0
    for r in rows.itertuples():
        steps = credit.steps_of(seeded_store, r.rollout_id)
        got = credit.step_rewards(seeded_store, r.rollout_id, source)
        assert got[["step_idx", "start_pos", "end_pos"]].values.tolist() == \
            steps[["step_idx", "start_pos", "end_pos"]].values.tolist()
        direct = prm_step_scores(PRM_DIR, [r.prompt], [r.text], [steps["char_end"].tolist()])[0]
        np.testing.assert_allclose(got["value"], direct, atol=1e-6)
        n += len(steps)
    assert n > len(rids)  # several steps each
    run_sync(prm_steps, seeded_store, PRM_DIR, rids)
    assert seeded_store.scalar("SELECT count(*) FROM step_rewards WHERE source = ?", [source]) == n


def test_critic_values_feed_gae(seeded_store, prompt_ids):
    """critic_values stores V(s_t) per token; GAE with γ = λ = 1 then gives A_t = R − V(s_t)
    in the token strip and A_0 = R − V(s_0) in the table's SQL."""
    from studio import queries
    from studio.queries import credit, forks
    from studio.runs.credit_models import critic_values
    from studio.signals.advantages import Credit
    from studio.workers.sync import run_sync

    gid = seeded_store.scalar("SELECT group_id FROM rollouts ORDER BY rollout_id LIMIT 1")
    rids = seeded_store.df("SELECT rollout_id FROM rollouts WHERE group_id = ?", [gid])["rollout_id"].tolist()
    version = run_sync(critic_values, seeded_store, VALUE_MODEL_DIR, rids)
    assert version == "value-" + value_model_version(VALUE_MODEL_DIR)
    assert version not in forks.scored_versions(seeded_store)  # a critic is not a reference policy
    c = Credit("gae", gamma=1.0, lam=1.0, values=version)
    grp = queries.group(seeded_store, gid, None, c).set_index("rollout_id")
    tok = load_value_model(VALUE_MODEL_DIR).tokenizer
    for rid in rids:
        row = seeded_store.df("""SELECT p.text AS prompt, list(t.token_id ORDER BY t.pos) AS ids FROM rollouts ro
                                 JOIN prompts p USING (prompt_id) JOIN tokens t USING (rollout_id)
                                 WHERE ro.rollout_id = ? GROUP BY ALL""", [rid]).iloc[0]
        direct = value_scores(VALUE_MODEL_DIR, [tok(row["prompt"])["input_ids"]], [[int(i) for i in row["ids"]]])[0]
        tc = credit.token_advantages(seeded_store, rid, c)
        reward = grp.loc[rid, "reward"]
        np.testing.assert_allclose(tc.values, reward - np.asarray(direct), atol=1e-5)
        assert grp.loc[rid, "advantage"] == pytest.approx(reward - direct[0], abs=1e-5)
    n = seeded_store.scalar("SELECT count(*) FROM token_scores WHERE policy_version = ?", [version])
    run_sync(critic_values, seeded_store, VALUE_MODEL_DIR, rids)
    assert seeded_store.scalar("SELECT count(*) FROM token_scores WHERE policy_version = ?", [version]) == n


def test_process_models_in_the_studio_refuse_bad_folders(seeded_store, tmp_path):
    from studio.runs.credit_models import critic_values, prm_steps
    from studio.workers.sync import run_sync

    rid = seeded_store.scalar("SELECT rollout_id FROM rollouts LIMIT 1")
    with pytest.raises(PolicyLoadError, match="process reward model folder .* does not exist"):
        run_sync(prm_steps, seeded_store, tmp_path / "nope", [rid])
    with pytest.raises(PolicyLoadError, match="not a value model"):
        run_sync(critic_values, seeded_store, PRM_DIR, [rid])
    # a critic with another tokenizer would value other tokens: refused, nothing stored
    other = tmp_path / "value_other_vocab"
    shutil.copytree(VALUE_MODEL_DIR, other)
    tj = json.loads((other / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    digits = [k for k in vocab if k.isdigit()]
    a, b = digits[0], digits[1]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer.json").write_text(json.dumps(tj))
    from studio.workers import TokenizerMismatch

    with pytest.raises(TokenizerMismatch, match="must share the policy's tokenizer"):
        run_sync(critic_values, seeded_store, other, seeded_store.df(
            "SELECT rollout_id FROM rollouts LIMIT 64")["rollout_id"].tolist())
    assert seeded_store.scalar("SELECT count(*) FROM token_scores") == 0
