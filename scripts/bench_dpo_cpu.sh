#!/usr/bin/env bash
# DPO training step on this CPU, ours beside TRL's DPOTrainer (scripts/bench_trl_dpo.py --variant plain), alternating
# ours / TRL ROUNDS times in one shell: SmolLM2-135M's shape with random weights, f32 (scripts/make_smollm2_hf.py),
# 2 pairs x 2 sequences x 128 tokens (the first 64 a shared prompt), LoRA r8 alpha 16 on all seven linears, DPO
# sigmoid beta 0.1 with the reference (the base without the adapter) computed every step, 2 threads each.
#
#   scripts/bench_dpo_cpu.sh OUT [ROUNDS [STEPS [WARMUP]]]      (defaults 2 rounds, 5 steps, 2 warm-up)
# Env: MC (our binary, default target/release/metal-candle), PY (a Python with torch, transformers, peft, trl:
# default /work/venv-tf/bin/python), MODEL (default /tmp/smollm2-random, made when missing; needs TOKENIZER, a
# tokenizer.json, to make it).
set -uo pipefail
OUT="$1"; ROUNDS="${2:-2}"; STEPS="${3:-5}"; WARM="${4:-2}"; DEVICE=cpu
HERE="$(cd "$(dirname "$0")" && pwd)"
MC="${MC:-$HERE/../target/release/metal-candle}"; PY="${PY:-/work/venv-tf/bin/python}"; M="${MODEL:-/tmp/smollm2-random}"
mkdir -p "$OUT"; RES="$OUT/results.jsonl"; LOG="$OUT/log.txt"; : >"$RES"; : >"$LOG"
source "$HERE/bench_lib.sh"
export OPENBLAS_NUM_THREADS=2 RAYON_NUM_THREADS=2 OMP_NUM_THREADS=2 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
[ -f "$M/model.safetensors" ] || $PY "$HERE/make_smollm2_hf.py" --out "$M" --tokenizer "${TOKENIZER:?}" >>"$LOG" 2>&1
{ uname -m; nproc; $PY -c 'from importlib.metadata import version as v
print({p: v(p) for p in ["torch", "transformers", "peft", "trl", "datasets"]})'; } >>"$LOG" 2>&1
for r in $(seq 1 "$ROUNDS"); do
  run "ours_dpo_r$r" smollm2-135m "$MC" bench train --model "$M" --device cpu --dtype f32 --method dpo --batch-size 2 \
    --seq-len 128 --rank 8 --alpha 16 --targets all-linear --steps "$STEPS" --warmup "$WARM" --json
  run "trl_plain_r$r" smollm2-135m $PY "$HERE/bench_trl_dpo.py" --model "$M" --variant plain --pairs 2 --seq-len 128 \
    --device cpu --dtype f32 --steps "$STEPS" --warmup "$WARM" --threads 2
done
