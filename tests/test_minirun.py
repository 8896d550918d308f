"""Mini-runs: the loss on literal cases and against TRL's GRPO loss, a real 20-step run on the
sample policy that must raise accuracy on its training prompts, SIGKILL consistency and
resume, one run at a time, and the settings' checks."""
from __future__ import annotations

import json
import os
import signal
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from backends.trainer import completion_logps, entropy_threshold, policy_loss  # noqa: E402
from sample_data import POLICY_DIR  # noqa: E402
from studio.face.cli import minirun as minirun_cli  # noqa: E402
from studio.runs import minirun  # noqa: E402
from studio.runs.training import MiniRunConfig, TrainConfigError, evaluate_job, task_prompts  # noqa: E402
from studio.store import Store  # noqa: E402
from studio.tasks import get_task  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


# ---------------------------------------------------------------------------- the loss, literally

def test_policy_loss_on_literal_cases():
    lp = torch.tensor([[-1.0, -2.0, -0.5]])
    m = torch.tensor([[1.0, 1.0, 0.0]])  # the third token is padding
    # π = π_old: ρ = 1, the loss is -A averaged over the two real tokens
    loss, st = policy_loss(lp, lp, torch.tensor([2.0]), m)
    assert loss.item() == pytest.approx(-2.0) and st["clip_frac"] == 0.0 and st["ratio_mean"] == pytest.approx(1.0)
    # negative advantage, ρ = e^-1 ≈ 0.37 < 0.8: min(ρA, clip(ρ)A) = min(-0.37, -0.8)·(-1)... with A = -1
    # ρA = -0.368, 0.8·A = -0.8, min = -0.8, loss = 0.8 on every token; both tokens clipped
    loss, st = policy_loss(lp - 1.0, lp, torch.tensor([-1.0]), m)
    assert loss.item() == pytest.approx(0.8) and st["clip_frac"] == pytest.approx(1.0)
    # a ratio inside the range is not clipped: ρ = e^0.1 = 1.105, A = 1 -> loss = -1.105
    loss, st = policy_loss(lp + 0.1, lp, torch.tensor([1.0]), m)
    assert loss.item() == pytest.approx(-np.exp(0.1), abs=1e-6) and st["clip_frac"] == 0.0
    # KL k3 term: log π_ref - log π = 0.5 -> e^0.5 - 0.5 - 1 = 0.1487 per token, times β = 0.1
    loss, st = policy_loss(lp, lp, torch.tensor([0.0]), m, beta=0.1, ref_logps=lp + 0.5)
    assert loss.item() == pytest.approx(0.1 * (np.exp(0.5) - 1.5), abs=1e-6)
    assert st["kl"] == pytest.approx(np.exp(0.5) - 1.5, abs=1e-6)
    # entropy mask: only the first token counts in the sum, the mean still divides by 2 tokens
    loss, _ = policy_loss(lp, lp, torch.tensor([1.0]), m, entropy_mask=torch.tensor([[1.0, 0.0, 1.0]]))
    assert loss.item() == pytest.approx(-0.5)
    # averaging: two completions of 1 and 3 tokens, A = (1, 0)
    lp2, m2 = torch.zeros(2, 3), torch.tensor([[1.0, 0, 0], [1, 1, 1]])
    a = torch.tensor([1.0, 0.0])
    assert policy_loss(lp2, lp2, a, m2, loss_type="grpo")[0].item() == pytest.approx(-0.5)  # mean of (-1, 0)
    assert policy_loss(lp2, lp2, a, m2, loss_type="bnpo")[0].item() == pytest.approx(-0.25)  # -1 over 4 tokens
    assert policy_loss(lp2, lp2, a, m2, loss_type="dr_grpo",
                       max_completion_length=5)[0].item() == pytest.approx(-0.1)  # -1 / (2 x 5)
    with pytest.raises(ValueError, match="reference"):
        policy_loss(lp, lp, torch.tensor([1.0]), m, beta=0.1)
    # the entropy threshold keeps the top q of the batch's tokens
    assert entropy_threshold([np.array([0.1, 0.2]), np.array([0.3, 0.4, 0.5])], 1.0) is None
    assert entropy_threshold([np.array([0.0, 1.0, 2.0, 3.0, 4.0])], 0.2) == pytest.approx(3.2)


@pytest.mark.parametrize("loss_type,beta,eps", [("grpo", 0.0, 0.2), ("grpo", 0.04, 0.2), ("bnpo", 0.1, 0.1),
                                                ("dr_grpo", 0.02, 0.3)])
