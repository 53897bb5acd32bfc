#!/usr/bin/env bash
# Reward hacking, caught live: the logic-tree recipe trained twice on the embedded model, once on
# the hackable depth reward and once on the guarded one, from the same warm-start, then compared.
#
#   bench/hacking_pair.sh [OUT_DIR]          # default runs/hacking
#
# Steps: copy the recipe; a short SFT on demos_en.jsonl (the model writes no tree at first);
# train config.hackable.en.yaml and config.guarded.en.yaml from that checkpoint, in parallel; one report per
# run and `grpokit compare` of the two; bench/hacking_summary.py prints the numbers (onset of
# the quality drop, alert steps, reward and held-out quality at both ends).
# GRPOKIT (default: .venv/bin/grpokit) and PYTHON (.venv/bin/python) pick the installation;
# SFT_STEPS (default 24) and extra `--set` arguments in TRAIN_ARGS change the runs.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-runs/hacking}"
GRPOKIT="${GRPOKIT:-$REPO/.venv/bin/grpokit}"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
SFT_STEPS="${SFT_STEPS:-24}"
read -r -a EXTRA <<< "${TRAIN_ARGS:-}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"   # one thread per run: the two runs share 2 cores

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
RECIPE="$OUT/recipe"
[ -d "$RECIPE" ] || "$GRPOKIT" recipes copy logic-tree "$RECIPE"

echo "== SFT warm-start ($SFT_STEPS steps on demos_en.jsonl), $(uptime)"
[ -f "$OUT/sft/grpokit_policy.json" ] || "$GRPOKIT" sft "$RECIPE/config.hackable.en.yaml" \
    --data "$RECIPE/demos_en.jsonl" --lora --steps "$SFT_STEPS" --output "$OUT/sft"

# The two runs train side by side, one thread each (2 cores); logs in OUT/<run>.log.
train() {
    local run="$1"
    if [ -f "$OUT/$run/run.json" ]; then   # started before: finish it (or nothing to do)
        "$GRPOKIT" train "$OUT/$run" --no-progress
    else
        "$GRPOKIT" train "$RECIPE/config.$run.en.yaml" --output-dir "$OUT/$run" --no-progress \
            --set "model.init_from=$OUT/sft" "${EXTRA[@]}"
    fi
}
echo "== GRPO on config.hackable.en.yaml and config.guarded.en.yaml, $(uptime)"
pids=()
for run in hackable guarded; do
    train "$run" > "$OUT/$run.log" 2>&1 &
    pids+=("$!")
done
for pid in "${pids[@]}"; do wait "$pid"; done
for run in hackable guarded; do "$GRPOKIT" report "$OUT/$run"; done

"$GRPOKIT" compare "$OUT/hackable" "$OUT/guarded" --out "$OUT/compare.html"
echo "== $(uptime)"
"$PYTHON" "$REPO/bench/hacking_summary.py" "$OUT/hackable" "$OUT/guarded" \
    --json "$OUT/summary.json"
