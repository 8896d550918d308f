"""Entropy forks: the quantile rule and the default that marks only tokens where the policy was
unsure, one population for a whole tree, forced-prefix continuation, branch trees in the store,
the pivotal forks a tree places on a strip, the landscape and the two-policy entropy comparison,
on the real sample policies."""
import threading

import numpy as np
import pandas as pd
import pytest
import torch

from sample_data import EARLY_POLICY_DIR, POLICY_DIR, ROLLOUTS_DIR, SEED_DIRS
from studio import queries
from studio.queries import forks
from studio.runs.branch import BranchConfig, BranchError, NoPolicyError, branch_sync
from studio.runs.compare import score_with_sync
from studio.signals.forks import DEFAULT_MIN_ENTROPY, ForkRule, fork_mask, quantile_threshold
from studio.store import Store
from widgets.token_strip import channel_values

# -- the quantile rule (TRL's top_entropy_quantile) ------------------------------------------

@pytest.mark.parametrize("entropies, q, threshold, mask", [
    ([0.0, 1.0, 2.0, 3.0, 4.0], 0.25, 3.0, [0, 0, 0, 1, 1]),  # (n-1)(1-q) = 3: an order statistic
    ([0.1, 0.2, 0.4, 0.8], 0.2, 0.56, [0, 0, 0, 1]),  # 3 x 0.8 = 2.4: 0.4 + 0.4 x (0.8 - 0.4)
    ([0.5, 0.0, 2.0, 1.0], 0.5, 0.75, [0, 0, 1, 1]),  # unsorted input; 1.5 between 0.5 and 1.0
    ([1.0, 1.0, 1.0, 1.0], 0.2, 1.0, [1, 1, 1, 1]),  # ties at the threshold are all kept (>=)
    ([0.3, 0.9], 1.0, 0.3, [1, 1]),  # q = 1 keeps every token
])
def test_quantile_rule_on_literal_cases(entropies, q, threshold, mask):
    thr = quantile_threshold(np.array(entropies), q)
    assert thr == pytest.approx(threshold)
    assert fork_mask(np.array(entropies), thr).astype(int).tolist() == mask


def test_quantile_rule_is_trls():
    """TRL: ``torch.quantile(entropies, 1 - top_entropy_quantile)`` and ``entropies >= threshold``."""
    rng = np.random.default_rng(0)
    for q in (0.05, 0.2, 0.5):
        ent = rng.exponential(0.3, size=997).astype(np.float32)
        trl = torch.quantile(torch.from_numpy(ent).float(), 1 - q).item()
        assert quantile_threshold(ent, q) == pytest.approx(trl, rel=1e-5)
        assert (fork_mask(ent, trl) == (torch.from_numpy(ent) >= trl).numpy()).all()


def test_store_threshold_matches_the_numpy_rule(seeded_store):
    rid = queries.rollout_table(seeded_store).iloc[0]["rollout_id"]
    run = queries.rollout(seeded_store, rid)["run_id"]
    ent = seeded_store.df("SELECT t.entropy FROM tokens t JOIN rollouts ro USING (rollout_id) WHERE ro.run_id = ?",
                          [run])["entropy"].to_numpy()
    for q in (0.1, 0.2, 0.5):
        thr = forks.threshold(seeded_store, ForkRule(q=q, min_entropy=0), rid)  # TRL's rule alone
        assert thr.n_tokens == len(ent)
        assert thr.value == pytest.approx(quantile_threshold(ent, q), rel=1e-6) == pytest.approx(thr.quantile)
        assert thr.share == pytest.approx((ent >= thr.value).mean())
        # with a minimum, the threshold is the larger of the two
        floored = forks.threshold(seeded_store, ForkRule(q=q, min_entropy=0.3), rid)
        assert floored.value == pytest.approx(max(0.3, thr.value)) and floored.quantile == pytest.approx(thr.value)
        assert floored.floored == (thr.value < 0.3)
    absolute = forks.threshold(seeded_store, ForkRule(absolute=0.5), rid)
    assert absolute.value == 0.5 and absolute.share == pytest.approx((ent >= 0.5).mean())
    with pytest.raises(ValueError, match="q must be in"):
        forks.threshold(seeded_store, ForkRule(q=0.0), rid)


