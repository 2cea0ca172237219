#!/usr/bin/env bash
# metal-candle beside MLX on the same model and shapes: our `bench train`, `bench generate` and `bench lora` next to
# mlx-lm's LoRA training step and generation and plain MLX's version of the LoRA layer micro-benchmark
# (scripts/bench_mlx.py), and our DPO, ORPO and GRPO training steps beside mlx-lm-lora's trainers on the same rows
# (scripts/bench_mlx_methods.py). Written for a Mac (ours: `--device auto`, i.e. Metal; MLX: its default device, the GPU),
# and runs anywhere MLX installs: on Linux with `pip install "mlx[cpu]" mlx-lm` both sides run on the CPU.
# Needs: python3 with scripts/requirements-mlx.txt; a metal-candle binary (built with `cargo build --release` when
# --bin is not given and target/release/metal-candle is missing; Metal is on by default on macOS).
#
#   scripts/bench_mac.sh [options]
#     --model DIR        Hugging Face llama folder both sides load (f32/bf16 safetensors + tokenizer.json).
#                        Default: the real SmolLM2-135M-Instruct GGUF (scripts/fetch_smollm2.sh), dequantized once
#                        into an HF folder by `bench_mlx.py gguf-to-hf` (cached under $CACHE_DIR, default
#                        ${TMPDIR:-/tmp}/metal-candle-bench).
#     --gguf FILE        convert this llama GGUF instead of SmolLM2's
#     --bin PATH         metal-candle binary (default target/release/metal-candle)
#     --python PATH      python with mlx + mlx-lm (default python3)
#     --batch-size N (4) --seq-len N (128) --rank N (8) --alpha X (2*rank) --targets LIST (q_proj,v_proj)
#     --steps N (5) --warmup N (1)                     training benchmark, both sides
#     --prompt-tokens N (128) --new-tokens N (64) --repeats N (3)   generation benchmark, both sides
#     --lora-repeats N (10)                            LoRA micro-benchmark repeats, both sides
#     --method-steps N (3) --method-batch N (2)       DPO/ORPO/GRPO: measured steps after --warmup, rows (prompts)
#     --group-size G (4) --completion-tokens N (16)    GRPO: completions per prompt, their most tokens
#     --dtype f32|f16|bf16  model dtype for both sides (default: whatever ours picks on its device, which MLX
#                        then uses too: f32 on a CPU, bf16 on a GPU with bf16 kernels)
#     --out PREFIX       writes PREFIX.jsonl (raw JSON lines), PREFIX.md (tables), PREFIX.log (stderr)
#                        (default bench-results/<mac|cpu>-<UTC date>-bench-mac)
#     --quantize TYPE (q4_1)  train-q4: our base quantization (QLoRA) beside mlx-lm's 4-bit groups of 64
#     --skip LIST        comma list of check,train,train-wgsl,train-q4,generate,lora,dpo,orpo,grpo to leave out (check:
#                        both sides' greedy ids for one chat prompt, to show they run the same model; train-wgsl: our
#                        training step again under --kernels wgsl, our WGSL kernels, which a Mac runs through Metal;
#                        train-q4: the training step on a 4-bit base, ours and mlx-lm's)
# A part that fails is logged and shown as "not measured"; the script still writes the table.
set -uo pipefail
cd "$(dirname "$0")/.."

MODEL="" GGUF="" BIN="" PY="python3" DTYPE="" OUT="" SKIP="" QUANT="q4_1"
BATCH=4 SEQ=128 RANK=8 ALPHA="" TARGETS="q_proj,v_proj" STEPS=5 WARMUP=1
PROMPT=128 NEW=64 REPEATS=3 LORA_REPEATS=10
METHOD_STEPS=3 METHOD_BATCH=2 GROUP=4 COMPLETION=16
ARGS_GIVEN="$*"
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL="$2"; shift 2 ;;
    --gguf) GGUF="$2"; shift 2 ;;
    --bin) BIN="$2"; shift 2 ;;
    --python) PY="$2"; shift 2 ;;
    --batch-size) BATCH="$2"; shift 2 ;;
    --seq-len) SEQ="$2"; shift 2 ;;
    --rank) RANK="$2"; shift 2 ;;
    --alpha) ALPHA="$2"; shift 2 ;;
    --targets) TARGETS="$2"; shift 2 ;;
    --steps) STEPS="$2"; shift 2 ;;
    --warmup) WARMUP="$2"; shift 2 ;;
    --prompt-tokens) PROMPT="$2"; shift 2 ;;
    --new-tokens) NEW="$2"; shift 2 ;;
    --repeats) REPEATS="$2"; shift 2 ;;
    --lora-repeats) LORA_REPEATS="$2"; shift 2 ;;
    --method-steps) METHOD_STEPS="$2"; shift 2 ;;
    --method-batch) METHOD_BATCH="$2"; shift 2 ;;
    --group-size) GROUP="$2"; shift 2 ;;
    --completion-tokens) COMPLETION="$2"; shift 2 ;;
    --dtype) DTYPE="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --skip) SKIP="$2"; shift 2 ;;
    --quantize) QUANT="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench_mac.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
