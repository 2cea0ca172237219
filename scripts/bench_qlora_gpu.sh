#!/usr/bin/env bash
# QLoRA on a lent GPU, ours beside the PyTorch recipe in one run: the Llama-3.1-8B shape (random weights,
# scripts/make_random_model.py --preset llama-3.1-8b), LoRA r8 alpha 16 on every linear layer but the head, batch
# 1 x 1024 (and 4 x 1024 with checkpointing). Ours: the base quantized to Q4_K at load (`--quantize q4k`), adapters
# and activations in bf16. Theirs: bitsandbytes NF4 with double quantization + PEFT's prepare_model_for_kbit_training
# (scripts/bench_peft_train.py --qlora). Each with gradient checkpointing on and off, alternating ours and theirs.
# Peak GPU memory: nvidia-smi's device peak for both (PyTorch's max allocated is in its JSON too).
#
#   scripts/bench_qlora_gpu.sh OUT [steps [config ...]]   configs: ckpt_1x1024 nockpt_1x1024 ckpt_4x1024 (default all)
# Env: MC (our binary: on the lent GPU "bash gpu-libs.sh /tmp/metal-candle"), MODELS (default /tmp/family-models),
# PY (default python3). bitsandbytes must be importable (carried as a wheel: see the device README).
set -uo pipefail
OUT="$1"; STEPS="${2:-5}"; DEVICE=cuda; shift; [ $# -gt 0 ] && shift
CONFIGS=("$@"); [ ${#CONFIGS[@]} -gt 0 ] || CONFIGS=(ckpt_1x1024 nockpt_1x1024 ckpt_4x1024)
HERE="$(cd "$(dirname "$0")" && pwd)"
MC="${MC:-$HERE/../target/release/metal-candle}"; MODELS="${MODELS:-/tmp/family-models}"; PY="${PY:-python3}"
mkdir -p "$OUT" "$MODELS"; RES="$OUT/results.jsonl"; LOG="$OUT/log.txt"; : >"$RES"; : >"$LOG"
source "$HERE/bench_lib.sh"
M="$MODELS/llama-3.1-8b"
[ -f "$M/model.safetensors" ] || $PY "$HERE/make_random_model.py" "$M" --preset llama-3.1-8b >>"$LOG" 2>&1
COMMON="--rank 8 --targets all-linear --steps $STEPS --warmup 2"
ours() { local tag=$1 b=$2 ck=$3; run "$tag" llama-3.1-8b $MC bench train --model "$M" --device cuda --dtype bf16 \
  --quantize q4k --checkpointing "$ck" --batch-size "$b" --seq-len 1024 $COMMON --json; }
theirs() { local tag=$1 b=$2; shift 2; run "$tag" llama-3.1-8b $PY "$HERE/bench_peft_train.py" --hf-dir "$M" \
  --device cuda --dtype bf16 --qlora --batch-size "$b" --seq-len 1024 $COMMON "$@"; }
for cfg in "${CONFIGS[@]}"; do
  case "$cfg" in
    ckpt_1x1024)   theirs nf4_$cfg 1 --checkpointing; ours q4k_$cfg 1 on ;;
    nockpt_1x1024) theirs nf4_$cfg 1; ours q4k_$cfg 1 off ;;
    ckpt_4x1024)   theirs nf4_$cfg 4 --checkpointing; ours q4k_$cfg 4 on ;;
    *) echo "unknown configuration $cfg" >&2 ;;
  esac
done
$PY - "$RES" <<'PY' | tee "$OUT/table.md"
import json, sys
rows = {d["tag"]: d for d in map(json.loads, open(sys.argv[1]))}
print("| configuration | ours Q4_K: step s / GPU GiB (nvidia-smi) | bnb NF4 + PEFT: step s / GPU GiB (nvidia-smi; max allocated) | time ratio (theirs / ours) | memory ratio (ours / theirs) |")
print("|---|---|---|---|---|")
for cfg in ("ckpt_1x1024", "nockpt_1x1024", "ckpt_4x1024"):
    o, t = rows.get("q4k_" + cfg, {}), rows.get("nf4_" + cfg, {})
    os_, ts = o.get("mean_step_secs"), t.get("mean_step_s")
    om, tm = o.get("nvidia_smi_peak_mib"), t.get("nvidia_smi_peak_mib")
    alloc = t.get("peak_memory_bytes")
    cell = lambda s, m: f"{s:.3f} / {m / 1024:.2f}" if s and m else (o.get("error") or t.get("error") or "-")
    print(f"| {cfg} | {cell(os_, om)} | {cell(ts, tm)}{f'; {alloc / 2**30:.2f}' if alloc else ''} | "
          f"{f'{ts / os_:.2f}x' if os_ and ts else '-'} | {f'{om / tm:.2f}x' if om and tm else '-'} |")
PY
