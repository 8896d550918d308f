"""Training on agent trajectories: the loss mask gives tool tokens exactly zero gradient (on the
trainer's functions, and end to end from the store's ``trained`` column), and a short agent
mini-run stores its trajectories' turns, masked tokens with weight 0 and the agent metrics."""
from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from backends.trainer import backward, completion_logps, micro_batches, policy_loss  # noqa: E402
from sample_data import CHAT_POLICY_DIR  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture(scope="module")
def chat_policy():
    """The shipped tiny chat policy, a private copy (gradients are written into it)."""
    from backends.policy import Policy

    pol = Policy(str(CHAT_POLICY_DIR))
    pol.model.eval()
    return pol


def _grads(model) -> list[torch.Tensor]:
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


def _step_grads(model, p_ids, c_ids, masks, adv, pad, loss_type="grpo", old=None):
    """Parameter gradients and loss of one training step on the batch (as ``backward`` takes it)."""
    model.zero_grad(set_to_none=True)
    mbs = micro_batches(p_ids, c_ids, adv, [np.arange(len(c_ids))], loss_type, loss_masks=masks)
    if old is not None:
        mbs[0].old_logps = old
    loss, _ = backward(model, mbs, pad, loss_type=loss_type, max_completion_length=max(map(len, c_ids)))
    return loss, _grads(model)


# ---------------------------------------------------------------------------- the loss, literally

def test_a_masked_token_adds_nothing_to_the_loss_nor_to_its_length():
    lp = torch.tensor([[-1.0, -2.0, -0.5, -0.7]])
    old = torch.tensor([[-1.0, float("nan"), -0.5, -0.7]])  # the tool token (pos 1) has no policy log-prob: NaN
    m = torch.tensor([[1.0, 0.0, 1.0, 0.0]])  # pos 1 a tool token, pos 3 padding
    # ρ = 1 on the two trained tokens, A = 2: the loss is -2, averaged over 2 tokens (not 3, not 4)
    loss, st = policy_loss(lp, old, torch.tensor([2.0]), m)
    assert loss.item() == pytest.approx(-2.0) and st["ratio_mean"] == pytest.approx(1.0)
    # per-token advantages: only positions 0 and 2 count, -(1 + 3) / 2 = -2
    loss, _ = policy_loss(lp, old, torch.tensor([[1.0, 100.0, 3.0, 100.0]]), m)
    assert loss.item() == pytest.approx(-2.0)
    # bnpo over the batch's trained tokens: (-1·1 - 1·3) / 2 trained tokens; dr_grpo divides by 1 × 4
    assert policy_loss(lp, old, torch.tensor([[1.0, 9.0, 3.0, 9.0]]), m, loss_type="bnpo")[0].item() == \
        pytest.approx(-2.0)
    assert policy_loss(lp, old, torch.tensor([[1.0, 9.0, 3.0, 9.0]]), m, loss_type="dr_grpo",
                       max_completion_length=4)[0].item() == pytest.approx(-1.0)
    # a NaN reference log-prob on the tool token: the KL term reads 0 there and the loss stays finite
    ref = torch.tensor([[-0.5, float("nan"), -0.5, float("nan")]])
    loss, st = policy_loss(lp, old, torch.tensor([0.0]), m, beta=0.1, ref_logps=ref)
    # KL on pos 0: d = 0.5, e^0.5 - 1.5; pos 2: d = 0 -> 0; mean over the 2 trained tokens, × β
    assert loss.item() == pytest.approx(0.1 * (np.exp(0.5) - 1.5) / 2, abs=1e-6)
    assert st["kl"] == pytest.approx((np.exp(0.5) - 1.5) / 2, abs=1e-6)


