#!/usr/bin/env bash
# GRPO steps on this CPU, ours (`metal-candle bench grpo`) beside TRL's GRPOTrainer (scripts/bench_trl_grpo.py
# --variant plain), alternating ours / TRL ROUNDS times in one shell: SmolLM2-135M's shape with random weights, f32
# (scripts/make_smollm2_hf.py), P prompts of LP random tokens, each sampled G times to exactly N new tokens, a
# synthetic reward, one AdamW step with GRPO's objective (DAPO loss, beta 0, num_iterations 1), LoRA r8 alpha 16 on
# all seven linears, 2 threads each.
#
#   scripts/bench_grpo_cpu.sh OUT [ROUNDS [STEPS [WARMUP [PxGxLPxN]]]]   (defaults 2 rounds, 3 steps, 1 warm-up, 2x4x64x32)
# Env: MC (our binary, default target/release/metal-candle), PY (a Python with torch, transformers, peft, trl:
# default /work/venv-tf/bin/python), MODEL (default /tmp/smollm2-random, made when missing; needs TOKENIZER, a
# tokenizer.json, to make it).
set -uo pipefail
OUT="$1"; ROUNDS="${2:-2}"; STEPS="${3:-3}"; WARM="${4:-1}"; SHAPE="${5:-2x4x64x32}"; DEVICE=cpu
HERE="$(cd "$(dirname "$0")" && pwd)"
MC="${MC:-$HERE/../target/release/metal-candle}"; PY="${PY:-/work/venv-tf/bin/python}"; M="${MODEL:-/tmp/smollm2-random}"
mkdir -p "$OUT"; RES="$OUT/results.jsonl"; LOG="$OUT/log.txt"; : >"$RES"; : >"$LOG"
source "$HERE/bench_lib.sh"
export OPENBLAS_NUM_THREADS=2 RAYON_NUM_THREADS=2 OMP_NUM_THREADS=2 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
[ -f "$M/model.safetensors" ] || $PY "$HERE/make_smollm2_hf.py" --out "$M" --tokenizer "${TOKENIZER:?}" >>"$LOG" 2>&1
{ uname -m; nproc; $PY -c 'from importlib.metadata import version as v
print({p: v(p) for p in ["torch", "transformers", "peft", "trl", "datasets"]})'; } >>"$LOG" 2>&1
IFS=x read -r P NG LP N <<<"$SHAPE"
ARGS=(--prompts "$P" --num-generations "$NG" --prompt-len "$LP" --max-new-tokens "$N" --steps "$STEPS" --warmup "$WARM")
for r in $(seq 1 "$ROUNDS"); do
  run "ours_grpo_r$r" smollm2-135m "$MC" bench grpo --model "$M" --device cpu --dtype f32 "${ARGS[@]}" --rank 8 \
    --alpha 16 --targets all-linear --json
  run "trl_plain_r$r" smollm2-135m $PY "$HERE/bench_trl_grpo.py" --model "$M" --variant plain "${ARGS[@]}" \
    --device cpu --dtype f32 --threads 2
done