def test_policy_loss_equals_trl_grpo_loss(tmp_path, loss_type, beta, eps):
    """TRL's GRPOTrainer._compute_loss on identical inputs (its own forward pass of the sample
    policy; π_old and π_ref perturbed so clipping and KL both act) equals ours within 1e-6."""
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(output_dir=str(tmp_path), num_generations=4, per_device_train_batch_size=4,
                      max_completion_length=6, report_to="none", use_cpu=True, bf16=False, save_strategy="no",
                      disable_tqdm=True, loss_type=loss_type, beta=beta, epsilon=eps, temperature=1.0,
                      gradient_accumulation_steps=1)
    trainer = GRPOTrainer(model=str(POLICY_DIR), reward_funcs=lambda prompts, completions, **k: [0.0] * len(prompts),
                          args=args, train_dataset=Dataset.from_dict({"prompt": ["Q: 1+2="] * 4}))
    model, tok = trainer.model, trainer.processing_class
    model.eval()
    # prompts of one length (no padding inside the prompt), completions of different lengths
    prompts = ["Q: 12+34=", "Q: 56-78=", "Q: 90+12=", "Q: 34-56="]
    completions = ["12+34=46;A:46", "56-78=-22;A", "90+1", "34-56=-22;A:-2"]
    p_ids = [tok(p)["input_ids"] for p in prompts]
    c_ids = [tok(c, add_special_tokens=False)["input_ids"][:6] for c in completions]
    assert len({len(p) for p in p_ids}) == 1
    C = max(map(len, c_ids))
    completion_ids = torch.tensor([c + [tok.pad_token_id] * (C - len(c)) for c in c_ids])
    completion_mask = torch.tensor([[1] * len(c) + [0] * (C - len(c)) for c in c_ids])
    g = torch.Generator().manual_seed(3)
    noise = lambda: (torch.rand(len(c_ids), C, generator=g) - 0.5) * 0.8  # noqa: E731
    with torch.no_grad():
        lp, mask, _ = completion_logps(model, p_ids, c_ids, tok.pad_token_id)
    old, ref = lp + noise(), lp + noise()
    adv = torch.tensor([1.5, -0.5, -1.0, 0.25])
    inputs = {"prompt_ids": torch.tensor(p_ids), "prompt_mask": torch.ones(4, len(p_ids[0]), dtype=torch.long),
              "completion_ids": completion_ids, "completion_mask": completion_mask, "advantages": adv,
              "old_per_token_logps": old, "ref_per_token_logps": ref,
              "num_items_in_batch": completion_mask.sum()}
    theirs = trainer._compute_loss(model, inputs)
    mine, stats = policy_loss(lp, old, adv, mask, eps_low=eps, beta=beta, ref_logps=ref, loss_type=loss_type,
                              max_completion_length=6)
    assert mine.item() == pytest.approx(theirs.item(), abs=1e-6)
    assert 0 < stats["clip_frac"] < 1  # the perturbation put some tokens outside the clip range
    # and our log-probs are TRL's
    trl_lp = trainer._get_per_token_logps_and_entropies(
        model, torch.cat([inputs["prompt_ids"], completion_ids], 1),
        torch.cat([inputs["prompt_mask"], completion_mask], 1), C)[0]
    assert (lp - trl_lp).mul(mask).abs().max().item() < 1e-5


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo"])
def test_length_bucketed_micro_batches_give_the_whole_batch_gradient(loss_type):
    """The CPU path trains on micro-batches of similar lengths; their weighted losses must
    add up to the whole batch's loss and gradient, for every loss averaging."""
    from backends.policy import Policy
    from backends.trainer import backward, length_buckets, micro_batches

    pol = Policy(str(POLICY_DIR))  # a private copy: gradients are written into it
    model, tok = pol.model, pol.tokenizer
    gens = pol.sample(["12+7=", "3*4+1=", "100-55="], n=4, max_new_tokens=30, seed=3)
    p_ids, c_ids = [tok(g.prompt)["input_ids"] for g in gens], [g.token_ids.tolist() for g in gens]
    adv = torch.linspace(-1.5, 1.5, len(gens))
    split = length_buckets([len(p) + len(c) for p, c in zip(p_ids, c_ids)], overhead=0)
    assert len(split) > 1 and sorted(np.concatenate(split).tolist()) == list(range(len(gens)))
    out = []
    for buckets in ([np.arange(len(gens))], split):
        model.zero_grad(set_to_none=True)
        loss, stats = backward(model, micro_batches(p_ids, c_ids, adv, buckets, loss_type), 0, loss_type=loss_type,
                               max_completion_length=30)
        out.append((loss, torch.cat([q.grad.flatten() for q in model.parameters() if q.grad is not None])))
    assert out[1][0] == pytest.approx(out[0][0], abs=1e-6)
    assert torch.allclose(out[1][1], out[0][1], atol=1e-6) and out[0][1].abs().max() > 1e-3


