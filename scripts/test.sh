#!/usr/bin/env bash
# Lint, type-check (mypy --strict on all of src/grpokit), then run the tests. --slow runs the
# end-to-end tests marked slow
# (the embedded model, minutes); --lint-only stops after the static checks; --vllm runs the tests
# of the vLLM engine, slow ones included, in the vLLM environment (scripts/setup.sh vllm).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${GRPOKIT_VENV:-.venv}/bin
mode=${1:-fast}
if [ "$mode" = "--vllm" ]; then
  BIN=${GRPOKIT_VLLM_VENV:-.venv-vllm}/bin
  exec $BIN/python -m pytest -q -p no:cacheprovider -m "slow or not slow" \
    tests/rollout/test_vllm_engine.py tests/rollout/test_vllm_agent.py tests/rollout/test_ahead.py \
    tests/train/test_vllm_training.py \
    tests/bench/test_gpu_check.py::test_vllm_cpu_smoke_runs_the_gpu_vllm_path \
    tests/bench/test_bench_smoke.py::test_rollout_benchmark_prints_its_ratios \
    tests/bench/test_bench_smoke.py::test_lora_sync_benchmark_prints_its_ratios \
    tests/bench/test_bench_smoke.py::test_async_rollouts_benchmark_prints_its_ratio
fi
if [ "$mode" != "--slow" ]; then
  $BIN/ruff check src tests bench
  $BIN/ruff format --check src tests bench
  $BIN/mypy src/grpokit
  [ "$mode" = "--lint-only" ] && exit 0
  # The slowest tests listed last: the default run is held to about 15 minutes on 2 cores, and
  # this list says where its time goes.
  $BIN/python -m pytest -q -p no:cacheprovider --durations=15 --doctest-modules src/grpokit tests
else
  $BIN/python -m pytest -q -p no:cacheprovider -m slow tests
fi
