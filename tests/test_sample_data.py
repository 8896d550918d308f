"""The embedded default: a small real policy that leaves room for RL, and its sample rollouts."""
import pandas as pd

from sample_data import POLICY_DIR, ROLLOUTS_DIR
from sample_data.build_policy import heldout_prompts
from studio import queries
from studio.tasks import get_task


def test_policy_folder_is_small_and_complete():
    files = {p.name for p in POLICY_DIR.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= files
    assert sum(p.stat().st_size for p in POLICY_DIR.iterdir()) < 20 * 2**20


def test_policy_is_competent_but_fallible_at_temperature_one(sample_policy):
    """Final-answer accuracy on held-out prompts is 40-85%, with wrong steps to look at."""
    task = get_task("arithmetic")
    prompts = heldout_prompts(300)
    gens = sample_policy.sample([p.text for p in prompts], n=1, temperature=1.0, max_new_tokens=40, seed=2024)
    parsed = [task.parse_completion(p, g.text) for p, g in zip(prompts, gens)]
    acc = sum(task.is_correct(p, c.answer) for p, c in zip(prompts, parsed)) / len(prompts)
    assert 0.40 <= acc <= 0.85, acc
    wrong_steps = sum(1 for c in parsed for s in c.steps if s.correct is False)
    assert wrong_steps >= 10  # mistakes inside steps, not only garbled endings
    # the policy is unsure at some tokens and certain at most: that is what forks look like
    ent = pd.Series([e for g in gens for e in g.entropies])
    assert ent.quantile(0.5) < 0.2 and ent.quantile(0.99) > 0.5


def test_sample_rollouts_show_every_signal(seeded_store):
    table = queries.rollout_table(seeded_store)
    assert table["correct"].any() and not table["correct"].all()
    gs = queries.groups(seeded_store)
    assert gs["all_equal"].any() and not gs["all_equal"].all()
    assert (table["advantage"] > 0).any() and (table["advantage"] < 0).any()
    assert set(pd.read_parquet(ROLLOUTS_DIR / "runs.parquet")["policy"]) == {"sample"}


def test_sample_reward_model_is_shipped_small_and_disagrees_with_the_rule_sometimes(seeded_store):
    """The shipped reward model loads as a one-logit classifier, stays small, and is a real
    learned reward: better than chance against the rule, but not the rule."""
    from sample_data import REWARD_MODEL_DIR
    from studio.rewards import ARITHMETIC_V1, diagnostics, reward_models

    assert (REWARD_MODEL_DIR / "model.safetensors").stat().st_size < 2_000_000
    res = reward_models.score_with_reward_model_sync(seeded_store, REWARD_MODEL_DIR)
    assert res.status == "done" and res.scored == 512
    m = diagnostics.disagreement(seeded_store, ARITHMETIC_V1.version_id, res.rule_version_id, 1.0, 0.5).matrix
    agree = (m.loc["A pass", "B pass"] + m.loc["A fail", "B fail"]) / 512
    assert 0.6 < agree < 0.95