def test_config_is_checked_and_names_every_problem():
    MiniRunConfig().validate()
    with pytest.raises(TrainConfigError) as e:
        MiniRunConfig(group_size=1, learning_rate=2.0, estimator="ppo", prompt_set=" ").validate()
    msg = str(e.value)
    for part in ("group size must be 2-64", "learning rate", "estimator must be one of", "prompt set"):
        assert part in msg
    with pytest.raises(TrainConfigError, match="unknown settings"):
        MiniRunConfig.from_dict({"steps": 3, "warmup": 10})
    from studio.runs.training import task_prompts
    from studio.tasks import get_task

    with pytest.raises(TrainConfigError, match="prompt set must be one of easy, medium, hard, mixed"):
        task_prompts(get_task("arithmetic"), "everything", 4, 0)  # a split name is for stored prompt sets


# ---------------------------------------------------------------------------- real runs

@pytest.fixture()
def store(minirun_store):
    return minirun_store


def _steps_are_whole(store, run_id: str, per_step: int) -> list[int]:
    """Every stored step has all its rollouts, their tokens and rewards, and its metrics."""
    df = store.df("""SELECT ro.train_step, count(*) AS n, sum(ro.n_tokens) AS toks,
                            (SELECT count(*) FROM tokens t JOIN rollouts r2 USING (rollout_id)
                             WHERE r2.run_id = ? AND r2.train_step = ro.train_step) AS stored_toks,
                            count(ro.train_advantage) AS adv
                     FROM rollouts ro WHERE ro.run_id = ? GROUP BY 1 ORDER BY 1""", [run_id, run_id])
    assert (df["n"] == per_step).all() and (df["adv"] == per_step).all()
    assert (df["toks"] == df["stored_toks"]).all()
    steps = df["train_step"].tolist()
    assert steps == list(range(1, len(steps) + 1))
    with_metrics = store.df("SELECT DISTINCT train_step FROM metrics WHERE run_id = ? AND name = 'step_s' "
                            "ORDER BY 1", [run_id])["train_step"].tolist()
    assert with_metrics == steps
    return steps


def test_twenty_steps_raise_accuracy_on_the_training_prompts(store):
    """Seeded: the sample policy's accuracy on its 64 training prompts (8 samples each) rises
    from 0.61 to 0.81 here; the margin asked is 0.08."""
    cfg = MiniRunConfig(steps=20, checkpoint_every=10, seed=0, n_prompts=64)
    run_id = minirun.start(store, cfg, name="learn")
    st = minirun.wait(run_id, 900)
    assert st.status == "done", st.error
    _steps_are_whole(store, run_id, cfg.prompts_per_step * cfg.group_size)
    pool = [{"text": p.text, "gold": p.gold} for p in task_prompts(get_task("arithmetic"), "medium", 64, 0)]
    before = evaluate_job(str(POLICY_DIR), pool, "arithmetic", k=8, seed=1)
    last = minirun.last_checkpoint(store, run_id)
    assert last[0] == 20 and {10, 20} <= set(minirun.checkpoints(store)["step"])
    after = evaluate_job(last[1], pool, "arithmetic", k=8, seed=1)
    assert after["accuracy"] >= before["accuracy"] + 0.08, (before, after)
    # what was optimised is stored: advantages are GRPO's within each group, weights = advantage per token
    from studio.signals.advantages import grpo
    df = store.df("""SELECT ro.rollout_id, ro.group_id, ro.train_advantage, rw.value AS reward
                     FROM rollouts ro JOIN rewards rw USING (rollout_id)
                     WHERE ro.run_id = ? AND ro.train_step = 3 AND rw.component = 'total'""", [run_id])
    assert df["train_advantage"].to_numpy() == pytest.approx(grpo(df["reward"].to_numpy(), df["group_id"].to_numpy()),
                                                               abs=1e-6)
    w = store.df("""SELECT t.train_weight, ro.train_advantage FROM tokens t JOIN rollouts ro USING (rollout_id)
                    WHERE ro.run_id = ? AND ro.train_step = 3""", [run_id])
    assert w["train_weight"].to_numpy() == pytest.approx(w["train_advantage"].to_numpy(), abs=1e-5)
    m = minirun.metrics(store, [run_id])
    assert {"reward_mean", "accuracy", "entropy", "kl", "clip_frac", "grad_norm", "completion_len",
            "all_equal_share", "step_s", "reward/format"} <= set(m["metric"])