def test_filter_scope_uses_the_table_filter(seeded_store):
    flt = queries.RolloutFilter(correct=False)
    rid = queries.rollout_table(seeded_store, flt).iloc[0]["rollout_id"]
    ids = queries.rollout_table(seeded_store, flt)["rollout_id"].tolist()
    ent = seeded_store.df("SELECT entropy FROM tokens WHERE list_contains(?, rollout_id)", [ids])["entropy"].to_numpy()
    thr = forks.threshold(seeded_store, ForkRule(scope="filter", min_entropy=0), rid, flt)
    assert thr.n_tokens == len(ent) and thr.value == pytest.approx(np.quantile(ent, 0.8), rel=1e-6)


def _top_prob(store, run_id: str) -> pd.DataFrame:
    """Every policy token of a run (a tool response's tokens have no statistics): its entropy and the
    probability of the policy's most likely choice there."""
    toks = store.df("""SELECT t.entropy, exp(list_max(t.topk_logprobs)) AS top_p
                       FROM tokens t JOIN rollouts ro USING (rollout_id)
                       WHERE ro.run_id = ? AND t.trained IS NOT FALSE""", [run_id])
    assert toks["top_p"].notna().all()
    return toks


def test_the_default_marks_only_tokens_where_the_policy_was_unsure(tmp_path):
    """On the arithmetic and chat sample worlds, the default rule (the top 20 % and at least 0.5 nats)
    marks no token whose most likely choice had more than 90 %; the top 20 % alone marks thousands of
    them (the 0.8 quantile is under 0.01 nats: 99 % on one token), and leaves the legend's story untrue.
    (The agent world's policy spreads its last 10 % over many tokens: a few marked tokens there had 90-91 %.)"""
    store = Store.open(tmp_path / "both.duckdb", seed_dir=SEED_DIRS)
    runs = store.df("SELECT run_id, any_value(rollout_id) AS rid FROM rollouts JOIN runs USING (run_id) "
                    "WHERE runs.task <> 'calculator_agent' AND runs.kind <> 'minirun' GROUP BY run_id")
    assert len(runs) == 2  # the arithmetic world and the chat world (not the mismatch world's two mini-runs)
    for run_id, rid in runs.itertuples(index=False):
        toks = _top_prob(store, run_id)
        thr = forks.threshold(store, ForkRule(), rid)
        marked = fork_mask(toks["entropy"].to_numpy(), thr.value)
        assert thr.value >= DEFAULT_MIN_ENTROPY and thr.floored
        assert marked.sum() > 100  # still a few hundred unsure tokens to branch at
        assert not (marked & (toks["top_p"] > 0.9)).any(), toks[marked & (toks["top_p"] > 0.9)]
        trl = fork_mask(toks["entropy"].to_numpy(), forks.threshold(store, ForkRule(min_entropy=0), rid).value)
        assert (trl & (toks["top_p"] > 0.99)).sum() > 500
    store.close()


def test_effective_weight_is_advantage_on_forks_only():
    toks = pd.DataFrame({"entropy": [0.0, 0.3, 0.9, np.nan]})
    assert channel_values(toks, "weight", 1.5, 0.3) == [0.0, 1.5, 1.5, 0.0]
    assert channel_values(toks, "advantage", 1.5, 0.3) == [1.5] * 4


# -- forced-prefix continuation on the real policy -------------------------------------------

