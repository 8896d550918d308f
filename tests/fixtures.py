"""The one home of what tests share: stores, run logs as frameworks write them, a backend server.

Fixtures built on these live in ``tests/conftest.py``; test modules import helpers from here,
never from one another.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict, deque
from pathlib import Path

import numpy as np
import pandas as pd

from backends.device import pick_device
from sample_data import ROLLOUTS_DIR
from studio.store import Store
from tests.ui.harness import free_port

ROOT = Path(__file__).resolve().parents[1]
DEVICE = os.environ.get("ROLLOUT_STUDIO_DEVICE") or pick_device()


def open_store(path: str | Path = ":memory:", *, seeded: bool = False) -> Store:
    """A real store: in memory or on disk, empty or seeded with the shipped sample rollouts."""
    return Store.open(path, seed_dir=ROLLOUTS_DIR if seeded else None)


# ------------------------------------------------------------------- run logs as written by frameworks

def trl_advantages(rewards: np.ndarray, n: int) -> np.ndarray:
    """GRPOTrainer's advantages: (r - group mean) / (group std + 1e-4), torch.std (Bessel) per n completions."""
    g = rewards.reshape(-1, n)
    return ((g - g.mean(1, keepdims=True)) / (g.std(1, ddof=1, keepdims=True) + 1e-4)).ravel()


def trl_log(output_dir: Path, step: int, prompts: list, completions: list, rewards: dict[str, list],
            extra: dict[str, list] | None = None, n: int = 4) -> None:
    """What ``GRPOTrainer.log`` writes (trl 1.16, trainer/grpo_trainer.py): the ``_logs`` deques
    gathered over a generation batch, turned into a frame and saved per global step."""
    logs = {"prompt": deque(prompts), "completion": deque(completions), "rewards": defaultdict(deque),
            "extra": defaultdict(deque)}
    for name, vals in rewards.items():
        logs["rewards"][name].extend(vals)
    for name, vals in (extra or {}).items():
        logs["extra"][name].extend(vals)
    total = np.nansum(np.array([logs["rewards"][k] for k in rewards], float), axis=0)  # reward_weights = 1
    logs["advantages"] = deque(trl_advantages(total, n).tolist())
    table = {
        "step": [step] * len(logs["prompt"]),
        "prompt": list(logs["prompt"]),  # strip_images_from_messages: text-only messages are unchanged
        "completion": list(logs["completion"]),
        **logs["rewards"],
        **logs["extra"],
        "advantage": logs["advantages"],
    }
    (output_dir / "completions").mkdir(parents=True, exist_ok=True)
    pd.DataFrame(table).to_parquet(os.path.join(output_dir, "completions", f"completions_{step:05d}.parquet"))


def verl_dump(dump_path: Path, step: int, inputs, outputs, gts, scores, reward_extra_infos_dict) -> Path:
    """``RayPPOTrainer._dump_generations``: one ``{global_steps}.jsonl`` per step."""
    os.makedirs(dump_path, exist_ok=True)
    filename = os.path.join(dump_path, f"{step}.jsonl")
    n = len(inputs)
    base_data = {"input": inputs, "output": outputs, "gts": gts, "score": scores, "step": [step] * n}
    for k, v in reward_extra_infos_dict.items():
        if len(v) == n:
            base_data[k] = v
    lines = [json.dumps({k: v[i] for k, v in base_data.items()}, ensure_ascii=False) for i in range(n)]
    with open(filename, "w") as f:
        f.write("\n".join(lines) + "\n")
    return Path(filename)


def board_line(prompt: str, tokens: list[str], reward: float, step: int, seed: int = 0) -> dict:
    """One RL-Logging-Board rollout record (its documented JSONL fields)."""
    rng = np.random.default_rng(seed)
    T = len(tokens)
    return {"prompt": prompt, "response": "".join(tokens), "response_tokens": tokens,
            "logprobs": (-rng.random(T)).round(4).tolist(), "ref_logprobs": (-rng.random(T)).round(4).tolist(),
            "values": rng.random(T).round(4).tolist(), "token_rewards": [0.0] * (T - 1) + [reward],
            "reward": reward, "step": step}


def write_jsonl(path: Path, rows: list, mode: str = "w") -> Path:
    with open(path, mode) as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path


# ----------------------------------------------------------------------------- a backend server

class Backend:
    """``python -m backends.server`` on a free loopback port, in its own process group."""

    def __init__(self, tmp: Path, *extra: str, port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"backend-{self.port}.log"
        env = {k: v for k, v in os.environ.items() if k != "ROLLOUT_STUDIO_API_KEY"}  # keys only as a test asks
        self.proc = subprocess.Popen([sys.executable, "-m", "backends.server", "--policy", "sample",
                                      "--port", str(self.port), *extra], cwd=ROOT, stdout=open(self.log, "w"),
                                     stderr=subprocess.STDOUT, start_new_session=True, env=env)
        deadline = time.time() + 90
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"backend exited early:\n{self.log.read_text()}")
            try:
                urllib.request.urlopen(self.url + "/health", timeout=5).read()
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"backend did not answer in 90 s:\n{self.log.read_text()}")

    def health(self) -> dict:
        return json.loads(urllib.request.urlopen(self.url + "/health", timeout=10).read())

    def stop(self, sig=signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=20)