skipped() { case ",$SKIP," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

if [ "$(uname -s)" = Darwin ] && [ "$(uname -m)" = arm64 ]; then KIND=mac; else KIND=cpu; fi
OUT="${OUT:-bench-results/$KIND-$(date -u +%Y-%m-%d)-bench-mac}"
mkdir -p "$(dirname "$OUT")"
RAW="$OUT.jsonl" LOG="$OUT.log" MD="$OUT.md"
: >"$RAW"; : >"$LOG"
note() { echo "bench_mac: $*" | tee -a "$LOG" >&2; }

"$PY" -c "import mlx.core, mlx_lm" 2>>"$LOG" || { note "$PY cannot import mlx and mlx_lm: pip install -r scripts/requirements-mlx.txt"; exit 1; }

if [ -z "$BIN" ]; then
  BIN=target/release/metal-candle
  [ -x "$BIN" ] || { note "building $BIN"; cargo build --release -q || exit 1; }
fi
[ -x "$BIN" ] || { note "no metal-candle binary at $BIN"; exit 1; }

if [ -z "$MODEL" ]; then
  [ -n "$GGUF" ] || GGUF="$(bash scripts/fetch_smollm2.sh | tail -n1)"
  CACHE_DIR="${CACHE_DIR:-${TMPDIR:-/tmp}/metal-candle-bench}"
  MODEL="$CACHE_DIR/$(basename "$GGUF" .gguf)-hf"
  if [ ! -s "$MODEL/model.safetensors" ]; then
    note "dequantizing $GGUF into $MODEL"
    "$PY" scripts/bench_mlx.py gguf-to-hf --gguf "$GGUF" --out "$MODEL" >>"$LOG" || exit 1
  fi
fi

# run LABEL CMD...: keep the command's JSON lines, tagged with the benchmark's name; stderr goes to the log.
run() {
  local label="$1"; shift
  note "+ $*"
  local t0=$SECONDS
  local impl=mlx; [ "$1" = "$BIN" ] && impl=metal-candle
  "$@" 2>>"$LOG" | grep '^{' | "$PY" -c '
import json, sys
for line in sys.stdin:
    rec = json.loads(line)
    rec.setdefault("bench", sys.argv[1])
    rec.setdefault("impl", sys.argv[2])
    print(json.dumps(rec), flush=True)' "$label" "$impl" | tee -a "$RAW"
  local rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || note "$label: exit status $rc (its rows will read 'not measured')"
  note "  ($((SECONDS - t0)) s)"
}

dtype_args=(); [ -n "$DTYPE" ] && dtype_args=(--dtype "$DTYPE")
alpha_args=(); [ -n "$ALPHA" ] && alpha_args=(--alpha "$ALPHA")
# The dtype ours ran in (from its JSON: this benchmark's line, else any of ours, else --dtype or f32), so MLX runs
# the model in the same one even where our side of a benchmark failed.
ours_dtype() { "$PY" -c '
import json, sys
ours = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
ours = [r for r in ours if r.get("impl") == "metal-candle" and r.get("dtype")]
same = [r for r in ours if r.get("bench") == sys.argv[2]]
print((same or ours or [{"dtype": sys.argv[3]}])[0]["dtype"])' "$RAW" "$1" "${DTYPE:-f32}"; }

if ! skipped check; then
  # Same model on both sides? Ours answers a chat prompt greedily; mlx-lm continues ours' prompt ids.
  run check "$BIN" generate --model "$MODEL" --device auto ${dtype_args[@]+"${dtype_args[@]}"} --prompt "What is the capital of France?" \
    --chat --max-tokens 16 --temperature 0 --json
  run check "$PY" scripts/bench_mlx.py check --model "$MODEL" --raw "$RAW" --dtype "$(ours_dtype check)"
fi
if ! skipped train; then
  run train "$BIN" bench train --model "$MODEL" --device auto ${dtype_args[@]+"${dtype_args[@]}"} --batch-size "$BATCH" --seq-len "$SEQ" \
    --rank "$RANK" ${alpha_args[@]+"${alpha_args[@]}"} --targets "$TARGETS" --steps "$STEPS" --warmup "$WARMUP" --json
  run train "$PY" scripts/bench_mlx.py train --model "$MODEL" --dtype "$(ours_dtype train)" --batch-size "$BATCH" \
    --seq-len "$SEQ" --rank "$RANK" ${alpha_args[@]+"${alpha_args[@]}"} --targets "$TARGETS" --steps "$STEPS" --warmup "$WARMUP"
fi
if ! skipped train-wgsl; then
  # The same step with our WGSL kernels (a Mac's default is the portable graph). Where the flag has no route (a
  # build without Metal or the wgpu-kernels feature) it is refused, and the row reads "not measured".
  run train-wgsl "$BIN" bench train --kernels wgsl --model "$MODEL" --device auto ${dtype_args[@]+"${dtype_args[@]}"} \
    --batch-size "$BATCH" --seq-len "$SEQ" --rank "$RANK" ${alpha_args[@]+"${alpha_args[@]}"} --targets "$TARGETS" \
    --steps "$STEPS" --warmup "$WARMUP" --json
fi
if ! skipped train-q4; then
  # QLoRA: ours quantizes the base at load (q4_1 by default: 4-bit blocks of 32 with a scale and a minimum, which
  # fit rows of any multiple of 32; Q4_K's 256 leave a 576-wide model's linears dense); mlx-lm's 4-bit affine groups
  # of 64, the quantization `mlx_lm.convert -q` writes.
  run train-q4 "$BIN" bench train --quantize "$QUANT" --model "$MODEL" --device auto ${dtype_args[@]+"${dtype_args[@]}"} \
    --batch-size "$BATCH" --seq-len "$SEQ" --rank "$RANK" ${alpha_args[@]+"${alpha_args[@]}"} --targets "$TARGETS" \
    --steps "$STEPS" --warmup "$WARMUP" --json
  run train-q4 "$PY" scripts/bench_mlx.py train --quantize-bits 4 --model "$MODEL" --dtype "$(ours_dtype train-q4)" \
    --batch-size "$BATCH" --seq-len "$SEQ" --rank "$RANK" ${alpha_args[@]+"${alpha_args[@]}"} --targets "$TARGETS" \
    --steps "$STEPS" --warmup "$WARMUP"
fi
if ! skipped generate; then
  run generate "$BIN" bench generate --model "$MODEL" --device auto ${dtype_args[@]+"${dtype_args[@]}"} --prompt-tokens "$PROMPT" \
    --new-tokens "$NEW" --repeats "$REPEATS" --json
  run generate "$PY" scripts/bench_mlx.py generate --model "$MODEL" --dtype "$(ours_dtype generate)" \
    --prompt-tokens "$PROMPT" --new-tokens "$NEW" --repeats "$REPEATS"
fi
if ! skipped lora; then
  run lora "$BIN" bench lora --device auto --repeats "$LORA_REPEATS" --json
  run lora "$PY" scripts/bench_mlx.py lora-micro --repeats "$LORA_REPEATS"
fi
for method in dpo orpo grpo; do
  skipped "$method" && continue
  # DPO/ORPO: one step more than measured (its event comes before its time is known: bench_mlx_methods.py ours).
  data=assets/sample-preference; extra=(--beta 0.1); iters=$((METHOD_STEPS + WARMUP + 1))
  [ "$method" = grpo ] && { data=assets/sample-grpo; iters=$((METHOD_STEPS + WARMUP))
    extra=(--num-generations "$GROUP" --max-new-tokens "$COMPLETION" --temperature 1.0); }
  run_dir="$(mktemp -d)"
  note "+ $BIN train --method $method (summarised by bench_mlx_methods.py ours)"
  "$BIN" train --model "$MODEL" --data "$data" --method "$method" --device auto ${dtype_args[@]+"${dtype_args[@]}"} \
    --out "$run_dir" --iters "$iters" --batch-size "$METHOD_BATCH" --seq-len "$SEQ" --rank "$RANK" \
    ${alpha_args[@]+"${alpha_args[@]}"} --targets "$TARGETS" --lr 1e-5 --save-every 0 --val-every 0 "${extra[@]}" --json 2>>"$LOG" \
    | "$PY" scripts/bench_mlx_methods.py ours --bench "$method" --warmup "$WARMUP" | tee -a "$RAW"
  rm -rf "$run_dir"
  mlx_extra=(); [ "$method" = grpo ] && mlx_extra=(--group-size "$GROUP" --max-completion-length "$COMPLETION")
  run "$method" "$PY" scripts/bench_mlx_methods.py mlx --mode "$method" --model "$MODEL" --data "$data" \
    --steps "$METHOD_STEPS" --warmup "$WARMUP" --batch-size "$METHOD_BATCH" --seq-len "$SEQ" --rank "$RANK" \
    ${alpha_args[@]+"${alpha_args[@]}"} --targets "$TARGETS" ${mlx_extra[@]+"${mlx_extra[@]}"}
done

{
  echo "# bench_mac.sh: metal-candle vs MLX"
  echo
  echo "Taken $(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -s) $(uname -m), $(getconf _NPROCESSORS_ONLN 2>/dev/null || sysctl -n hw.ncpu) cores;" \
    "model folder \`$MODEL\`${GGUF:+ (dequantized from \`$(basename "$GGUF")\`)}."
  echo "Command: \`scripts/bench_mac.sh $ARGS_GIVEN\` (raw JSON lines: \`$RAW\`, log: \`$LOG\`)."
  echo
  "$PY" scripts/bench_mlx.py report --raw "$RAW"
  "$PY" scripts/bench_mlx_methods.py report --raw "$RAW"
} >"$MD"
cat "$MD"
note "wrote $MD, $RAW and $LOG"