def test_branch_starts_with_prefix_and_forced_token_and_its_logprobs_are_under_that_prefix(sample_policy):
    prompt = "Q: 23+48-7="
    parent = sample_policy.sample([prompt], n=1, seed=3)[0]
    fork = parent.n_tokens // 2
    prefix = parent.token_ids[:fork].tolist()
    forced = int(parent.topk_ids[fork][1])  # the second most likely token: not what sampling took
    gens = sample_policy.branch(prompt, prefix, [forced, None], n=3, seed=5, max_new_tokens=48)
    assert len(gens) == 6 and [g.prompt_index for g in gens] == [0, 0, 0, 1, 1, 1]
    model, tok = sample_policy.model, sample_policy.tokenizer
    p_ids = tok(prompt)["input_ids"]
    for g in gens:
        ids = g.token_ids.tolist()
        assert ids[:fork] == prefix
        if g.prompt_index == 0:
            assert ids[fork] == forced
        # a direct forward pass over prompt + the whole branch completion
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([p_ids + ids])).logits[0].float()
        logp = torch.log_softmax(logits[len(p_ids) - 1:-1], -1)  # position i predicts completion token i
        direct_lp = logp.gather(-1, torch.tensor(ids)[:, None]).squeeze(-1).numpy()
        direct_ent = -(logp.exp() * logp).sum(-1).numpy()
        np.testing.assert_allclose(g.logprobs, direct_lp, atol=2e-4)
        np.testing.assert_allclose(g.entropies, direct_ent, atol=2e-4)
        np.testing.assert_array_equal(g.topk_ids[fork], parent.topk_ids[fork])
    # the prefix's statistics are the parent's (same policy, same context)
    np.testing.assert_allclose(gens[0].logprobs[:fork], parent.logprobs[:fork], atol=2e-4)
    assert gens[0].logprobs[fork] == pytest.approx(float(parent.topk_logprobs[fork][1]), abs=2e-4)


def test_branch_rejects_tokens_outside_the_vocabulary(sample_policy):
    with pytest.raises(ValueError, match="outside this policy's vocabulary"):
        sample_policy.branch("Q: 1+2=", [], [10_000], n=1)


# -- branch requests and trees in the store --------------------------------------------------

def _middle_fork(store):
    rid = queries.rollout_table(store, queries.RolloutFilter(correct=True)).iloc[0]["rollout_id"]
    toks = queries.tokens(store, rid)
    pos = len(toks) // 2
    return rid, pos, toks