def test_sigkill_mid_step_leaves_whole_steps_and_resumes(store):
    cfg = MiniRunConfig(steps=24, checkpoint_every=2, prompts_per_step=4, group_size=4, seed=5)
    run_id = minirun.start(store, cfg, name="to be killed")
    st = minirun.state_of(run_id)
    # a second run on the same policy (this machine: one at a time) is refused while it runs
    with pytest.raises(minirun.MiniRunBusy, match="stop it or wait"):
        minirun.start(store, MiniRunConfig(steps=2))
    deadline = time.time() + 300
    while st.step < 3 and time.time() < deadline and st.live:
        time.sleep(0.05)
    assert st.live and st.step >= 3
    os.kill(st.process.pid, signal.SIGKILL)
    st = minirun.wait(run_id, 60)
    assert st.status == "failed" and "killed by signal 9" in st.error
    row = store.df("SELECT status, error FROM runs WHERE run_id = ?", [run_id]).iloc[0]
    assert row["status"] == "failed" and "resume continues from the last checkpoint" in row["error"]
    steps = _steps_are_whole(store, run_id, 16)
    ckpt = minirun.last_checkpoint(store, run_id)[0]
    assert ckpt >= 2 and ckpt <= max(steps)
    # resume: steps after the checkpoint are dropped and trained again, to the end
    assert minirun.resume(store, run_id) == run_id
    st = minirun.wait(run_id, 600)
    assert st.status == "done", st.error
    assert _steps_are_whole(store, run_id, 16) == list(range(1, 25))
    assert store.scalar("SELECT status FROM runs WHERE run_id = ?", [run_id]) == "done"
    assert minirun.last_checkpoint(store, run_id)[0] == 24
    assert json.loads(store.scalar("SELECT config FROM runs WHERE run_id = ?", [run_id]))["steps"] == 24


def test_overlapped_sampling_is_one_step_behind_and_on_policy_is_not(store):
    """With ``overlap`` the batch of step b is sampled by the weights after step b - 2 in a
    second process: step 2's rollouts come from the starting policy (their stored log-probs
    are its teacher-forced ones) and carry that version; with it off, every step samples
    with the current weights."""
    from backends import load_policy

    small = dict(steps=3, prompts_per_step=2, group_size=4, checkpoint_every=3)
    runs = {}
    for overlap in (True, False):
        rid = minirun.start(store, MiniRunConfig(overlap=overlap, **small), name=f"overlap {overlap}")
        st = minirun.wait(rid, 300)
        assert st.status == "done", st.error
        runs[overlap] = rid
    lag = {o: minirun.metrics(store, [r]).query("metric == 'staleness'")["value"].tolist() for o, r in runs.items()}
    assert lag == {True: [0.0, 1.0, 1.0], False: [0.0, 0.0, 0.0]}
    versions = store.df("SELECT DISTINCT train_step, policy_version FROM rollouts WHERE run_id = ? ORDER BY 1",
                        [runs[True]])["policy_version"].tolist()
    assert versions == [f"{runs[True]}@0", f"{runs[True]}@0", f"{runs[True]}@1"]
    df = store.df("""SELECT ro.rollout_id, p.text AS prompt, list(t.token_id ORDER BY t.pos) AS ids,
                            list(t.logprob ORDER BY t.pos) AS lp
                     FROM rollouts ro JOIN prompts p USING (prompt_id) JOIN tokens t USING (rollout_id)
                     WHERE ro.run_id = ? AND ro.train_step = 2 GROUP BY ALL""", [runs[True]])
    scored = load_policy(POLICY_DIR).score(df["prompt"].tolist(), [list(map(int, x)) for x in df["ids"]])
    for g, lp in zip(scored, df["lp"]):
        assert np.allclose(g.logprobs, np.asarray(lp, np.float32), atol=1e-4)


