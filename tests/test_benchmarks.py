"""Benchmarks cannot rot: every script in ``benchmarks/`` runs with ``--smoke`` and prints its figures.

Each benchmark is run as a subprocess from the repository root, as a person runs it, at the
tiny sizes of its ``--smoke`` flag (``benchmarks/smoke.py``): a schema or API change that
breaks one fails here. What is checked is that it exits 0 and ends with its figure lines in
the format of ``../shared/BENCHMARKS.md`` (figure, value, unit, baseline, baseline_value,
ratio), at least one of them against a baseline. The figures' values are never compared
with anything: smoke sizes measure nothing, and timings have no place in tests.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KEYS = {"figure", "value", "unit", "baseline", "baseline_value", "ratio"}
TIMEOUT_S = 900  # a smoke run takes seconds to a minute or two; a busy 2-core machine is slower

# every benchmark and the figures its smoke run prints
FIGURES = {
    "bench_advantages": {"advantages_1m_s"},
    "bench_agent": {"agent_sampling_speed", "agent_branch_vs_fresh"},
    "bench_agent_minirun": {"agent_minirun_success_points", "agent_minirun_tool_errors"},
    # smoke runs on the CPU too (a tiny Qwen2 stands in for the 0.5B one); the chat policy is full runs only
    "bench_cuda": {f"{f}_{dt}_{m}" for f in ("cuda_sampling_tokens_per_s", "cuda_logprob_sample_vs_score_max_abs_diff",
                                              "cuda_train_step_s")
                   for dt in ("fp32", "bf16") for m in ("sample_policy", "qwen2_0p5b")}
                  | {f"cuda_mismatch_bf16_vs_fp32_{s}_abs_delta_{m}" for s in ("mean", "max")
                     for m in ("sample_policy", "qwen2_0p5b")},
    "bench_cuda_agent": {f"cuda_agent_tokens_per_s_{dt}_{m}" for dt in ("fp32", "bf16")
                         for m in ("agent_policy", "qwen2_0p5b")},
    "bench_export": {"export_1m_s"},
    "bench_fork": {"fork_first_result_s", "fork_vs_fresh_time", "forking_token_share"},
    "bench_launch": {"launch_to_first_page_s"},
    "bench_load": {"load_p95_ms_n2", "load_errors"},
    "bench_minirun": {"minirun_step_s", "minirun_accuracy_gain_points"},
    "bench_mismatch": {"mismatch_100m_tokens_s"},
    "bench_minirun --world chat": {"minirun_step_s_chat", "minirun_accuracy_gain_points_chat"},
    "bench_remote": {"remote_vs_local_speed"},
    "bench_rescore": {"rescore_100k_s"},
    "bench_sampling": {"sampling_speed_sample_policy", "sampling_speed_150k_vocab", "sampling_peak_mem_150k_vocab",
                       "sampling_speed_sample_policy_vs_stacked", "sampling_speed_150k_vocab_vs_stacked",
                       "sampling_peak_mem_150k_vocab_vs_stacked", "sampling_speed_chat_policy",
                       "sampling_speed_chat_policy_vs_stacked"},
    "bench_scale": {"rollout_tokens_ms_median", "filtered_page_ms_median", "filtered_page_incorrect_ms_median",
                    "filtered_page_reward_range_ms_median", "group_ms_median", "ingest_rows_per_s",
                    "filtered_page_ms_correct_all_runs", "filtered_page_ms_reward_all_runs"},
    "bench_shared": {"shared_open_first_read_s", "shared_rollout_tokens_ms_median", "shared_filtered_page_ms_median",
                     "shared_group_ms_median", "shared_read_after_update_ms_median", "shared_store_concurrent_ops",
                     "shared_store_concurrent_ops_errors"},
    "bench_tabs": {"tab_open_s_max", "tab_open_growth"},
}
BROWSER = {"bench_fork", "bench_launch", "bench_tabs"}  # these drive Debian's Chromium (tests/ui/harness.py)


def smoke_run(name: str) -> list[dict]:
    """Run ``benchmarks/<name>.py --smoke`` (``name`` may carry options after the script's name,
    e.g. ``bench_minirun --world chat``); the JSON objects it printed, one a line."""
    script, *options = name.split()
    proc = subprocess.run([sys.executable, f"benchmarks/{script}.py", *options, "--smoke"], cwd=ROOT,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, (f"{name} --smoke exited {proc.returncode}:\n{proc.stdout[-3000:]}\n"
                                  f"{proc.stderr[-5000:]}")
    out = []
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def test_every_benchmark_script_is_listed():
    scripts = {p.stem for p in (ROOT / "benchmarks").glob("bench_*.py")}
    assert scripts == {name.split()[0] for name in FIGURES}


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.ui) if n in BROWSER else n for n in FIGURES])
def test_benchmark_smoke_run_prints_its_figures(name):
    figures = [d for d in smoke_run(name) if isinstance(d, dict) and "figure" in d]
    assert {f["figure"] for f in figures} == FIGURES[name]
    for f in figures:
        assert set(f) == KEYS, f
        assert _number(f["value"]) and isinstance(f["unit"], str), f
        if f["baseline"] is None:
            assert f["baseline_value"] is None and f["ratio"] is None, f
        else:
            assert _number(f["baseline_value"]), f
            assert f["ratio"] is None or _number(f["ratio"]), f
    assert any(f["baseline"] is not None and _number(f["ratio"]) for f in figures), figures


@pytest.mark.slow
def test_make_large_store_smoke_builds_a_store():
    [summary] = [d for d in smoke_run("make_large_store") if isinstance(d, dict) and "db" in d]
    assert summary["rollouts"] == 800 and summary["runs"] == 10
    assert summary["tokens"] > 800 and summary["bytes"] > 0