def test_branch_tree_round_trips_through_the_store(tmp_path):
    from sample_data import ROLLOUTS_DIR

    path = tmp_path / "t.duckdb"
    store = Store.open(path, seed_dir=ROLLOUTS_DIR)
    rid, pos, toks = _middle_fork(store)
    alt = int(toks.iloc[pos]["topk_ids"][1])
    res = branch_sync(store, rid, pos, [alt, None], BranchConfig(n=4, seed=7))
    assert res.status == "done" and res.rollouts == 8 and res.error is None
    # the branch of a branch
    res2 = branch_sync(store, res.rollout_ids[0], pos + 2, [None], BranchConfig(n=2, seed=8))
    assert res2.status == "done" and res2.rollouts == 2
    store.close()

    store = Store.open(path)
    tree = forks.tree(store, res2.rollout_ids[0])  # any node finds the whole tree
    assert tree.iloc[0]["rollout_id"] == rid and tree.iloc[0]["depth"] == 0
    assert sorted(tree["depth"].tolist()) == [0] + [1] * 8 + [2] * 2
    first = tree[tree["parent_rollout_id"] == rid]
    assert (first["fork_pos"] == pos).all()
    assert sorted(first["forced_token_id"].dropna().astype(int).tolist()) == [alt] * 4
    assert first["forced_token_id"].isna().sum() == 4  # "as sampled"
    forced_rows = first[first["forced_token_id"].notna()]
    assert (forced_rows["fork_token_id"] == alt).all()
    # every branch shares the parent's tokens before the fork
    parent_prefix = toks["token_id"].iloc[:pos].tolist()
    for b in first["rollout_id"]:
        assert queries.tokens(store, b)["token_id"].iloc[:pos].tolist() == parent_prefix
    assert forks.depth_of(store, res2.rollout_ids[0]) == 2
    # one request is one group; the branches appear in the table under "branches of"
    assert first["group_id"].nunique() == 1
    table = queries.rollout_table(store, queries.RolloutFilter(branches_of=rid))
    assert set(table["rollout_id"]) == set(tree["rollout_id"]) - {rid}
    # the fork summary: each branch's value is the mean reward of its completions
    fl = forks.forks(store, tree)
    assert {(f.parent_rollout_id, f.pos) for f in fl} == {(rid, pos), (res.rollout_ids[0], pos + 2)}
    top = next(f for f in fl if f.parent_rollout_id == rid)
    by = {b.token_id: b for b in top.branches}
    assert set(by) == {alt, None} and by[alt].n == 4 and by[None].n == 4
    rewards = dict(zip(tree["rollout_id"], tree["reward"]))
    assert by[alt].value == pytest.approx(np.mean([rewards[r] for r in by[alt].rollout_ids]))
    assert by[alt].p == pytest.approx(float(np.exp(toks.iloc[pos]["topk_logprobs"][1])), rel=1e-5)
    assert top.spread == pytest.approx(abs(by[alt].value - by[None].value))
    assert top.pivotal == (top.spread >= forks.PIVOTAL_SPREAD)
    run = queries.runs(store)
    assert set(run[run["kind"] == "branch"]["status"]) == {"done"}
    # each node's parent and number of branches, in one read (the fork panel's test for a lone rollout)
    assert forks.lineage(store, rid) == (None, 8)
    assert forks.lineage(store, res.rollout_ids[0]) == (rid, 2)
    assert forks.lineage(store, res2.rollout_ids[0]) == (res.rollout_ids[0], 0)
    assert forks.lineage(store, "no-such-rollout") is None
    # the tree reads each rollout's own reward, as the table shows it
    shown = queries.rollout_table(store, queries.RolloutFilter(branches_of=rid)).set_index("rollout_id")["reward"]
    for r in shown.index:
        assert rewards[r] == pytest.approx(shown[r])
    store.close()


def _answer_pos(toks: pd.DataFrame) -> int:
    """The position of the first token of an arithmetic completion's stated answer (after "A:")."""
    starts = np.cumsum([0] + [len(t) for t in toks["token_text"]])
    at = "".join(toks["token_text"]).rindex("A:") + 2
    return int(np.searchsorted(starts, at))


def _marked(html: str, cls: str) -> set[int]:
    """The positions of the strip's tokens that carry the class ``cls``."""
    import re

    return {int(pos) for c, pos in re.findall(r'<span class="(tok[^"]*)" data-pos="(\d+)"', html) if cls in c.split()}


@pytest.fixture()
def tree_store(tmp_path):
    """The arithmetic world with one tree: its root ``rid`` branched at its stated answer (the sampled
    digit and the runner-up, forced: a pivotal fork), at a middle token (drawn again), and one of those
    branches branched again one token later."""
    store = Store.open(tmp_path / "tree.duckdb", seed_dir=ROLLOUTS_DIR)
    rid, mid, toks = _middle_fork(store)
    ans = _answer_pos(toks)
    assert mid < ans
    sampled = int(toks.iloc[ans]["token_id"])
    alt = next(int(i) for i in toks.iloc[ans]["topk_ids"] if int(i) != sampled)
    at_answer = branch_sync(store, rid, ans, [sampled, alt], BranchConfig(n=2, seed=11))
    at_mid = branch_sync(store, rid, mid, [None], BranchConfig(n=2, seed=12))
    again = branch_sync(store, at_mid.rollout_ids[0], mid + 1, [None], BranchConfig(n=2, seed=13))
    assert {at_answer.status, at_mid.status, again.status} == {"done"}
    yield store, rid, {"answer": (ans, at_answer.rollout_ids), "mid": (mid, at_mid.rollout_ids),
                       "again": (mid + 1, again.rollout_ids)}
    store.close()


