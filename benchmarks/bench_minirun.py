"""Mini-runs: seconds per training step against TRL's ``GRPOTrainer``, and what 5 minutes teach.

Run: ``python benchmarks/bench_minirun.py`` (about 7-8 minutes on a 2-core CPU, 5 of them the
training phase; ``--train-minutes 1`` for a quick check).

Two figures, both on the sample policy (``sample_data/policy``, a ~0.8M-parameter char-level
GPT-2) and the arithmetic task, in one process run.

``minirun_step_s`` (baseline ``trl_grpo_step_s``)
    The same GRPO step on both sides: 8 prompts per step from the same pool (the mini-run's
    default ``medium`` pool of 4096 training prompts, ``studio.runs.training.task_prompts``), a
    group of 8 completions each (64 per step), at most 40 new tokens, temperature 1,
    top-p 1, no top-k, AdamW at a constant learning rate of 2e-4 (no weight decay, gradient
    norm clipped at 1), β = 0 (no KL, no reference model), ε = 0.2, one update per batch
    (μ = 1), GRPO advantages ((r - mean_g) / (std_g + 1e-4)) and the ``grpo`` loss
    averaging (per completion, then over completions); every step samples a fresh batch.
    The reward is the arithmetic task's built-in rule total on both sides
    (``studio.rewards.DEFAULT_RULES['arithmetic']``: accuracy + 0.1 format + 0.25 steps).

    Ours: a real mini-run (``studio.runs.minirun.start`` with ``MiniRunConfig(steps=N)``, the
    other settings its defaults, which are the ones above) on a temporary store
    (``Store.open(tmp/'s.duckdb')``); with the default ``overlap`` a second process samples
    the next batch with the studio's sampler (per-token log-probs, entropies, top-5) while
    the worker scores with ``RewardFn`` (``score_frame``) and takes the step on the last one
    (one step off-policy, π_old = the sampler's log-probs: a different loop from TRL's, which
    is strictly on-policy; the timing prints both), and the owner writes every step
    (rollouts, tokens, rewards, metrics) in one transaction while the next step runs. The
    same run with ``overlap=False`` (strictly on-policy, as TRL) is timed too, for people.
    The per-step time is the run's stored ``step_s`` metric (the worker's clock from the
    start of sampling to the end of the optimiser step and metrics; the DuckDB writes run in
    the owner process alongside).
    For people, the wall time between consecutive stored steps is shown too.

    TRL: ``trl.GRPOTrainer`` on the same policy folder with ``GRPOConfig(num_generations=8,
    per_device_train_batch_size=64, max_completion_length=40, learning_rate=2e-4,
    lr_scheduler_type='constant', beta=0.0, loss_type='grpo', temperature=1.0, top_p=1.0,
    gradient_checkpointing=False, use_cpu=True)`` (the rest TRL's defaults: ε = 0.2, μ = 1,
    ``scale_rewards='group'``, ``max_grad_norm=1``). Its reward function scores each
    completion with the same rule (``Rule.score_detailed(...)['total']``), which is what a
    TRL user would write. One step is timed with a ``TrainerCallback`` from
    ``on_step_begin`` to ``on_step_end``: it includes generation (``generate``), scoring,
    the loss, backward and the optimiser step, as ours does. ``gradient_checkpointing`` is
    off because ours does not recompute activations (TRL's default turns it on).

    ``--rounds`` rounds (default 3) of ``--timing-steps`` steps (default 12: a noisy shared
    machine needs more than a handful per round) on each side,
    the order alternating (ours first in round 1, TRL first in round 2, ...); each round is
    a fresh run from the sample policy (a fresh mini-run process; a fresh GRPOTrainer), its
    first step (warm-up) is skipped, and the figure is the median of ours over the
    remaining steps of all rounds, the baseline TRL's median likewise; ratio = ours / TRL.
    The issue's target, our loop at least 1.5x faster, is a ratio of 0.667 or less. Both
    sides use torch's default thread count (printed), one process training at a time.

``minirun_accuracy_gain_points`` (baseline ``accuracy_before_points``)
    The sample policy's final-answer accuracy on the 200 held-out prompts
    (``studio.runs.training.heldout_prompts``, the policy build's evaluation set, disjoint from
    the training pool by seed; textual overlaps are counted and printed) before and after a
    mini-run with the default ``MiniRunConfig`` (GRPO, lr 2e-4, ``medium`` pool of 4096
    prompts, 8 x 8 per step, overlapped sampling, checkpoints every 10 steps) trained for ``--train-minutes``
    (default 5) of wall time on this CPU, counted from ``minirun.start``: the run is started
    with more steps than it can take, ``minirun.stop`` is called when the time is up, the
    worker finishes the step in flight and saves a checkpoint, and that last checkpoint is
    the "after" policy. Both policies are evaluated with ``studio.runs.training.evaluate_job``
    (in this process, the same ``--eval-seed``): k = ``--eval-k`` (default 4) samples per
    prompt at temperature 1 and one greedy completion. The figure is
    (after - before) x 100 on the MEAN SAMPLED ACCURACY at temperature 1 (k = 4), in
    points; ``baseline_value`` is the accuracy before, in points, and ``ratio`` is null (a
    gain has no baseline to divide by). Greedy accuracy and pass@k are printed for people.
    The issue's target is +10 points or more.

For people, the script also splits one of our steps into its parts, in this process with
the same functions the worker calls (sampling, ``RewardFn``, the π_old forward pass, the
forward pass with gradients, backward, optimiser), and TRL's step into ``generate`` +
scoring (``_generate_and_score_completions``) and the rest; ``--no-breakdown`` skips it.

Options: --timing-steps, --rounds, --train-minutes, --eval-k, --eval-seed, --heldout,
--pool (the learning run's training pool, default the config's 4096), --no-breakdown, --smoke
(one round of 2 steps, ours with overlap and TRL at the worker's thread count only; the
learning figure from that round's end checkpoint instead of a timed run, on 8 held-out
prompts with k = 1; a breakdown of one step).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: import the project's packages

# the policy is a local folder: never touch the Hub; no progress bars (inherited by the mini-run workers)
for _k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HUB_DISABLE_PROGRESS_BARS"):
    os.environ.setdefault(_k, "1")
os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")  # transformers 5 deprecation notices, in workers too

# Light imports only at the top: the mini-run's worker is started with the spawn method, which
# imports this module again in the child; torch and TRL are imported inside the functions.
from benchmarks import smoke  # noqa: E402

TARGET_SPEEDUP = 1.5
TARGET_GAIN_POINTS = 10.0


class World:
    """What differs between the two sample worlds: policy, task, prompts and completion length.

    ``arithmetic``: the char-level sample policy on the arithmetic task (text prompts).
    ``chat``: the realistic world's chat policy (a tiny Qwen2 with a ChatML template) on the
    word-problem prompt set a store seeded with ``sample_data/chat_rollouts`` holds (its
    ``train`` split to train on, its ``test`` split held out); prompts go through the chat
    template on both sides (TRL gets them conversational, as its users give them), the
    reward is the free-text rule ``math`` (math-verify on the boxed answer, + 0.1 format).
    """

    def __init__(self, name: str):
        from sample_data import CHAT_POLICY_DIR, CHAT_ROLLOUTS_DIR, POLICY_DIR, WORDPROBLEMS_TASK

        self.name, self.chat = name, name == "chat"
        self.policy = CHAT_POLICY_DIR if self.chat else POLICY_DIR
        self.task = WORDPROBLEMS_TASK if self.chat else "arithmetic"
        self.seed_dir = CHAT_ROLLOUTS_DIR if self.chat else None
        self.suffix = "_chat" if self.chat else ""
        self.max_new_tokens = 96 if self.chat else None  # the config's default (40) for arithmetic

    def config(self, **kw):
        from studio.runs.training import MiniRunConfig

        extra = {"policy": str(self.policy), "prompt_set": "train", "max_new_tokens": self.max_new_tokens} \
            if self.chat else {}
        return MiniRunConfig(**(extra | kw))

    def pool(self, store, n: int, seed: int) -> list:
        from studio.queries.prompts import draw_prompts
        from studio.runs.training import task_prompts, train_split
        from studio.tasks import get_task

        task = get_task(self.task)
        if task.generates:
            return task_prompts(task, self.config().prompt_set, n, seed)
        return draw_prompts(store, self.task, n, seed=seed, split=train_split(task, "train"))

    def heldout(self, store, n: int) -> list:
        from studio.queries.prompts import draw_prompts
        from studio.runs.training import heldout_prompts, heldout_split
        from studio.tasks import get_task

        task = get_task(self.task)
        if task.generates:
            return heldout_prompts(task, n)
        return draw_prompts(store, self.task, n, seed=0, split=heldout_split(task))


W: World | None = None  # set by main()


def _task():
    from studio.tasks import get_task

    return get_task(W.task)


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min)"


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _fmt(xs: list[float]) -> str:
    return f"min {min(xs):.3f}, max {max(xs):.3f}, n {len(xs)}" if xs else "n 0"


def _pivot(store, run_id: str):
    from studio.runs import minirun

    m = minirun.metrics(store, [run_id])
    return m.pivot_table(index="train_step", columns="metric", values="value").sort_index()


# --------------------------------------------------------------------------------------
# ours: a real mini-run on the store
# --------------------------------------------------------------------------------------
def _watch(st, until: float | None = None) -> list[tuple[int, float]]:
    """Poll a run until it ends (or ``until`` passes); (step, time it was stored) per step."""
    seen, last = [], st.step
    while st.live and (until is None or time.perf_counter() < until):
        if st.step != last:
            last = st.step
            seen.append((last, time.perf_counter()))
        time.sleep(0.01)
    return seen


def _intervals(seen: list[tuple[int, float]]) -> list[float]:
    """Wall time between consecutive stored steps (the first step's arrival, with the
    process start in it, is not an interval)."""
    return [t1 - t0 for (s0, t0), (s1, t1) in itertools.pairwise(seen) if s1 == s0 + 1]


def ours_round(store, steps: int, seed: int, overlap: bool = True) -> dict:
    from studio.runs import minirun

    cfg = W.config(steps=steps, checkpoint_every=100_000, seed=seed, overlap=overlap)  # the rest: defaults
    t0 = time.perf_counter()
    run_id = minirun.start(store, cfg, name=f"bench timing round seed {seed}", task=W.task)
    st = minirun.state_of(run_id)
    seen = _watch(st)
    st = minirun.wait(run_id, 600)
    if st.process is not None:
        st.process.join(timeout=30)  # the next measurement starts with the worker gone
    wall = time.perf_counter() - t0
    if st.status != "done":
        raise SystemExit(f"timing mini-run ended {st.status}: {st.error}")
    p = _pivot(store, run_id)
    return {"run_id": run_id, "step_s": p["step_s"].tolist(), "sample_s": p["sample_s"].tolist(),
            "completion_len": p["completion_len"].tolist(), "stored_interval_s": _intervals(seen), "wall_s": wall,
            "device": st.device}


# --------------------------------------------------------------------------------------
# TRL: GRPOTrainer on the same policy, settings and reward
# --------------------------------------------------------------------------------------
def trl_reward(prompts_pool):
    from studio.rewards import default_rule
    from studio.tasks import get_task

    task, rule = get_task(W.task), default_rule(W.task)
    by_text = {p.text: p for p in prompts_pool}

    def content(x):  # a conversational prompt or completion: its last message's text
        return x[-1]["content"] if isinstance(x, list) else x

    def arithmetic_total(prompts, completions, **kwargs):
        out = []
        for p, c in zip(prompts, completions, strict=True):
            v = rule.score_detailed(task, by_text[content(p)], content(c))[0]["total"]
            out.append(None if v is None else float(v))  # None: TRL's "no reward" (ours: 0 in the advantage)
        return out

    return arithmetic_total


def trl_round(steps: int, seed: int, prompts_pool, out_dir: str, threads: int) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    d = W.config()

    class StepClock(TrainerCallback):
        def __init__(self):
            self.times, self.t = [], None

        def on_step_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self.t)

    args = GRPOConfig(
        output_dir=out_dir, num_generations=d.group_size, per_device_train_batch_size=d.group_size * d.prompts_per_step,
        gradient_accumulation_steps=1, max_completion_length=d.max_new_tokens, max_steps=steps,
        learning_rate=d.learning_rate, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=1.0, beta=d.kl_beta, epsilon=d.clip_eps, num_iterations=d.iterations, loss_type=d.loss_type,
        scale_rewards="group", temperature=d.temperature, top_p=1.0, top_entropy_quantile=d.entropy_q,
        gradient_checkpointing=False, logging_steps=1, report_to="none", use_cpu=True, bf16=False, save_strategy="no",
        disable_tqdm=True, seed=seed)
    clock = StepClock()
    t0 = time.perf_counter()
    task = _task()
    prompts = [task.messages(p) if W.chat else p.text for p in prompts_pool]  # TRL templates conversational prompts
    trainer = GRPOTrainer(model=str(W.policy), reward_funcs=trl_reward(prompts_pool), args=args,
                          train_dataset=Dataset.from_dict({"prompt": prompts}), callbacks=[clock])
    trainer.remove_callback(PrinterCallback)  # no per-step log dicts on stdout
    gen_s = []
    gen = trainer._generate_and_score_completions

    def timed_gen(inputs):
        t = time.perf_counter()
        out = gen(inputs)
        gen_s.append(time.perf_counter() - t)
        return out

    trainer._generate_and_score_completions = timed_gen
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        trainer.train()
    finally:
        torch.set_num_threads(before)
    wall = time.perf_counter() - t0
    logs = [h for h in trainer.state.log_history if "completions/mean_length" in h]
    settings = {k: getattr(args, k) for k in (
        "num_generations", "per_device_train_batch_size", "max_completion_length", "learning_rate", "beta", "epsilon",
        "num_iterations", "loss_type", "scale_rewards", "temperature", "top_p", "top_k", "max_grad_norm",
        "gradient_checkpointing", "steps_per_generation", "generation_batch_size")}
    settings["optim"] = str(getattr(args.optim, "value", args.optim))
    del trainer
    return {"step_s": clock.times, "gen_score_s": gen_s,
            "completion_len": [float(h["completions/mean_length"]) for h in logs], "wall_s": wall, "settings": settings}


# --------------------------------------------------------------------------------------
# for people: where one step's time goes
# --------------------------------------------------------------------------------------
def breakdown(prompts_pool, steps: int = 6) -> dict[str, float]:
    """One of our steps, part by part, with the worker's own functions (in this process)."""
    import numpy as np
    import torch

    from backends.chat import render
    from backends.policy import Policy
    from backends.trainer import backward, grad_norm, length_buckets, micro_batches
    from studio.rewards import default_rule
    from studio.runs.training import RewardFn
    from studio.runs.training.loop import _advantages

    d = W.config()
    task, rule = _task(), default_rule(W.task)
    policy = Policy(str(W.policy))  # a fresh copy (load_policy caches): the updates stay here
    model, tok = policy.model, policy.tokenizer
    seen = {p.text: render(tok, task.policy_input(p)) for p in prompts_pool}  # what the policy reads
    model.eval()
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=d.learning_rate, weight_decay=0.0)
    parts: dict[str, list[float]] = {}

    def lap(name: str, t: float) -> float:
        now = time.perf_counter()
        parts.setdefault(name, []).append(now - t)
        return now

    for step in range(steps + 1):
        lo = (step * d.prompts_per_step) % len(prompts_pool)
        picked = prompts_pool[lo:lo + d.prompts_per_step]
        t0 = t = time.perf_counter()
        gens = policy.sample([seen[p.text] for p in picked], n=d.group_size, temperature=d.temperature, top_p=1.0,
                             max_new_tokens=d.max_new_tokens, seed=step, top_k_stats=5)
        t = lap("sample (64 x <=40 tokens, with per-token stats)", t)
        rewards, _, _ = RewardFn({"kind": "builtin"}, task)([picked[g.prompt_index] for g in gens],
                                                            [g.text for g in gens])
        t = lap("reward: RewardFn (score_frame) as the worker calls it", t)
        for g in gens:
            rule.score_detailed(task, picked[g.prompt_index], g.text)
        t = lap("  of which the rule's scoring itself (score_detailed x 64)", t)
        total = np.array([np.nan if r.get("total") is None else r["total"] for r in rewards])
        groups = np.array([g.prompt_index for g in gens])
        adv = torch.tensor(_advantages(d.estimator, total, groups), dtype=torch.float32)
        p_ids = [tok(seen[picked[g.prompt_index].text])["input_ids"] for g in gens]
        c_ids = [g.token_ids.tolist() for g in gens]
        buckets = length_buckets([len(p) + len(c) for p, c in zip(p_ids, c_ids, strict=True)])
        batches = micro_batches(p_ids, c_ids, adv, buckets, d.loss_type)
        t = lap("advantages, tokenising prompts, length buckets", t)
        opt.zero_grad(set_to_none=True)
        backward(model, batches, pad, eps_low=d.clip_eps, loss_type=d.loss_type, max_completion_length=d.max_new_tokens)
        t = lap("forward + backward over the length-bucketed micro-batches", t)
        grad_norm(model)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        t = lap("grad norm, clip, AdamW step", t)
        parts.setdefault("sum of the parts", []).append(time.perf_counter() - t0)
    return {k: _med(v[1:]) for k, v in parts.items()}  # the first step warms up


