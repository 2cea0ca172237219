#!/usr/bin/env bash
# One real-shaped model per family beyond Llama/Qwen, ours beside transformers in the same run: decode (ours vs
# transformers generate) and a LoRA training step (ours vs transformers + PEFT, and + Liger kernels on CUDA), for
# gemma-3-270m, olmo2-1b, granite-3.3-2b, smollm3-3b and phi-4-mini (random weights, the published shapes:
# scripts/make_random_model.py --preset). Each model's runs alternate ours and theirs. JSON lines go to
# OUT/results.jsonl (each tagged with its preset), a markdown table to OUT/table.md.
#
#   scripts/bench_families.sh cpu  OUT [preset ...]   f32, 2 threads: decode 32 + 16 tokens, train 1 x 128
#   scripts/bench_families.sh cuda OUT [preset ...]   bf16: decode 128 + 128 tokens, train 4 x 512
#
# Both: LoRA r8 alpha 16 on every linear layer but the head ("all-linear" on both sides), AdamW, random tokens.
# Env: MC (our binary, default target/release/metal-candle; on the lent GPU "bash gpu-libs.sh /tmp/metal-candle"),
# MODELS (where the model folders are made, default /tmp/family-models), PY (python, default python3),
# LIGER_WHEEL (a liger_kernel wheel to install into /tmp/site first, for the GPU machine).
set -uo pipefail
DEVICE="$1"; OUT="$2"; shift 2
PRESETS=("$@"); [ ${#PRESETS[@]} -gt 0 ] || PRESETS=(gemma-3-270m olmo2-1b granite-3.3-2b smollm3-3b phi-4-mini)
HERE="$(cd "$(dirname "$0")" && pwd)"
MC="${MC:-$HERE/../target/release/metal-candle}"; MODELS="${MODELS:-/tmp/family-models}"; PY="${PY:-python3}"
mkdir -p "$OUT" "$MODELS"; RES="$OUT/results.jsonl"; LOG="$OUT/log.txt"; : >"$RES"; : >"$LOG"
if [ -n "${LIGER_WHEEL:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$LIGER_WHEEL" && export PYTHONPATH=/tmp/site
fi
case "$DEVICE" in
  cpu)  DT=f32;  GEN="--prompt-tokens 32 --new-tokens 16 --repeats 2"; B=1; T=128; STEPS="--steps 2 --warmup 1"
        THEIRS_EXTRA="--threads 2"; LIGER=0 ;;
  cuda) DT=bf16; GEN="--prompt-tokens 128 --new-tokens 128 --repeats 3"; B=4; T=512; STEPS="--steps 10 --warmup 3"
        THEIRS_EXTRA=""; LIGER=1 ;;
  *) echo "device: cpu or cuda" >&2; exit 2 ;;
esac

source "$HERE/bench_lib.sh"  # run TAG PRESET CMD...

for p in "${PRESETS[@]}"; do
  M="$MODELS/$p"
  [ -f "$M/model.safetensors" ] || $PY "$HERE/make_random_model.py" "$M" --preset "$p" >>"$LOG" 2>&1
  run ours_decode "$p" $MC bench generate --model "$M" --device "$DEVICE" --dtype $DT $GEN --json
  run transformers_decode "$p" $PY "$HERE/bench_transformers_generate.py" --hf-dir "$M" --device "$DEVICE" \
    --dtype $DT $GEN $THEIRS_EXTRA
  TRAIN="--batch-size $B --seq-len $T --rank 8 --targets all-linear $STEPS"
  run ours_train "$p" $MC bench train --model "$M" --device "$DEVICE" --dtype $DT $TRAIN --json
  run peft_train "$p" $PY "$HERE/bench_peft_train.py" --hf-dir "$M" --device "$DEVICE" --dtype $DT $TRAIN $THEIRS_EXTRA
  [ "$LIGER" = 1 ] && run peft_liger_train "$p" $PY "$HERE/bench_peft_train.py" --hf-dir "$M" --device "$DEVICE" \
    --dtype $DT $TRAIN --liger
  [ "$LIGER" = 1 ] && run ours_train_2 "$p" $MC bench train --model "$M" --device "$DEVICE" --dtype $DT $TRAIN --json
done
$PY "$HERE/bench_families_table.py" "$RES" | tee "$OUT/table.md"