def test_the_cli_trains_and_names_bad_settings(tmp_path, capsys):
    db = str(tmp_path / "cli.duckdb")
    assert minirun_cli.main(["--db", db]) == 2  # like every command, it refuses a store that is not there
    assert "no studio store at" in capsys.readouterr().err and not os.path.exists(db)
    Store.open(db).close()
    assert minirun_cli.main(["--db", db, "--group-size", "1"]) == 2
    assert "error: group size must be 2-64, got 1" in capsys.readouterr().err
    assert minirun_cli.main(["--db", db, "--steps", "2", "--prompts-per-step", "2", "--group-size", "4",
                             "--name", "from the cli"]) == 0
    out = capsys.readouterr().out
    assert "step 1/2: reward" in out and "step 2/2: reward" in out and ": done" in out
    s = Store.open(db)
    assert s.scalar("SELECT count(*) FROM rollouts WHERE run_id IN (SELECT run_id FROM runs WHERE name = 'from the cli')") == 16
    s.close()


ODD_ONLY = """def reward(prompt, completion, gold, steps, **ctx):
    if len(completion) % 2 == 0:
        raise ValueError(f"even length {len(completion)}")
    return 1.0
"""


def test_a_reward_model_or_a_failing_rule_is_the_training_reward(seeded_store):
    """A reward model's version trains on its score (stored values = direct model calls, the
    task's accuracy still tracked); a user rule that raises on some completions stores why."""
    from backends.reward_model import load_reward_model
    from sample_data import REWARD_MODEL_DIR
    from studio.rewards import reward_models, rules

    rm = reward_models.score_with_reward_model_sync(seeded_store, REWARD_MODEL_DIR).rule_version_id
    small = dict(steps=2, prompts_per_step=2, group_size=4, checkpoint_every=2)
    run_id = minirun.start(seeded_store, MiniRunConfig(rule_version=rm, **small), name="rm")
    st = minirun.wait(run_id, 300)
    assert st.status == "done", st.error
    df = seeded_store.df("""SELECT p.text AS prompt, ro.text AS completion, rw.value FROM rollouts ro
                            JOIN prompts p USING (prompt_id) JOIN rewards rw USING (rollout_id)
                            WHERE ro.run_id = ? AND rw.rule_version_id = ? AND rw.component = 'total'""", [run_id, rm])
    assert len(df) == 16
    direct = load_reward_model(REWARD_MODEL_DIR).score_rollouts(df["prompt"].tolist(), df["completion"].tolist())
    assert df["value"].to_numpy() == pytest.approx(direct, abs=1e-5)
    assert {"accuracy", "reward_mean"} <= set(minirun.metrics(seeded_store, [run_id])["metric"])

    odd = rules.apply_rule_sync(seeded_store, ODD_ONLY, "odd only").rule_version_id
    run_id = minirun.start(seeded_store, MiniRunConfig(rule_version=odd, **small), name="odd")
    st = minirun.wait(run_id, 300)
    assert st.status == "done", st.error
    rw = seeded_store.df("""SELECT ro.text, rw.value, rw.error FROM rollouts ro JOIN rewards rw USING (rollout_id)
                            WHERE ro.run_id = ? AND rw.rule_version_id = ?""", [run_id, odd])
    even = rw["text"].str.len() % 2 == 0
    assert len(rw) == 16 and even.any() and (~even).any()
    assert rw.loc[even, "value"].isna().all() and (rw.loc[~even, "value"] == 1.0).all()
    for text, err in zip(rw.loc[even, "text"], rw.loc[even, "error"]):
        assert f"ValueError: even length {len(text)}" in err


def test_lora_trains_adapters_and_saves_a_merged_policy(store, tmp_path):
    from safetensors.torch import load_file

    from backends import load_policy

    cfg = MiniRunConfig(steps=3, prompts_per_step=2, group_size=4, lora=True, lora_r=4, checkpoint_every=3,
                        learning_rate=5e-3)
    run_id = minirun.start(store, cfg, name="lora")
    st = minirun.wait(run_id, 300)
    assert st.status == "done", st.error
    step, path = minirun.last_checkpoint(store, run_id)
    assert step == 3
    names = {p.name for p in __import__("pathlib").Path(path).iterdir()}
    assert "model.safetensors" in names and "adapter_config.json" not in names  # a plain policy folder
    base, tuned = load_file(str(POLICY_DIR / "model.safetensors")), load_file(f"{path}/model.safetensors")
    assert base.keys() == tuned.keys()
    changed = [k for k in base if not torch.equal(base[k], tuned[k])]
    assert changed and all(k.endswith("weight") for k in changed)  # LoRA merges into the linear weights only
    assert not any("ln" in k or "wte" in k or "wpe" in k for k in changed)  # norms and embeddings stay frozen
    gens = load_policy(path).sample(["1+2="], n=2, max_new_tokens=8)  # usable as a policy everywhere
    assert len(gens) == 2


