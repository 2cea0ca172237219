#!/usr/bin/env bash
# DPO training step on a lent NVIDIA GPU, ours beside TRL + PEFT, TRL + PEFT + Liger and Unsloth + TRL in one run,
# one process each, one after another, on the same random-weight Llama-3.2-1B-shaped bf16 folder
# (scripts/make_smollm2_hf.py --shape llama-3.2-1b, made here: 2.5 GB cannot travel). Work per step: PAIRS pairs of
# two T-token sequences, the first half a shared prompt, the second half scored; LoRA r8 alpha 16 on all seven
# linears; DPO sigmoid, beta 0.1, the reference = the base without the adapter, computed every step; AdamW; no
# gradient checkpointing; 3 warm-up steps, 20 timed. Ours also runs ORPO and SFT (2 x PAIRS rows of T tokens, the
# same tokens) for reference. nvidia-smi's device peak is sampled beside every command (bench_lib.sh `run`). Then a
# real `metal-candle train --method dpo` on assets/sample-preference on CUDA, to show the path learns.
#
#   scripts/bench_dpo_gpu.sh OUT [PAIRSxT ...]          (default 4x1024 1x4096)
# Env: VARIANTS (TRL-side variants, default "plain liger unsloth"), NO_EXTRA=1 (skip ours ORPO/SFT and the real run).
# The device tool sends the session's checkout, not a helper's worktree, so what the run needs travels as one
# git-ignored bundle, carried: BUNDLE/scripts/{this, bench_lib.sh, bench_trl_dpo.py, make_smollm2_hf.py},
# BUNDLE/assets/sample-preference, BUNDLE/kit/ (below); run as `cd BUNDLE && GPU_DIR=kit WHL_DIR=kit bash scripts/...`.
# Making it (B=.gpu/bench-dpo, git-ignored; the same folder at the same path in the session's checkout):
#   mkdir -p $B/scripts $B/assets $B/kit; cp scripts/{bench_dpo_gpu.sh,bench_lib.sh,bench_trl_dpo.py,make_smollm2_hf.py} \
#     $B/scripts; cp -r assets/sample-preference $B/assets
#   strip -o /tmp/mc $CARGO_TARGET_DIR/release/metal-candle && xz -c /tmp/mc >$B/kit/metal-candle.xz
#   cp ../shared/cuda/gpu-libs.sh ../shared/anchors/unsloth-site.tar.xz $B/kit
#   pip download --no-deps liger-kernel==0.8.5 -d $B/kit (with the device README's platform flags), plus SmolLM2's
#   tokenizer.json and tokenizer_config.json (pad_token "<|endoftext|>" added) in $B/kit
# Needs GPU_DIR (default .gpu) holding metal-candle.xz (the stripped `--features cuda` build, xz), gpu-libs.sh
# (../shared/cuda), SmolLM2's tokenizer.json and tokenizer_config.json (its chat template; a pad token added), and
# unsloth-site.tar.xz (../shared/anchors: unsloth 2026.10.9, trl 1.15.0, datasets 4.8.5, ...); WHL_DIR (default .whl)
# holding the liger-kernel 0.8.5 wheel. All TRL variants use the kit's trl 1.15.0 (the one Unsloth brings).
set -uo pipefail
OUT="$1"; shift
SHAPES=("$@"); [ ${#SHAPES[@]} -gt 0 ] || SHAPES=(4x1024 1x4096)
HERE="$(cd "$(dirname "$0")" && pwd)"; ROOT="$HERE/.."
G="${GPU_DIR:-$ROOT/.gpu}"; W="${WHL_DIR:-$ROOT/.whl}"; PY="${PY:-python3}"; DEVICE=cuda
mkdir -p "$OUT"; RES="$OUT/results.jsonl"; LOG="$OUT/log.txt"; : >"$RES"; : >"$LOG"
source "$HERE/bench_lib.sh"
export RUN_TIMEOUT="${RUN_TIMEOUT:-240}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
  HF_DATASETS_OFFLINE=1 UNSLOTH_DISABLE_STATISTICS=1 TOKENIZERS_PARALLELISM=false

# Python side: the offline Unsloth kit (brings trl 1.15.0) and Liger, into /tmp/site.
mkdir -p /tmp/site && tar -xJf "$G/unsloth-site.tar.xz" -C /tmp/site || exit 1
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$W"/*.whl \
  >>"$LOG" 2>&1 || exit 1
export PYTHONPATH=/tmp/site
# Ours: the CUDA binary.
$PY -c "import lzma,shutil; shutil.copyfileobj(lzma.open('$G/metal-candle.xz'), open('/tmp/metal-candle','wb'))"
chmod +x /tmp/metal-candle
MC=(bash "$G/gpu-libs.sh" /tmp/metal-candle)
{ nvidia-smi -L; /tmp/metal-candle --version 2>/dev/null; $PY -c 'from importlib.metadata import version as v
print({p: v(p) for p in ["torch", "transformers", "peft", "trl", "datasets", "liger-kernel", "unsloth", "triton"]})'
} 2>&1 | tee "$OUT/versions.txt"

M=/tmp/llama-1b
if [ ! -f "$M/model.safetensors" ]; then
  $PY "$HERE/make_smollm2_hf.py" --shape llama-3.2-1b --dtype bf16 --out "$M" --tokenizer "$G/tokenizer.json" >>"$LOG" 2>&1
  cp "$G/tokenizer_config.json" "$M/"
fi

COMMON=(--rank 8 --alpha 16 --targets all-linear --dtype bf16 --steps 20 --warmup 3 --json)
for s in "${SHAPES[@]}"; do
  P=${s%x*}; T=${s#*x}
  run "ours_dpo_$s" llama-3.2-1b "${MC[@]}" bench train --model "$M" --device cuda --method dpo --batch-size "$P" \
    --seq-len "$T" "${COMMON[@]}"
  for v in ${VARIANTS:-plain liger unsloth}; do
    run "trl_${v}_$s" llama-3.2-1b $PY "$HERE/bench_trl_dpo.py" --model "$M" --variant "$v" --pairs "$P" --seq-len "$T"
  done
  [ -n "${NO_EXTRA:-}" ] && continue
  run "ours_orpo_$s" llama-3.2-1b "${MC[@]}" bench train --model "$M" --device cuda --method orpo --batch-size "$P" \
    --seq-len "$T" "${COMMON[@]}"
  run "ours_sft_$s" llama-3.2-1b "${MC[@]}" bench train --model "$M" --device cuda --method sft \
    --batch-size $((2 * P)) --seq-len "$T" "${COMMON[@]}"
  if [ "$s" = "${SHAPES[0]}" ]; then
    # A real preference run on CUDA: the 40 arithmetic pairs (10 held out), the random 1B with SmolLM2's template.
    timeout 180 "${MC[@]}" train --model "$M" --device cuda --data "$ROOT/assets/sample-preference" --method dpo \
      --out /tmp/runs --name dpo-cuda --iters 60 --batch-size 8 --seq-len 256 --lr 5e-4 --targets all-linear \
      --val-every 20 --save-every 60 2>&1 | tr '\r' '\n' | grep -v '^$' >"$OUT/train-dpo-cuda.log"
    tail -n 12 "$OUT/train-dpo-cuda.log"
    cp /tmp/runs/dpo-cuda/metrics.jsonl "$OUT/train-dpo-cuda-metrics.jsonl" 2>/dev/null
  fi
done
echo "== results"; cat "$RES"
