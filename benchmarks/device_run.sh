#!/usr/bin/env bash
# The device check of backends/' CUDA path: benchmarks/bench_cuda.py on the GPU machine.
#
# Run from the repository root there, with .device_wheels/ carried (git-ignored; fill it here with
#   python -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .device_wheels tornado==6.6.1
# ): the device image has torch and transformers but not tornado, which backends.server needs.
#   bash benchmarks/device_run.sh [bench_cuda.py options]
#   bash benchmarks/device_run.sh --agent [bench_cuda_agent.py options]    (the agent loop's check)
# Writes $OUT/cuda.jsonl (figures), $OUT/cuda_checks.json (every check) and $OUT/bench_cuda.log
# (--agent: cuda_agent.jsonl, cuda_agent_checks.json, bench_cuda_agent.log).
# Exit status: the benchmark's (1 when a check failed).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/out/device}
mkdir -p "$OUT"
if ! python3 -c "import tornado" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .device_wheels/*.whl \
    || { echo "cannot install the carried wheels in .device_wheels/ (carry it)" >&2; exit 3; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
bench=bench_cuda
if [ "${1:-}" = "--agent" ]; then bench=bench_cuda_agent; shift; fi
python3 "benchmarks/$bench.py" --budget-s "${BUDGET_S:-360}" --out "$OUT" "$@" 2>&1 | tee "$OUT/$bench.log"