def test_a_tree_is_judged_against_its_roots_population(tree_store):
    """Every rollout of a tree gets its root's fork threshold (its run's, its step's), so the prefix
    a branch shares with its root shows the same ▾ marks in both, under any rule."""
    from widgets.base.state import StudioState
    from widgets.token_strip import TokenStrip

    store, rid, made = tree_store
    branches = [b for _, ids in made.values() for b in ids]
    own = store.df("SELECT t.entropy FROM tokens t JOIN rollouts ro USING (rollout_id) WHERE ro.rollout_id = ?",
                   [branches[0]])  # a branch run's own tokens would set another quantile
    for rule in (ForkRule(), ForkRule(min_entropy=0), ForkRule(q=0.3, scope="step", min_entropy=0)):
        root = forks.threshold(store, rule, rid)
        assert root.n_tokens > 10 * len(own)
        for b in branches:
            assert forks.threshold(store, rule, b) == root
    state = StudioState(store=store, fork_min=0.0)  # TRL's top 20 %: the quantile, not the minimum, decides
    strip = TokenStrip(state=state)
    state.rollout_id = rid
    root_marks = _marked(strip._strip.object, "fork")
    for diverged, ids in made.values():
        first = diverged if ids is not made["again"][1] else made["mid"][0]  # shared with the root: before this
        assert {p for p in root_marks if p < first}, "the shared prefix has unsure tokens to compare"
        for b in ids:
            state.rollout_id = b
            assert {p for p in _marked(strip._strip.object, "fork") if p < first} == {p for p in root_marks if p < first}
            assert "the root&#x27;s run" in strip._legend.object


def test_a_trees_forks_are_marked_where_a_rollout_shares_them(tree_store):
    """A fork is on every rollout of the tree that shares the tokens before it: the root shows the
    pivotal answer (◆) and the middle fork (◇); a branch from the middle shows the middle fork and
    its own, not the root's answer; its sibling not the fork it took after their split."""
    from widgets.base.state import StudioState
    from widgets.token_strip import TokenStrip

    store, rid, made = tree_store
    (ans, at_answer), (mid, at_mid), (again_pos, again) = made["answer"], made["mid"], made["again"]
    tree = forks.tree(store, rid)
    fl = forks.forks(store, tree)
    by_pos = {f.pos: f for f in fl}
    assert by_pos[ans].pivotal and by_pos[ans].spread >= forks.PIVOTAL_SPREAD  # a wrong answer digit, forced
    assert not by_pos[mid].pivotal  # one choice: no spread
    on = {r: set(forks.forks_on(tree, fl, r)) for r in tree["rollout_id"]}
    assert on[rid] == {mid, ans}
    assert all(on[r] == {mid, ans} for r in at_answer)  # the answer fork's branches share everything before it
    assert on[at_mid[0]] == {mid, again_pos} and on[at_mid[1]] == {mid}
    assert all(on[r] == {mid, again_pos} for r in again)
    assert forks.forks_on(tree, fl, "not-in-the-tree") == {}

    state = StudioState(store=store)
    strip = TokenStrip(state=state)
    state.rollout_id = rid
    html = strip._strip.object
    assert _marked(html, "pivot") == {ans} and _marked(html, "branched") == {mid}
    assert f"spread {by_pos[ans].spread:.2f}" in html  # the hover card: the spread and each choice's value
    assert "◆ pivotal" in html and "as sampled" in html
    assert "<b>1</b> pivotal" in strip._header.object
    assert "pivotal" in strip._legend.object and "branched, values within 0.5 (1)" in strip._legend.object
    state.rollout_id = at_mid[1]
    assert _marked(strip._strip.object, "pivot") == set() and _marked(strip._strip.object, "branched") == {mid}