def test_the_loss_gives_a_masked_token_s_log_prob_exactly_zero_gradient():
    lp = torch.tensor([[-1.0, -2.0, -0.5, -0.3]], requires_grad=True)
    m = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    old = torch.tensor([[-1.2, float("nan"), float("nan"), -0.1]])
    for loss_type in ("grpo", "bnpo", "dr_grpo"):
        lp.grad = None
        loss, _ = policy_loss(lp, old, torch.tensor([1.5]), m, beta=0.05, ref_logps=old - 0.1, loss_type=loss_type,
                              max_completion_length=4)
        loss.backward()
        assert lp.grad[0, 1].item() == 0.0 and lp.grad[0, 2].item() == 0.0  # the tool tokens: exactly 0, not NaN
        assert lp.grad[0, 0].item() != 0.0 and lp.grad[0, 3].item() != 0.0


# ---------------------------------------------------------------------------- on the real policy

def _batch(tok):
    """Two rows of one chat prompt: an answer, and a trajectory whose tool response ends it (the
    turn budget was reached there) and one whose tool response sits between two assistant turns."""
    prompt = "<|im_start|>user\nTom has 3 apples and buys 4.<|im_end|>\n<|im_start|>assistant\n"
    p = tok(prompt)["input_ids"]
    say = tok("Tom has 7 apples.", add_special_tokens=False)["input_ids"]
    tool = tok(" 3+4 gives 7", add_special_tokens=False)["input_ids"]
    after = tok(" So 7.", add_special_tokens=False)["input_ids"]
    rows = [(say, [True] * len(say)),
            (say + tool, [True] * len(say) + [False] * len(tool)),  # the tool turn is last
            (say + tool + after, [True] * len(say) + [False] * len(tool) + [True] * len(after))]
    return [p] * len(rows), [r[0] for r in rows], [np.array(r[1]) for r in rows], len(say), len(tool)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo"])
