#!/usr/bin/env bash
# The seed's system once, end to end, on the embedded model and a real judge server: the
# business-ideas recipe (config.openai.en.yaml: the seed's GRPOConfig, the XML format reward
# gating an LLM judge) against llama.cpp's server on the embedded GGUF. Measures the seed's
# hypothesis behind the gate (judge gated on a perfect format vs format + judge simply summed)
# and the judge's noise per setting (`grpokit judge audit`).
#
#   bench/judge_gate.sh [OUT]          # default runs/judge-gate; every stage skips what exists
#
# Settings (environment): SEEDS="0 1 2", STEPS=48 (GRPO steps per run), LEN=128 (completion
# tokens), DESIGNS="gated summed" (add `checklist`: the gated judge score replaced by the
# recipe's yes/no checklist, its at-chance `customer` item a program; checklist-configs in
# bench/judge_gate.py), PREFLIGHT=1 (0 skips the preflight), SFT_STEPS=10, EVAL_SAMPLES=8 (held-out samples per prompt), AUDIT_K=4 (repeats per
# answer), THREADS=1 (torch and the judge server). The seed's GRPOConfig is kept except the
# sizes a CPU needs: STEPS instead of 2 epochs, LEN instead of 512 tokens, and the 1 x 4
# completions of a step in one micro-batch instead of 4 accumulated ones (the same update).
#
# Stages: judge server (scripts/judge_server.sh) -> recipe copy pointed at it -> base model's
# samples -> format demonstrations from them (bench/judge_gate.py demos) -> short SFT
# warm-start -> preflight of base and SFT -> GRPO, gated and summed, per seed -> held-out eval
# of every run (judge and checklist ungated, so they score every sample, and the program items
# neither design trains on: independent checks) -> judge audits (AUDIT=0 skips) -> summary.md and
# curves.png (bench/judge_gate.py summary); the log of each stage is in OUT/logs/. On the
# 2-core development CPU: the audits 45 min, a 48-step run 25 min when the machine is quiet
# (45 min at load 30), the eval 12 min; about 2 h with SEEDS=0, 3.5-4 h with three seeds.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
BIN=$REPO/${GRPOKIT_VENV:-.venv}/bin
OUT=$(mkdir -p "${1:-runs/judge-gate}" && cd "${1:-runs/judge-gate}" && pwd)
SEEDS=${SEEDS:-"0 1 2"}
STEPS=${STEPS:-48}
LEN=${LEN:-128}
SFT_STEPS=${SFT_STEPS:-10}
DESIGNS=${DESIGNS:-"gated summed"}
PREFLIGHT=${PREFLIGHT:-1}
AUDIT=${AUDIT:-1}
EVAL_SAMPLES=${EVAL_SAMPLES:-8}
AUDIT_K=${AUDIT_K:-4}
THREADS=${THREADS:-1}
export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
mkdir -p "$OUT/logs" "$OUT/audit"
say() { echo "[$(date +%H:%M:%S)] $*"; }
run() {  # run LOG COMMAND...: the command's output to OUT/logs/LOG
  local log=$OUT/logs/$1
  shift
  say "$* > $log"
  "$@" >"$log" 2>&1 || { echo "failed; the end of $log:" >&2; tail -n 30 "$log" >&2; exit 1; }
}

# ---- the judge server, stopped on exit if this script started it
if URL=$(scripts/judge_server.sh url --dir "$OUT/judge-server" 2>/dev/null); then
  say "judge server already running at $URL"
else
  URL=$(scripts/judge_server.sh start --threads "$THREADS" --dir "$OUT/judge-server" | tail -n 1)
  trap 'scripts/judge_server.sh stop --dir "$OUT/judge-server"' EXIT
fi

# ---- the recipe, its judge pointed at the server; an eval copy whose judge scores every sample
R=$OUT/recipe
if [ ! -f "$R/config.openai.en.yaml" ]; then
  run recipe.log "$BIN/grpokit" recipes copy business-ideas "$R"
fi
sed -i "s|base_url: http://[^ ]*/v1|base_url: $URL|" "$R/config.openai.en.yaml"
CFG=$R/config.openai.en.yaml
sed -e 's|gate: {reward: xml_format, min: 1.0}|gate: {reward: xml_format, min: 0.0}|' \
  -e "s|max_completion_length: 512|max_completion_length: $LEN|" "$CFG" >"$R/eval.en.yaml"
"$BIN/python" bench/judge_gate.py checklist-configs "$R" "$URL" >/dev/null
SIZES=(--set "training.max_completion_length=$LEN" --set training.per_device_train_batch_size=4
  --set training.gradient_accumulation_steps=1)

