#!/usr/bin/env bash
# GRPO steps on a lent NVIDIA GPU, ours (`metal-candle bench grpo`) beside TRL's GRPOTrainer + PEFT and Unsloth's
# patched GRPOTrainer in one run, one process each, one after another, on the same random-weight Llama-3.2-1B-shaped
# bf16 folder (scripts/make_smollm2_hf.py --shape llama-3.2-1b, made here: 2.5 GB cannot travel). Work per step:
# P random prompts of LP tokens, each sampled G times to exactly N new tokens (temperature 1; the eos never ends a
# completion early), a synthetic reward over the completion ids, one AdamW step with GRPO's objective (DAPO loss,
# beta 0 so no reference pass, num_iterations 1); LoRA r8 alpha 16 on all seven linears; no gradient checkpointing.
# Each side generates its own way: ours through the engine's group sampling (a prompt's G completions decoded as one
# batch through the KV cache, prompt after prompt, sampled on the host), TRL through Hugging Face `generate` over all
# P x G at once (no vLLM). nvidia-smi's device peak is sampled beside every command (bench_lib.sh `run`).
#
#   scripts/bench_grpo_gpu.sh OUT [PxGxLPxN ...]          (default 4x8x128x256 4x8x128x128)
# Env: VARIANTS (TRL-side variants, default "plain unsloth"; empty: none), OURS=0 (skip ours), STEPS (timed steps, default 4), WARM (untimed first
# steps, default 1), RUN_TIMEOUT (seconds per command, default 240).
# The device tool sends the session's checkout, not a helper's worktree, so what the run needs travels as one
# git-ignored bundle, carried: BUNDLE/scripts/{this, bench_lib.sh, bench_trl_grpo.py, make_smollm2_hf.py} and
# BUNDLE/kit/ (below); run as `cd BUNDLE && GPU_DIR=kit bash scripts/bench_grpo_gpu.sh $OUT/grpo`.
# Making it (B=.gpu/bench-grpo, git-ignored; the same folder at the same path in the session's checkout):
#   mkdir -p $B/scripts $B/kit; cp scripts/{bench_grpo_gpu.sh,bench_lib.sh,bench_trl_grpo.py,make_smollm2_hf.py} \
#     $B/scripts
#   strip -o /tmp/mc $CARGO_TARGET_DIR/release/metal-candle && xz -c /tmp/mc >$B/kit/metal-candle.xz
#   cp ../shared/cuda/gpu-libs.sh ../shared/anchors/unsloth-site.tar.xz $B/kit, plus SmolLM2's tokenizer.json and
#   tokenizer_config.json (its chat template) in $B/kit
# GPU_DIR (default .gpu) holds metal-candle.xz (the stripped `--features cuda` build, xz), gpu-libs.sh, the tokenizer
# files and unsloth-site.tar.xz (../shared/anchors: unsloth 2026.10.9, trl 1.15.0, datasets 4.8.5, ...). Both TRL
# variants use the kit's trl 1.15.0 (the one Unsloth brings).
set -uo pipefail
OUT="$1"; shift
SHAPES=("$@"); [ ${#SHAPES[@]} -gt 0 ] || SHAPES=(4x8x128x256 4x8x128x128)
HERE="$(cd "$(dirname "$0")" && pwd)"; ROOT="$HERE/.."
G="${GPU_DIR:-$ROOT/.gpu}"; PY="${PY:-python3}"; DEVICE=cuda; STEPS="${STEPS:-4}"; WARM="${WARM:-1}"
mkdir -p "$OUT"; RES="$OUT/results.jsonl"; LOG="$OUT/log.txt"; : >"$RES"; : >"$LOG"
source "$HERE/bench_lib.sh"
export RUN_TIMEOUT="${RUN_TIMEOUT:-240}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
  HF_DATASETS_OFFLINE=1 UNSLOTH_DISABLE_STATISTICS=1 TOKENIZERS_PARALLELISM=false

# Python side: the offline Unsloth kit (brings trl 1.15.0), into /tmp/site.
mkdir -p /tmp/site && tar -xJf "$G/unsloth-site.tar.xz" -C /tmp/site || exit 1
export PYTHONPATH=/tmp/site
# Ours: the CUDA binary.
$PY -c "import lzma,shutil; shutil.copyfileobj(lzma.open('$G/metal-candle.xz'), open('/tmp/metal-candle','wb'))"
chmod +x /tmp/metal-candle
MC=(bash "$G/gpu-libs.sh" /tmp/metal-candle)
{ nvidia-smi -L; /tmp/metal-candle --version 2>/dev/null; $PY -c 'from importlib.metadata import version as v
print({p: v(p) for p in ["torch", "transformers", "peft", "trl", "datasets", "unsloth", "triton"]})'
} 2>&1 | tee "$OUT/versions.txt"

M=/tmp/llama-1b
if [ ! -f "$M/model.safetensors" ]; then
  $PY "$HERE/make_smollm2_hf.py" --shape llama-3.2-1b --dtype bf16 --out "$M" --tokenizer "$G/tokenizer.json" >>"$LOG" 2>&1
  cp "$G/tokenizer_config.json" "$M/"
fi

for s in "${SHAPES[@]}"; do
  IFS=x read -r P NG LP N <<<"$s"
  SHAPE=(--prompts "$P" --num-generations "$NG" --prompt-len "$LP" --max-new-tokens "$N" --steps "$STEPS" --warmup "$WARM")
  [ "${OURS:-1}" = 0 ] || run "ours_grpo_$s" llama-3.2-1b "${MC[@]}" bench grpo --model "$M" --device cuda --dtype bf16 "${SHAPE[@]}" \
    --rank 8 --alpha 16 --targets all-linear --json
  for v in ${VARIANTS-plain unsloth}; do
    run "trl_${v}_$s" llama-3.2-1b $PY "$HERE/bench_trl_grpo.py" --model "$M" --variant "$v" "${SHAPE[@]}"
  done
done
# The host side of our sampled decoding on this machine's CPU: one draw over a flat 128,256-token row (random
# weights give flat logits) and a peaked one, at the benchmark's temperature 1 and top-p 1.
[ "${OURS:-1}" = 0 ] || "${MC[@]}" bench sample --vocab 128256 --spread 0.1,3 --temperature 1 --top-p 1 --draws 100 \
  2>&1 | tee "$OUT/sample.txt"
echo "== results"; cat "$RES"
