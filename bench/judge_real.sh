#!/usr/bin/env bash
# The business-ideas recipe on real models, end to end: Qwen2.5-Coder-0.5B-Instruct trained
# against Qwen2.5-Coder-1.5B-Instruct as the judge (grpokit serves it: backend llama_server),
# then every run measured on the held-out topics against the base model. Rebuilds the table of
# the recipe's README, "Real models". Needs `make setup-models`.
#
#   bench/judge_real.sh [OUT]          # default runs/judge-real; every stage skips what exists
#
# Settings (environment): DESIGNS="checklist gated" (checklist: config.qwen.checklist.en.yaml,
# four yes/no questions; gated: config.qwen.en.yaml, the seed's one 0-5 score; programs:
# config.qwen.checklist.program.en.yaml, programs for three items, a question for one), SEEDS="0 1 2",
# STEPS=30, EVAL_SAMPLES=4 (held-out samples per topic), MAX_PROMPTS=20 (held-out topics),
# PAIRWISE_SAMPLES=2 (samples per topic the pairwise judge compares; 0 skips it), LANGUAGE=en
# (ja: the Japanese configs *.ja.yaml, the 10 Japanese held-out topics, no pairwise comparison,
# which has no Japanese rubric and no judge able to give one: see the README).
# Measured on the 2-core development CPU (2026-12-05): a 30-step run 40 min, the eval of the
# base and one run 16 min, the pairwise comparison of one run 7 min.
#
# Stages: GRPO per design and seed -> one `grpokit eval` of the base and every run
# (config.qwen.eval.en.yaml: the questions ungated and the program items no design trains on)
# -> `grpokit judge pairwise` of each run against the base. Logs in OUT/logs/.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$PWD/${GRPOKIT_VENV:-.venv}/bin
R=$PWD/src/grpokit/recipes/business-ideas
OUT=$(mkdir -p "${1:-runs/judge-real}" && cd "${1:-runs/judge-real}" && pwd)
DESIGNS=${DESIGNS:-"checklist gated"}
SEEDS=${SEEDS:-"0 1 2"}
STEPS=${STEPS:-30}
EVAL_SAMPLES=${EVAL_SAMPLES:-4}
MAX_PROMPTS=${MAX_PROMPTS:-20}
LANGUAGE=${LANGUAGE:-en}
case "$LANGUAGE" in
  en) PAIRWISE_SAMPLES=${PAIRWISE_SAMPLES:-2} ;;
  ja) PAIRWISE_SAMPLES=0 ;;
  *) echo "judge_real.sh: LANGUAGE is en or ja, not $LANGUAGE" >&2; exit 2 ;;
esac
mkdir -p "$OUT/logs"
say() { echo "[$(date +%H:%M:%S)] $*"; }
run() {  # run LOG COMMAND...: the command's output to OUT/logs/LOG
  local log=$OUT/logs/$1
  shift
  say "$* > $log"
  "$@" >"$log" 2>&1 || { echo "failed; the end of $log:" >&2; tail -n 30 "$log" >&2; exit 1; }
}
config_of() {
  case "$1" in
    checklist) echo "$R/config.qwen.checklist.$LANGUAGE.yaml" ;;
    gated) echo "$R/config.qwen.$LANGUAGE.yaml" ;;
    programs) echo "$R/config.qwen.checklist.program.$LANGUAGE.yaml" ;;
    *) echo "judge_real.sh: unknown design $1 (checklist, gated, programs)" >&2; exit 2 ;;
  esac
}

models=(--model "base=qwen2.5-coder-0.5b-instruct")
for design in $DESIGNS; do
  for seed in $SEEDS; do
    name=$design-s$seed
    if [ ! -d "$OUT/$name/checkpoint-$STEPS" ]; then
      run "train-$name.log" "$BIN/grpokit" train "$(config_of "$design")" \
        --set "training.output_dir=$OUT/$name" --set "training.seed=$seed" \
        --set "training.max_steps=$STEPS"
    fi
    models+=(--model "$name=$OUT/$name")
  done
done

if [ ! -f "$OUT/eval/eval.json" ]; then
  run eval.log "$BIN/grpokit" eval "${models[@]}" --prompts "$R/heldout_$LANGUAGE.jsonl" \
    --max-prompts "$MAX_PROMPTS" --samples "$EVAL_SAMPLES" --config "$R/config.qwen.eval.$LANGUAGE.yaml" \
    --among xml_format --out "$OUT/eval" --seed 0
fi
if [ "$PAIRWISE_SAMPLES" -gt 0 ]; then
  for design in $DESIGNS; do
    for seed in $SEEDS; do
      name=$design-s$seed
      [ -f "$OUT/pairwise-$name/pairwise.json" ] && continue
      run "pairwise-$name.log" "$BIN/grpokit" judge pairwise "$OUT/eval" \
        --config "$R/config.qwen.eval.en.yaml" --model "$name" --against base \
        --rubric-file "$R/rubric_pairwise_en.txt" --samples "$PAIRWISE_SAMPLES" \
        --output "$OUT/pairwise-$name"
    done
  done
fi
say "held-out tables: $OUT/eval/eval.md; pairwise: $OUT/pairwise-*/pairwise.json"
say "to grade the answers yourself, blind: $BIN/grpokit review $OUT/eval --config $R/config.qwen.eval.$LANGUAGE.yaml"