# ---- warm start: the base model never writes the tags (preflight says cold start)
[ -f "$OUT/base_samples.jsonl" ] || run base_samples.log "$BIN/grpokit" generate \
  --model smollm2-135m-instruct --prompts "$R/train_en.jsonl" --config "$CFG" --samples 4 \
  --max-new-tokens 160 --out "$OUT/base_samples.jsonl"
[ -f "$OUT/demos.jsonl" ] || run demos.log "$BIN/python" bench/judge_gate.py demos \
  --samples "$OUT/base_samples.jsonl" --out "$OUT/demos.jsonl"
[ -f "$OUT/sft/config.json" ] || [ -f "$OUT/sft/adapter_config.json" ] ||
  run sft.log "$BIN/grpokit" sft "$CFG" --data "$OUT/demos.jsonl" --full --steps "$SFT_STEPS" \
    --output "$OUT/sft" "${SIZES[@]}"
for stage in base sft; do
  [ "$PREFLIGHT" = 1 ] || break
  [ -f "$OUT/preflight-$stage.json" ] && continue
  extra=()
  [ "$stage" = sft ] && extra=(--checkpoint "$OUT/sft")
  # exit 1 is preflight's "cold start" verdict, which the base model is expected to get
  "$BIN/grpokit" preflight "$CFG" "${extra[@]}" --out "$OUT/preflight-$stage.json" \
    "${SIZES[@]}" >"$OUT/logs/preflight-$stage.log" 2>&1 || true
  say "preflight $stage: $(grep -iE 'verdict|cold start|^go' "$OUT/logs/preflight-$stage.log" |
    head -n 1)"
done

# ---- GRPO: the seed's gate, the same run with format and judge simply summed, and the gated
# checklist; the variants of a seed train side by side (THREADS each), sharing the judge server
for seed in $SEEDS; do
  pids=()
  for variant in $DESIGNS; do
    dir=$OUT/$variant-s$seed
    [ -d "$dir/checkpoint-$STEPS" ] && continue
    gate=()
    [ "$variant" = summed ] && gate=(--set rewards.1.gate.min=0.0)
    config=$CFG
    [ "$variant" = checklist ] && config=$R/config.checklist.server.en.yaml
    rm -rf "$dir"
    run "$variant-s$seed.log" "$BIN/grpokit" train "$config" --output-dir "$dir" --no-progress \
      --set "model.init_from=$OUT/sft" --set "training.seed=$seed" \
      --set "training.max_steps=$STEPS" --set training.report_to=none \
      --set training.num_completions_to_print=4 "${SIZES[@]}" "${gate[@]}" &
    pids+=("$!")
  done
  for pid in "${pids[@]}"; do wait "$pid"; done  # set -e: a failed run stops the script
done

# ---- held-out: the SFT start and every run, the same prompts and sampling seeds; again for
# all of them when a run is missing from it (SEEDS grew), so that one table compares them all
models=(--model "sft=$OUT/sft")
evaluated=yes
for seed in $SEEDS; do
  for variant in $DESIGNS; do
    models+=(--model "$variant-s$seed=$OUT/$variant-s$seed")
    grep -q "\"model\": \"$variant-s$seed\"" "$OUT/eval/completions.jsonl" 2>/dev/null ||
      evaluated=no
  done
done
if [ $evaluated = no ] || [ ! -f "$OUT/eval/eval.json" ]; then
  # The first 5 held-out topics, on which the embedded-model figures were measured (the file has
  # 20 since the real-model runs).
  run eval.log "$BIN/grpokit" eval "${models[@]}" --prompts "$R/heldout_en.jsonl" --max-prompts 5 \
    --samples "$EVAL_SAMPLES" --config "$R/eval.checklist.en.yaml" --out "$OUT/eval" --batch-size 8
fi

# ---- the judge's noise per setting, on good reference answers and planted bad ones
[ "$AUDIT" = 1 ] && "$BIN/python" bench/judge_gate.py audit-configs "$CFG" "$OUT/audit"
for cfg in "$OUT"/audit/*.yaml; do
  [ -f "$cfg" ] || continue
  name=$(basename "$cfg" .yaml)
  [ -f "$OUT/audit/$name.json" ] && continue
  run "audit-$name.log" "$BIN/grpokit" judge audit "$cfg" --completions "$R/audit_en.jsonl" \
    --k "$AUDIT_K" --planted-prompts 2 --output "$OUT/audit/$name.json"
done

"$BIN/python" bench/judge_gate.py summary "$OUT"
