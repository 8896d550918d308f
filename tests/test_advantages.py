"""GRPO advantages: hand-computed cases, and the SQL form equals the numpy form."""
import numpy as np
import pandas as pd
import pytest

from studio.signals.advantages import (
    all_equal_groups,
    dr_grpo_sql,
    from_stats_sql,
    group_stats_sql,
    grpo,
    grpo_sql,
    rloo_sql,
)
from studio.store import Store


def test_grpo_hand_computed():
    # rewards 1, 0, 0, 0: mean 0.25, sample std sqrt(0.25) = 0.5
    # A = (1 - .25)/.5 = 1.5 and (0 - .25)/.5 = -0.5 (ignoring eps = 1e-4)
    a = grpo(np.array([1.0, 0.0, 0.0, 0.0]), np.zeros(4))
    assert a == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-3)
    # two groups are normalised independently; r = 2, 4 -> mean 3, std sqrt(2)
    b = grpo(np.array([2.0, 4.0, 1.0, 0.0]), np.array([0, 0, 1, 1]))
    assert b[:2] == pytest.approx([-1 / np.sqrt(2), 1 / np.sqrt(2)], abs=1e-3)
    assert b[2:] == pytest.approx([1 / np.sqrt(2), -1 / np.sqrt(2)], abs=1e-3)


def test_advantages_sum_to_zero_within_each_group():
    rng = np.random.default_rng(0)
    r, g = rng.random(40), np.repeat(np.arange(5), 8)
    a = grpo(r, g)
    for k in range(5):
        assert a[g == k].sum() == pytest.approx(0.0, abs=1e-9)


def test_all_equal_group_has_zero_advantage_and_is_flagged():
    r, g = np.array([0.5, 0.5, 0.5, 1.0, 0.0]), np.array([0, 0, 0, 1, 1])
    assert grpo(r, g)[:3].tolist() == [0.0, 0.0, 0.0]
    assert all_equal_groups(r, g) == {0}


def test_equal_rewards_with_float_residue_give_exact_zero():
    # 0.1 + 0.125 style totals: the mean of eight copies is not bit-identical to each copy
    r = np.full(8, 0.1 * 1.0 + 0.25 * 0.5)
    assert grpo(r, np.zeros(8)).tolist() == [0.0] * 8


def test_singleton_group_gets_zero():
    assert grpo(np.array([3.0]), np.array([7])).tolist() == [0.0]


def test_sql_form_matches_numpy_form():
    rng = np.random.default_rng(1)
    df = pd.DataFrame({"group_id": np.repeat(["a", "b", "c", "d"], 6), "reward": rng.random(24).round(2)})
    df.loc[df.group_id == "c", "reward"] = 0.1 + 0.125  # an all-equal group, with float residue
    df = pd.concat([df, pd.DataFrame({"group_id": ["e"], "reward": [0.3]})], ignore_index=True)  # singleton
    store = Store.open(":memory:")
    cur = store.cursor()
    cur.register("t", df)
    out = cur.execute(f"SELECT group_id, reward, {grpo_sql()} AS adv FROM t").df()
    out = out.sort_values(["group_id", "reward"]).reset_index(drop=True)
    ref = grpo(out["reward"].to_numpy(), out["group_id"].to_numpy())
    assert out["adv"].to_numpy() == pytest.approx(ref, abs=1e-9)
    assert (out.loc[out.group_id == "c", "adv"] == 0.0).all()
    # the GROUP BY forms the queries use equal the window forms, row by row (NULL rewards too)
    df.loc[3, "reward"] = None
    cur.register("t", df)
    for key, window in (("grpo", grpo_sql()), ("dr_grpo", dr_grpo_sql()), ("rloo", rloo_sql())):
        both = cur.execute(f"""WITH gs AS (SELECT group_id, {group_stats_sql()} FROM t GROUP BY group_id)
                               SELECT {window} AS w, {from_stats_sql(key, 't.reward')} AS g
                               FROM t JOIN gs USING (group_id)""").df()
        assert len(both) == len(df) and both["w"].to_numpy() == pytest.approx(both["g"].to_numpy(), abs=1e-12), key