def test_rows_sharing_a_prompt_share_its_forward_pass_with_the_same_log_probs_and_gradients():
    """A group's prompt runs once and its KV cache (with gradients) serves every completion:
    log-probs and gradients equal the per-row forward pass's, on both sample policies."""
    import torch

    from backends.policy import Policy
    from backends.trainer import _whole_logits, completion_logps
    from sample_data import CHAT_POLICY_DIR

    for folder, prompts in ((POLICY_DIR, ["Q: 12+7=", "Q: 3-1="]),
                            (CHAT_POLICY_DIR, ["<|im_start|>user\nTom has 3 apples.<|im_end|>\n<|im_start|>assistant\n",
                                               "<|im_start|>user\nHow many?<|im_end|>\n<|im_start|>assistant\n"])):
        model, tok = (pol := Policy(str(folder))).model, pol.tokenizer
        gen = torch.Generator().manual_seed(0)
        p_ids = [tok(prompts[i % 2])["input_ids"] for i in range(8)]
        c_ids = [torch.randint(3, 90, (int(torch.randint(1, 12, (), generator=gen)),), generator=gen).tolist()
                 for _ in range(8)]
        w = torch.randn(8, 12, generator=gen)
        grads = []
        for shared in (True, False):
            model.zero_grad()
            if shared:
                lp, mask, _ = completion_logps(model, p_ids, c_ids, tok.pad_token_id or 0)
            else:
                logits, comp, mask = _whole_logits(model, p_ids, c_ids, lp.shape[1], tok.pad_token_id or 0, "cpu")
                lp = torch.log_softmax(logits, -1).gather(-1, comp[..., None]).squeeze(-1)
            (lp * mask * w[:, :lp.shape[1]]).sum().backward()
            grads.append(([p.grad.clone() for p in model.parameters()], (lp * mask).detach()))
        (g_shared, lp_shared), (g_whole, lp_whole) = grads
        assert torch.allclose(lp_shared, lp_whole, atol=1e-4)
        assert all(torch.allclose(a, b, atol=1e-3, rtol=1e-3) for a, b in zip(g_shared, g_whole, strict=True))


# ---------------------------------------------------------------------------- defaults a user relies on

def test_the_default_pool_brings_every_prompt_back_at_several_steps():
    """The Timeline tab follows a prompt across the steps that drew it: with the default
    settings every prompt of the pool is drawn at 3 steps or more, and never twice in a step."""
    from studio.runs.training.loop import prompt_order

    cfg = MiniRunConfig()
    order = prompt_order(cfg.n_prompts, cfg)[:cfg.steps * cfg.prompts_per_step]
    steps_of = {}
    for i, p in enumerate(order):
        steps_of.setdefault(int(p), []).append(i // cfg.prompts_per_step + 1)
    assert set(steps_of) == set(range(cfg.n_prompts))  # every prompt of the pool is drawn
    assert min(len(set(s)) for s in steps_of.values()) >= 3
    assert all(len(s) == len(set(s)) for s in steps_of.values())
    # a pass over the pool ends before any prompt comes back
    assert sorted(order[:cfg.n_prompts]) == list(range(cfg.n_prompts))


def test_sampling_and_a_training_forward_raise_no_deprecation_warning():
    """The KV cache is passed and read under the installed transformers' current name, so a
    Generate or a mini-run step prints no FutureWarning into the studio's console."""
    import warnings

    from backends import load_policy

    policy = load_policy(POLICY_DIR)
    tok = policy.tokenizer
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gens = policy.sample(["Q: 12+34=", "Q: 5*6="], n=2, max_new_tokens=6, seed=0)
        p_ids = [tok(g.prompt)["input_ids"] for g in gens]  # rows share prompts: the shared-prefill path
        completion_logps(policy.model, p_ids, [list(g.token_ids) or [0] for g in gens], tok.pad_token_id or 0)
    assert not [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