# --------------------------------------------------------------------------------------
# learning: 5 minutes of mini-run, held-out accuracy before and after
# --------------------------------------------------------------------------------------
def evaluate(policy_path: str, heldout: list[dict], k: int, seed: int) -> tuple[dict, float]:
    from studio.runs.training import evaluate_job

    t = time.perf_counter()
    res = evaluate_job(policy_path, heldout, _task().spec, k=k, seed=seed,
                       max_new_tokens=W.config().max_new_tokens)
    return res, time.perf_counter() - t


def learning_run(store, minutes: float, n_prompts: int | None = None) -> dict:
    from studio.runs import minirun

    cfg = W.config(steps=100_000)  # the defaults; more steps than the budget allows: stopped on time
    if n_prompts:
        cfg.n_prompts = n_prompts
    t0 = time.perf_counter()
    run_id = minirun.start(store, cfg, name="bench learning", task=W.task)
    st = minirun.state_of(run_id)
    seen = _watch(st, until=t0 + minutes * 60)
    t_stop = time.perf_counter()
    if not st.live:
        raise SystemExit(f"the learning mini-run ended early: {st.status}: {st.error}")
    minirun.stop(run_id)
    seen += _watch(st)
    st = minirun.wait(run_id, 600)
    if st.process is not None:
        st.process.join(timeout=30)
    t_end = time.perf_counter()
    if st.status != "stopped":
        raise SystemExit(f"the learning mini-run ended {st.status}: {st.error}")
    last = minirun.last_checkpoint(store, run_id)
    if last is None:
        raise SystemExit("the learning mini-run left no checkpoint")
    return {"run_id": run_id, "pivot": _pivot(store, run_id), "checkpoint": last, "train_s": t_stop - t0,
            "stop_s": t_end - t_stop, "stored_interval_s": _intervals(seen), "device": st.device}