def test_a_lone_rollouts_tree_is_drawn_without_reading_the_tree(seeded_store):
    from widgets.fork_panel import lone_tree_html, tree_html

    lone = seeded_store.df("SELECT rollout_id FROM rollouts WHERE parent_rollout_id IS NULL LIMIT 5")["rollout_id"]
    for rid in lone:
        assert forks.lineage(seeded_store, rid) == (None, 0)
        tree = forks.tree(seeded_store, rid)
        full = tree_html(seeded_store, rid, tree, forks.forks(seeded_store, tree), queries.reward_bounds(seeded_store))
        assert lone_tree_html(rid) == full


def test_bad_branch_requests_say_what_to_change_and_write_nothing(seeded_store):
    rid, pos, toks = _middle_fork(seeded_store)
    before = seeded_store.counts()
    with pytest.raises(BranchError, match="n must be 1-32, got 33"):
        branch_sync(seeded_store, rid, pos, [None], BranchConfig(n=33))
    with pytest.raises(BranchError, match="at most 64 per request"):
        branch_sync(seeded_store, rid, pos, [1, 2, 3, None], BranchConfig(n=20))
    with pytest.raises(BranchError, match="choose at least one alternative"):
        branch_sync(seeded_store, rid, pos, [], BranchConfig(n=2))
    with pytest.raises(BranchError, match=f"outside the rollout's {len(toks)} tokens"):
        branch_sync(seeded_store, rid, len(toks) + 3, [None])
    with pytest.raises(BranchError, match="not in this store"):
        branch_sync(seeded_store, "r-missing", 0, [None])
    assert seeded_store.counts() == before


def test_branch_depth_is_bounded(seeded_store, monkeypatch):
    monkeypatch.setattr("studio.runs.branch.MAX_DEPTH", 1)
    rid, pos, _ = _middle_fork(seeded_store)
    res = branch_sync(seeded_store, rid, pos, [None], BranchConfig(n=1, seed=1))
    assert res.status == "done"
    with pytest.raises(BranchError, match="branches nest at most 1 deep"):
        branch_sync(seeded_store, res.rollout_ids[0], pos + 1, [None], BranchConfig(n=1))


def test_rollout_without_a_policy_explains_how_to_attach_one(seeded_store, tmp_path):
    rid, pos, _ = _middle_fork(seeded_store)
    with seeded_store.transaction() as cur:  # as an import of text only would leave it
        cur.execute("UPDATE runs SET policy = NULL, kind = 'import'")
    with pytest.raises(NoPolicyError, match="no policy attached.*attach the policy folder"):
        branch_sync(seeded_store, rid, pos, [None])
    with seeded_store.transaction() as cur:
        cur.execute("UPDATE runs SET policy = ?", [str(tmp_path / "gone")])
    with pytest.raises(NoPolicyError, match="cannot be loaded here"):
        branch_sync(seeded_store, rid, pos, [None])
    # attaching a policy explicitly branches it
    res = branch_sync(seeded_store, rid, pos, [None], BranchConfig(n=2, seed=2), policy_path=POLICY_DIR)
    assert res.status == "done" and res.rollouts == 2