def test_changing_a_masked_tool_token_leaves_every_gradient_identical_and_unmasking_changes_them(chat_policy,
                                                                                              loss_type):
    model, tok = chat_policy.model, chat_policy.tokenizer
    pad = tok.pad_token_id or 0
    p_ids, c_ids, masks, n_say, n_tool = _batch(tok)
    adv = torch.tensor([0.5, 1.0, -1.0])
    loss, base = _step_grads(model, p_ids, c_ids, masks, adv, pad, loss_type)
    assert max(g.abs().max().item() for g in base) > 1e-4  # the trained tokens do move the weights
    # row 1's tool tokens are its last: other token ids there (as input and as target) change nothing at all
    changed = [list(c) for c in c_ids]
    changed[1][n_say:] = [(t + 17) % len(tok) for t in changed[1][n_say:]]
    loss2, other = _step_grads(model, p_ids, changed, masks, adv, pad, loss_type)
    assert loss2 == loss and all(torch.equal(a, b) for a, b in zip(base, other, strict=True))
    # unmasked, the same change does change the gradients: the mask is what made them identical
    unmasked = [m.copy() for m in masks]
    unmasked[1][:] = True
    _, u1 = _step_grads(model, p_ids, c_ids, unmasked, adv, pad, loss_type)
    _, u2 = _step_grads(model, p_ids, changed, unmasked, adv, pad, loss_type)
    assert not all(torch.equal(a, b) for a, b in zip(u1, u2, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(u1, base, strict=True))


def test_a_tool_token_inside_a_trajectory_gets_zero_gradient_and_its_nan_statistics_are_never_read(chat_policy):
    """Row 2's tool response sits between two assistant turns: the later turn reads it as context
    (the policy saw it), but its own log-probs get exactly zero gradient, and π_old's NaN there
    (the sampler records no statistics on tool tokens) changes nothing."""
    model, tok = chat_policy.model, chat_policy.tokenizer
    pad = tok.pad_token_id or 0
    p_ids, c_ids, masks, n_say, n_tool = _batch(tok)
    logps, mask, _ = completion_logps(model, p_ids, c_ids, pad, loss_masks=masks)
    assert mask[2, n_say:n_say + n_tool].sum() == 0 and mask[2, :n_say].all() and mask[2, n_say + n_tool:].all()
    logps.retain_grad()
    old = logps.detach().clone() - 0.05
    old_nan = old.clone()
    old_nan[2, n_say:n_say + n_tool] = float("nan")
    old_nan[1, n_say:] = float("nan")
    loss, _ = policy_loss(logps, old_nan, torch.tensor([0.5, 1.0, -1.0]), mask)
    loss.backward()
    assert torch.isfinite(loss)
    assert (logps.grad[2, n_say:n_say + n_tool] == 0).all() and (logps.grad[1, n_say:] == 0).all()
    assert (logps.grad[2, n_say + n_tool:] != 0).all()  # the answer after the tool is trained
    adv = torch.tensor([0.5, 1.0, -1.0])
    _, with_nan = _step_grads(model, p_ids, c_ids, masks, adv, pad, old=old_nan)
    _, finite = _step_grads(model, p_ids, c_ids, masks, adv, pad, old=old)
    assert all(torch.equal(a, b) for a, b in zip(with_nan, finite, strict=True))
    assert all(torch.isfinite(g).all() for g in with_nan)


# ---------------------------------------------------------------------------- the mask end to end

DATA = Path(__file__).parent / "data" / "imports"


def test_an_imported_trajectory_s_tool_tokens_are_stored_untrained_weigh_0_and_get_zero_gradient(empty_store,
                                                                                                 chat_policy):
    """verl's agent loop dump (``response_mask`` 0 on tool tokens) → the store's ``trained`` column →
    the strip's ``weight`` channel 0 there → the trainer's mask, the batch built from the stored rows:
    changing a tool token's target changes no gradient at all; unmasked, the same change does."""
    from backends.trainer import _whole_logits
    from studio.ingest.importers import import_run
    from studio.queries import reads
    from widgets.token_strip import channel_values

    store = empty_store
    path = DATA / "verl_agent_loop.jsonl"
    import_run(store, path, "verl-agent", tokenizer="sample-chat")
    rows = store.df("SELECT rollout_id, coalesce(prompt_text, p.text) AS prompt FROM rollouts JOIN prompts p "
                    "USING (prompt_id) ORDER BY sample_idx, rollout_id")
    records = [json.loads(line) for line in path.read_text().splitlines()]
    masks = {tuple(r["response_ids"]): np.array(r["response_mask"], dtype=bool) for r in records}
    model, tok = chat_policy.model, chat_policy.tokenizer
    p_ids, c_ids, trained = [], [], []
    for rid, prompt in rows.itertuples(index=False):
        t = reads.tokens(store, rid)
        ids, mask = t["token_id"].tolist(), t["trained"].to_numpy(dtype=bool)
        assert (mask == masks[tuple(ids)]).all()  # stored as the framework masked it
        weight = channel_values(t, "weight", advantage=1.5, fork_threshold=0.0)
        assert all(w == 0.0 for w, m in zip(weight, mask, strict=True) if not m)
        assert t.loc[~mask, "logprob"].isna().all()  # verl's 0.0 padding on tool tokens is not a log-prob
        p_ids.append(tok(prompt, add_special_tokens=False)["input_ids"])
        c_ids.append(ids)
        trained.append(mask)
    assert sum(int((~mask).sum()) for mask in trained) > 20  # tool tokens, in the middle of trajectories
    C = max(map(len, c_ids))
    m = torch.zeros(len(c_ids), C)
    for b, mask in enumerate(trained):
        m[b, :len(mask)] = torch.from_numpy(mask.astype(np.float32))
    adv = torch.linspace(-1.0, 1.0, len(c_ids))

    targets, every = torch.zeros(len(c_ids), C, dtype=torch.long), torch.zeros(len(c_ids), C)
    for b, ids in enumerate(c_ids):
        targets[b, :len(ids)], every[b, :len(ids)] = torch.tensor(ids), 1.0

    def grads(targets: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
        """One step's parameter gradients, the stored tokens as the context, ``targets`` as what is scored."""
        model.zero_grad(set_to_none=True)
        logits, _, _ = _whole_logits(model, p_ids, c_ids, C, tok.pad_token_id or 0, "cpu")  # [B, C, V]
        logps = torch.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1)  # [B, C]
        policy_loss(logps, logps.detach(), adv, mask)[0].backward()
        return _grads(model)

    other = targets.clone()
    other[m == 0] = (other[m == 0] + 5) % len(tok)  # every tool token's target another token
    base = grads(targets, m)
    assert all(torch.equal(a, b) for a, b in zip(base, grads(other, m), strict=True))
    assert max(g.abs().max().item() for g in base) > 1e-4
    # unmasked (every token trained), the same change does change them
    assert not all(torch.equal(a, b) for a, b in zip(grads(targets, every), grads(other, every), strict=True))


# ---------------------------------------------------------------------------- a short agent mini-run

@pytest.mark.slow
def test_a_short_agent_mini_run_stores_trajectories_masked_tool_tokens_and_the_agent_metrics(tmp_path):
    """Three steps on ``calculator_agent`` with the task's defaults (the sample agent policy, its
    budgets): every rollout is a trajectory with its turns, tool tokens are stored untrained with
    no statistics and train weight 0, and each step's agent metrics are its trajectories' means."""
    from sample_data import AGENT_POLICY_DIR
    from studio.runs import minirun
    from studio.runs.training import MiniRunConfig
    from studio.store import Store

    store = Store.open(tmp_path / "s.duckdb")
    cfg = MiniRunConfig(steps=3, group_size=4, prompts_per_step=2, n_prompts=6, checkpoint_every=100)
    run_id = minirun.start(store, cfg, task="calculator_agent")
    st = minirun.wait(run_id, 600)
    assert st.status == "done", st.error
    config = json.loads(store.scalar("SELECT config FROM runs WHERE run_id = ?", [run_id]))
    assert Path(config["policy"]) == AGENT_POLICY_DIR and config["max_turns"] > 1  # the agent task's defaults
    ro = store.df("SELECT rollout_id, train_step, train_advantage, n_turns, n_tool_calls, n_tool_errors "
                  "FROM rollouts WHERE run_id = ?", [run_id])
    assert len(ro) == 3 * 2 * 4 and ro["n_tool_calls"].sum() > 0
    turns = store.df("SELECT rollout_id, turn_idx, role, start_pos, end_pos, tool_name, error FROM turns "
                     "WHERE list_contains(?, rollout_id) ORDER BY rollout_id, turn_idx", [ro["rollout_id"].tolist()])
    per = turns.groupby("rollout_id").size()
    called = ro[ro["n_tool_calls"] > 0]
    assert (per.loc[called["rollout_id"]].to_numpy() == called["n_turns"].to_numpy()).all()
    assert set(turns["role"]) == {"assistant", "tool"} and (turns.loc[turns["role"] == "tool", "tool_name"].notna()
                                                            | turns.loc[turns["role"] == "tool", "error"].notna()).all()
    tok = store.df("SELECT t.rollout_id, t.trained, t.train_weight, t.logprob, r.train_advantage, tu.role "
                   "FROM tokens t JOIN rollouts r USING (rollout_id) "
                   "LEFT JOIN turns tu ON tu.rollout_id = t.rollout_id AND tu.turn_idx = t.turn_idx "
                   "WHERE r.run_id = ?", [run_id])
    masked = tok[~tok["trained"]]
    assert len(masked) > 0 and (masked["role"] == "tool").all()
    assert (masked["train_weight"] == 0).all() and masked["logprob"].isna().all()
    own = tok[tok["trained"]]
    assert np.allclose(own["train_weight"], own["train_advantage"], atol=1e-6) and own["logprob"].notna().all()
    m = minirun.metrics(store, [run_id]).pivot_table(index="train_step", columns="metric", values="value")
    means = ro.groupby("train_step")[["n_turns", "n_tool_calls", "n_tool_errors"]].mean()
    assert np.allclose(m["agent/turns"], means["n_turns"]) and np.allclose(m["agent/tool_calls"], means["n_tool_calls"])
    assert np.allclose(m["agent/tool_errors"], means["n_tool_errors"])
    store.close()