def timing_run_as_learning(store, res: dict) -> dict:
    """A timing round's run in :func:`learning_run`'s shape (smoke: its end checkpoint is the "after")."""
    from studio.runs import minirun

    last = minirun.last_checkpoint(store, res["run_id"])
    if last is None:
        raise SystemExit("the timing mini-run left no checkpoint")
    return {"run_id": res["run_id"], "pivot": _pivot(store, res["run_id"]), "checkpoint": last,
            "train_s": res["wall_s"], "stop_s": 0.0, "stored_interval_s": res["stored_interval_s"],
            "device": res["device"]}


# --------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timing-steps", type=int, default=12, help="steps per timing round on each side (>= 2; the "
                                                                "first of each round is skipped as warm-up)")
    ap.add_argument("--rounds", type=int, default=3, help="timing rounds (the order alternates)")
    ap.add_argument("--train-minutes", type=float, default=5.0, help="wall-clock minutes of the learning mini-run")
    ap.add_argument("--eval-k", type=int, default=4, help="samples per held-out prompt at temperature 1")
    ap.add_argument("--eval-seed", type=int, default=1, help="sampling seed of both evaluations")
    ap.add_argument("--heldout", type=int, default=200, help="held-out prompts")
    ap.add_argument("--pool", type=int, default=None,
                    help="training pool of the learning run (default: MiniRunConfig's n_prompts, 64)")
    ap.add_argument("--no-breakdown", action="store_true", help="skip the per-part split of one step")
    ap.add_argument("--world", choices=("arithmetic", "chat"), default="arithmetic",
                    help="which sample world: the arithmetic one (figures minirun_step_s, minirun_accuracy_gain_points) "
                         "or the realistic chat one (the same figures with _chat)")
    args = smoke.parse_args(ap, timing_steps=2, rounds=1, heldout=8, eval_k=1)
    global W
    W = World(args.world)
    if args.timing_steps < 2 or args.rounds < 1:
        raise SystemExit("--timing-steps must be >= 2 and --rounds >= 1")
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    started = time.perf_counter()
    load0 = os.getloadavg()

    import torch
    t = time.perf_counter()
    import transformers
    import trl  # imported once, before any timing

    from backends.device import cpu_threads
    from studio.store import Store

    d = W.config()
    tmp_dir = tempfile.TemporaryDirectory(prefix="bench-minirun-")
    store = Store.open(Path(tmp_dir.name) / "s.duckdb", seed_dir=W.seed_dir)  # the chat world: its prompt set
    pool = W.pool(store, d.n_prompts, d.seed)
    print(f"torch {torch.__version__} ({torch.get_num_threads()} threads, os.cpu_count() = {os.cpu_count()}), "
          f"transformers {transformers.__version__}, trl {trl.__version__} (imports {time.perf_counter() - t:.1f} s); "
          f"{_load()}", flush=True)
    print(f"step settings on both sides: {d.prompts_per_step} prompts x group {d.group_size} = "
          f"{d.prompts_per_step * d.group_size} completions, <= {d.max_new_tokens} new tokens, temperature "
          f"{d.temperature}, lr {d.learning_rate:g} (constant), beta {d.kl_beta}, clip eps {d.clip_eps}, "
          f"mu {d.iterations}, loss '{d.loss_type}', estimator '{d.estimator}', reward: the '{_task().name}' task's built-in rule total; "
          f"training pool: '{d.prompt_set}', {len(pool)} prompts", flush=True)

    ours_r, onpolicy_r, trl_r = [], [], []
    with tmp_dir as tmp:
        try:
            # ---------------------------------------------------------------- step time
            print(f"\ntiming: {args.rounds} rounds x {args.timing_steps} steps on each side, alternating", flush=True)
            trl_threads = sorted({torch.get_num_threads(), cpu_threads()}, reverse=True)
            if args.smoke:  # the worker's thread count only
                trl_threads = [cpu_threads()]
            trl_by: dict[int, list[dict]] = {n: [] for n in trl_threads}
            for r in range(args.rounds):
                sides = ["ours", *([] if args.smoke else ["onpolicy"]), *(f"trl{n}" for n in trl_threads)]
                order = sides if r % 2 == 0 else sides[::-1]
                for side in order:
                    if side == "ours":
                        res = ours_round(store, args.timing_steps, seed=r)
                        ours_r.append(res)
                    elif side == "onpolicy":
                        res = ours_round(store, args.timing_steps, seed=r, overlap=False)
                        onpolicy_r.append(res)
                    else:
                        n = int(side[3:])
                        res = trl_round(args.timing_steps, seed=r, prompts_pool=pool,
                                        out_dir=str(Path(tmp) / f"{side}-{r}"), threads=n)
                        trl_by[n].append(res)
                    label = {"ours": "ours", "onpolicy": "ours on-pol."}.get(side, f"TRL ({side[3:]} thr)")
                    print(f"  round {r + 1} {label:>12}: steps " + " ".join(f"{x:.3f}" for x in res["step_s"])
                          + f" s (first skipped); {res['wall_s']:.1f} s with start-up; {_load()}", flush=True)
            ours_steps = [x for res in ours_r for x in res["step_s"][1:]]
            onpolicy_s = _med([x for res in onpolicy_r for x in res["step_s"][1:]])
            trl_meds = {n: _med([x for res in rs for x in res["step_s"][1:]]) for n, rs in trl_by.items()}
            best_threads = min(trl_meds, key=trl_meds.get)  # the baseline: TRL at its faster thread count
            trl_r = trl_by[best_threads]
            print("  TRL median step by thread count: "
                  + ", ".join(f"{n} threads {v:.3f} s" for n, v in trl_meds.items())
                  + f"; the baseline is the faster ({best_threads})", flush=True)
            trl_steps = [x for res in trl_r for x in res["step_s"][1:]]
            ours_s, trl_s = _med(ours_steps), _med(trl_steps)
            ours_sample = _med([x for res in ours_r for x in res["sample_s"][1:]])
            ours_wall = _med([x for res in ours_r for x in res["stored_interval_s"]])
            trl_gen = _med([x for res in trl_r for x in res["gen_score_s"][1:]])
            ours_len = _med([x for res in ours_r for x in res["completion_len"]])
            trl_len = _med([x for res in trl_r for x in res["completion_len"]])
            trl_settings = trl_r[0]["settings"]
            print(f"  TRL GRPOConfig as run: {trl_settings}", flush=True)

            parts, n_parts = None, 1 if args.smoke else 6
            if not args.no_breakdown:
                print(f"\nbreakdown of one of our steps (in this process at the worker's {cpu_threads()} thread(s), "
                      f"median of {n_parts} after a warm-up) ...", flush=True)
                before_threads = torch.get_num_threads()
                torch.set_num_threads(cpu_threads())
                try:
                    parts = breakdown(pool, steps=n_parts)
                finally:
                    torch.set_num_threads(before_threads)

            # ---------------------------------------------------------------- learning
            heldout = [p.to_json() for p in W.heldout(store, args.heldout)]
            learn_pool = W.pool(store, args.pool or d.n_prompts, d.seed)
            overlap = len({h["text"] for h in heldout} & {p.text for p in learn_pool})
            print(f"\nlearning: evaluating the sample policy on {len(heldout)} held-out prompts "
                  f"(k = {args.eval_k} at temperature 1 + greedy, seed {args.eval_seed}) ...", flush=True)
            before, ev_before_s = evaluate(str(W.policy), heldout, args.eval_k, args.eval_seed)
            print(f"  before: sampled {before['accuracy']:.3f}, greedy {before['greedy_accuracy']:.3f} "
                  f"({ev_before_s:.1f} s); {_load()}", flush=True)
            what = "a default mini-run" if not args.pool else f"a default mini-run on a pool of {args.pool} prompts"
            if args.smoke:
                print("  smoke: the first timing round's end checkpoint stands in for the learning run", flush=True)
                lr_res = timing_run_as_learning(store, ours_r[0])
            else:
                print(f"  training {what} for {args.train_minutes:g} min ...", flush=True)
                lr_res = learning_run(store, args.train_minutes, args.pool)
            step_k, ckpt = lr_res["checkpoint"]
            after, ev_after_s = evaluate(ckpt, heldout, args.eval_k, args.eval_seed)
            print(f"  after {step_k} steps: sampled {after['accuracy']:.3f}, greedy {after['greedy_accuracy']:.3f} "
                  f"({ev_after_s:.1f} s); {_load()}", flush=True)
            curve = lr_res["pivot"]
        finally:
            store.close()

    # ---------------------------------------------------------------- report
    ratio = ours_s / trl_s
    w = 60
    print()
    print(f"seconds per GRPO step, sample policy, {d.prompts_per_step} x {d.group_size} completions, "
          f"<= {d.max_new_tokens} tokens (medians; {len(ours_steps)} of ours, {len(trl_steps)} of TRL's):")
    print(f"  {'':<{w}} {'ours s':>8} {'TRL s':>8} {'ratio':>7}")
    print(f"  {'one step (ours: stored step_s; TRL: step callback)':<{w}} {ours_s:>8.3f} {trl_s:>8.3f} {ratio:>7.2f}")
    print(f"  {'  min / max':<{w}} {min(ours_steps):>3.2f}/{max(ours_steps):<4.2f} "
          f"{min(trl_steps):>3.2f}/{max(trl_steps):<4.2f}")
    print(f"  {'  sampling (ours: sample_s, in the sampler process) / generate + score (TRL)':<{w}} "
          f"{ours_sample:>8.3f} {trl_gen:>8.3f}")
    print(f"  {'  ours: wall time between stored steps (owner side)':<{w}} {ours_wall:>8.3f}")
    if onpolicy_r:
        print(f"  {'  ours with overlap=False (strictly on-policy, as TRL)':<{w}} {onpolicy_s:>8.3f} {trl_s:>8.3f} "
              f"{onpolicy_s / trl_s:>7.2f}")
    print(f"  {'  mean completion length, tokens':<{w}} {ours_len:>8.1f} {trl_len:>8.1f}")
    speed = trl_s / ours_s
    how = f"{speed:.2f}x faster than" if speed >= 1 else f"slower: {ratio:.2f}x the time of"
    print(f"  ours is {how} TRL's GRPOTrainer (speed-up = TRL time / ours = {speed:.2f}); target >= "
          f"{TARGET_SPEEDUP:g}x (ratio <= {1 / TARGET_SPEEDUP:.3f}): {'met' if speed >= TARGET_SPEEDUP else 'NOT met'}")
    if parts:
        print(f"where one of our steps goes (in this process, the worker's functions, median of {n_parts}):")
        for k, v in parts.items():
            print(f"  {k:<{w}} {v:>8.4f} s")
    train_steps = len(curve)
    learn_step = _med(curve["step_s"].tolist()[1:])
    print()
    print(f"held-out accuracy, {len(heldout)} prompts ({overlap} of them also in the training pool), "
          f"before and after {lr_res['train_s'] / 60:.1f} min of mini-run ({step_k} steps; stop and last checkpoint "
          f"took {lr_res['stop_s']:.1f} s more):")
    print(f"  {'':<{w}} {'before':>8} {'after':>8} {'gain pts':>9}")
    k = args.eval_k
    for label, key in ((f"mean sampled accuracy, temperature 1, k = {k} (the figure)", "accuracy"),
                       ("greedy accuracy", "greedy_accuracy"), (f"pass@{k}", f"pass@{k}")):
        print(f"  {label:<{w}} {before[key]:>8.3f} {after[key]:>8.3f} {100 * (after[key] - before[key]):>+9.1f}")
    print(f"  {'mean completion length (sampled), tokens':<{w}} {before['mean_length']:>8.1f} "
          f"{after['mean_length']:>8.1f}")
    print(f"  {'mean token entropy (sampled)':<{w}} {before['entropy']:>8.3f} {after['entropy']:>8.3f}")
    gain = 100 * (after["accuracy"] - before["accuracy"])
    print(f"  gain {gain:+.1f} points; target >= +{TARGET_GAIN_POINTS:g}: "
          f"{'met' if gain >= TARGET_GAIN_POINTS else 'NOT met'}")
    print(f"  the learning run: median step_s {learn_step:.3f} s over {train_steps} steps, wall between stored steps "
          f"{_med(lr_res['stored_interval_s']):.3f} s (device {lr_res['device']})")
    n = len(curve)
    if n >= 5:
        print("  training curve (means over fifths of the run): reward_mean / accuracy on the training batches")
        cuts = [round(i * n / 5) for i in range(6)]
        for a, b in itertools.pairwise(cuts):
            seg = curve.iloc[a:b]
            acc = seg["accuracy"].mean() if "accuracy" in seg else float("nan")
            print(f"    steps {int(seg.index[0]):>4}-{int(seg.index[-1]):<4} reward {seg['reward_mean'].mean():.3f}  "
                  f"accuracy {acc:.3f}  entropy {seg['entropy'].mean():.3f}")
    print(f"  load average at start {load0[0]:.2f}, at end {os.getloadavg()[0]:.2f} (1 min; the machine is shared)")
    print(f"\n(total {time.perf_counter() - started:.0f} s)\n")

    print(json.dumps({"figure": f"minirun_step_s{W.suffix}", "value": round(ours_s, 3), "unit": "s", "baseline": "trl_grpo_step_s",
                      "baseline_value": round(trl_s, 3), "ratio": _ratio(ours_s, trl_s)}))
    print(json.dumps({"figure": f"minirun_accuracy_gain_points{W.suffix}", "value": round(gain, 1), "unit": "points",
                      "baseline": "accuracy_before_points", "baseline_value": round(100 * before["accuracy"], 1),
                      "ratio": None}))


if __name__ == "__main__":
    main()