def test_a_policy_with_another_tokenizer_is_refused(seeded_store, tmp_path):
    import json

    rid, pos, _ = _middle_fork(seeded_store)
    prefix = "".join(queries.tokens(seeded_store, rid)["token_text"].iloc[:pos])
    # the sample policy's weights with a tokenizer that swaps two characters of the prefix
    folder = tmp_path / "swapped"
    folder.mkdir()
    for f in POLICY_DIR.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    spec = json.loads((POLICY_DIR / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    a, b = prefix[0], next(c for c in "0123456789+-=;" if c != prefix[0])
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    before = seeded_store.counts()["rollouts"]
    res = branch_sync(seeded_store, rid, pos, [None], BranchConfig(n=1), policy_path=folder)
    assert res.status == "failed" and "tokenizer is not the one that made the rollout" in res.error
    assert seeded_store.counts()["rollouts"] == before


def test_cancelled_branch_leaves_no_rows(seeded_store):
    rid, pos, _ = _middle_fork(seeded_store)
    before = seeded_store.counts()["rollouts"]
    cancel = threading.Event()
    cancel.set()
    res = branch_sync(seeded_store, rid, pos, [None], BranchConfig(n=8), cancel=cancel)
    assert res.status == "cancelled" and res.rollouts == 0
    assert seeded_store.counts()["rollouts"] == before
    assert seeded_store.scalar("SELECT status FROM runs WHERE run_id = ?", [res.run_id]) == "cancelled"


# -- landscape and two policies ---------------------------------------------------------------

def test_landscape_counts_forks_per_rollout(seeded_store):
    run = queries.runs(seeded_store).iloc[0]["run_id"]
    ls = forks.landscape(seeded_store, run, ForkRule(min_entropy=0))
    ent = seeded_store.df("SELECT t.rollout_id, t.entropy FROM tokens t JOIN rollouts ro USING (rollout_id) "
                          "WHERE ro.run_id = ?", [run])
    assert ls.n_tokens == len(ent) == ls.hist_counts.sum()
    per = ent.assign(f=ent["entropy"] >= ls.threshold.value).groupby("rollout_id")["f"].sum()
    got = ls.per_rollout.set_index("rollout_id")["forks"]
    assert (got.sort_index() == per.sort_index()).all()
    assert ls.by_pos["n"].sum() == len(ent)
    assert 0.19 < ls.share_above < 0.25  # ties at the threshold can only add
    floored = forks.landscape(seeded_store, run)  # the default: at least 0.5 nats
    assert floored.threshold.value == DEFAULT_MIN_ENTROPY
    assert floored.share_above == pytest.approx((ent["entropy"] >= DEFAULT_MIN_ENTROPY).mean())


def test_entropy_comparison_with_the_early_checkpoint(seeded_store, sample_policy):
    assert (EARLY_POLICY_DIR / "config.json").exists(), "run: python -m sample_data.build_policy --out sample_data/policy_early --target 0.15"
    gid = queries.groups(seeded_store).iloc[0]["group_id"]
    ids = seeded_store.df("SELECT rollout_id FROM rollouts WHERE group_id = ?", [gid])["rollout_id"].tolist()
    version = score_with_sync(seeded_store, EARLY_POLICY_DIR, ids)
    assert version.startswith("policy_early@")
    again = score_with_sync(seeded_store, EARLY_POLICY_DIR, ids)  # already scored: nothing added
    assert again == version
    n_tok = seeded_store.scalar("SELECT count(*) FROM tokens WHERE list_contains(?, rollout_id)", [ids])
    assert seeded_store.scalar("SELECT count(*) FROM token_scores") == n_tok
    ch = forks.entropy_changes(seeded_store, version, rollout_ids=ids, limit=10_000)
    assert len(ch) == n_tok
    np.testing.assert_allclose(ch["delta"], ch["entropy_b"] - ch["entropy_a"], atol=1e-5)
    assert ch["delta"].abs().is_monotonic_decreasing
    assert ch["delta"].abs().max() > 0.05  # 1,000 more training steps moved the model somewhere
    # the scoring policy's view equals a direct teacher-forced pass of that policy
    from backends import load_policy

    early = load_policy(EARLY_POLICY_DIR, device="cpu")
    r0 = ids[0]
    row = queries.rollout(seeded_store, r0)
    toks = queries.tokens(seeded_store, r0)
    direct = early.score([row["prompt"]], [toks["token_id"].astype(int).tolist()])[0]
    mine = ch[ch["rollout_id"] == r0].sort_values("pos")
    np.testing.assert_allclose(mine["entropy_b"], direct.entropies, atol=1e-4)
