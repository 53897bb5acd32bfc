#!/usr/bin/env bash
# Lint, then run the tests with the type check (mypy --strict on all of src/grpokit) beside them.
# --slow runs the end-to-end tests marked slow (the embedded model, minutes); --lint-only stops
# after the static checks; --vllm runs the tests of the vLLM engine, slow ones included, in the
# vLLM environment (scripts/setup.sh vllm).
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
  if [ "$mode" = "--lint-only" ]; then
    exec $BIN/mypy src/grpokit
  fi
  # mypy (about a minute of one core in a fresh clone) runs beside the tests, which leave a core
  # idle much of the time (subprocesses starting, servers answering); its report follows theirs
  # and either failing fails the run.
  mypy_log=$(mktemp)
  $BIN/mypy src/grpokit >"$mypy_log" 2>&1 &
  mypy_pid=$!
  # The slowest tests listed last: the default run is held to about 15 minutes on 2 cores, and
  # this list says where its time goes.
  tests=0
  $BIN/python -m pytest -q -p no:cacheprovider --durations=15 --doctest-modules src/grpokit tests \
    || tests=$?
  types=0
  wait "$mypy_pid" || types=$?
  cat "$mypy_log"
  rm -f "$mypy_log"
  [ "$tests" -ne 0 ] && exit "$tests"
  exit "$types"
else
  $BIN/python -m pytest -q -p no:cacheprovider -m slow tests
fi
