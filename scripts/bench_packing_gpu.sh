#!/usr/bin/env bash
# Padding-free packing on a lent GPU, same call, same rows: our `train --packing` against our unpacked (length-
# bucketed) batches and against Unsloth + TRL's SFTTrainer packed (bfd, padding-free) and padded. The dataset is
# scripts/make_packing_data.py's (log-normal lengths, stated in OUT/data.json); the model is the random-weight
# Llama-3.2-1B-shaped bf16 folder of ../shared/anchors/gpu_unsloth.py (byte-level tokenizer: one token a byte). LoRA r8
# alpha 16 all-linear, bf16, lr 2e-4 constant, no checkpointing. The figure is non-padding tokens per second over the
# steps after warm-up. Before the timings, the fused attention's tests (tests/cuda_attention.rs, packed rows
# included) run from a test binary built here.
#   G=.gpu/pk bash scripts/bench_packing_gpu.sh OUT [STEPS=40] [WARM=5]
# $G holds: metal-candle.xz (a --features cuda,nccl build), cuda_attention.xz (its test binary, optional),
# gpu-libs.sh (../shared/cuda), unsloth-site.tar.xz, gpu_anchor.py and gpu_unsloth.py (../shared/anchors).
set -uo pipefail
G=${G:-.gpu/pk}; OUT=${1:?OUT}; STEPS=${2:-40}; WARM=${3:-5}
mkdir -p "$OUT"; LOG=$OUT/packing.log
# Per-run files stay on the device (too many come back otherwise); the log gathers what counts.
W=/tmp/packing-work; mkdir -p "$W"
unxz() { python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" "$1" "$2"; chmod +x "$2"; }
NCCL_LIB=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))')
export LD_LIBRARY_PATH="$NCCL_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unxz "$G/metal-candle.xz" /tmp/mc
if [ -f "$G/cuda_attention.xz" ]; then
  unxz "$G/cuda_attention.xz" /tmp/cuda_attention
  bash "$G/gpu-libs.sh" /tmp/cuda_attention --test-threads 1 --nocapture >"$OUT/cuda_attention.txt" 2>&1
  echo "cuda_attention tests: exit $? ($(grep -c '^test .* ok$' "$OUT/cuda_attention.txt") ok)" | tee -a "$LOG"
  grep -E "FAILED|panicked|test result" "$OUT/cuda_attention.txt" | head -20 | tee -a "$LOG"
fi
# A packed run through the fused kernels equals the same run on the CPU (f32; the blocked attention there).
for arch in tiny-llama tiny-gemma3 tiny-qwen3; do
  for dev in cuda cpu; do
    bash "$G/gpu-libs.sh" /tmp/mc train --model tests/fixtures/$arch --data assets/sample-chat --out /tmp/runs-$dev \
      --name $arch --iters 6 --batch-size 2 --seq-len 256 --packing --lr 5e-3 --warmup 2 --targets all-linear --rank 4 \
      --save-every 0 --val-every 6 --device $dev --dtype f32 --json >"$W/tiny-$arch-$dev.jsonl" 2>"$W/tiny-$arch-$dev.err"
  done
  python3 - "$W/tiny-$arch-cuda.jsonl" "$W/tiny-$arch-cpu.jsonl" "$arch" <<'PY' | tee -a "$LOG"
import json, sys
loss = lambda f: [e["loss"] for e in map(json.loads, filter(str.strip, open(f))) if e.get("event") == "step"]
a, b = loss(sys.argv[1]), loss(sys.argv[2])
print(json.dumps(dict(check=f"packed {sys.argv[3]} cuda vs cpu f32", steps=len(a), max_abs_diff=max(abs(x - y) for x, y in zip(a, b)) if a and b and len(a) == len(b) else None)))
PY
done
mkdir -p /tmp/site && tar -xJf "$G/unsloth-site.tar.xz" -C /tmp/site
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 UNSLOTH_DISABLE_STATISTICS=1
python3 scripts/make_packing_data.py /tmp/pk.jsonl | tee "$OUT/data.json" | tee -a "$LOG"
MODEL=$(cd "$G" && python3 -c "from gpu_unsloth import folder; print(folder('llama-1b'))" 2>/dev/null | tail -1)
echo "model: $MODEL" | tee -a "$LOG"
# Ours: non-padding tokens/s from the step events' cumulative trained_tokens and elapsed_secs.
ours() {
  local name=$1; shift
  bash "$G/gpu-libs.sh" /tmp/mc train --model "$MODEL" --data /tmp/pk.jsonl --format text --seq-len 2048 \
    --iters "$STEPS" --rank 8 --alpha 16 --targets all-linear --dtype bf16 --lr 2e-4 --schedule constant --warmup 0 \
    --save-every 0 --val-every 0 --out /tmp/runs --name "$name" --json "$@" >"$W/$name.jsonl" 2>"$W/$name.err"
  python3 - "$W/$name.jsonl" "$WARM" "$name $*" <<'PY' | tee -a "$LOG"
import json, sys
steps = [e for e in map(json.loads, filter(str.strip, open(sys.argv[1]))) if e.get("event") == "step"]
w = int(sys.argv[2]); a, b = steps[w - 1], steps[-1]
rate = (b["trained_tokens"] - a["trained_tokens"]) / (b["elapsed_secs"] - a["elapsed_secs"])
print(json.dumps(dict(impl="ours " + sys.argv[3], steps=len(steps) - w, real_tokens_per_s=round(rate),
                      mean_tokens_per_step=round((b["trained_tokens"] - a["trained_tokens"]) / (len(steps) - w)),
                      last_loss=round(b["loss"], 4))))
PY
  grep -o "packing: [^\"]*" "$W/$name.jsonl" | head -1 | tee -a "$LOG"
}
smi() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >"$W/$1.smi" & SMI=$!; }
peak() { kill $SMI 2>/dev/null; echo "$1 nvidia-smi peak MiB: $(sort -n "$W/$1.smi" | tail -1)" | tee -a "$LOG"; }
for B in 4 8; do smi ours-packed-b$B; ours ours-packed-b$B --batch-size $B --packing; peak ours-packed-b$B; done
smi ours-padded-b16; ours ours-padded-b16 --batch-size 16; peak ours-padded-b16
for mode in packed padded; do
  B=$([ $mode = packed ] && echo 4 || echo 16)
  smi trl-$mode; (cd "$G" && python3 "$OLDPWD/scripts/bench_trl_packing.py" "$MODEL" /tmp/pk.jsonl 2048 $B $mode "$STEPS" "$WARM") \
    >"$W/trl-$mode.out" 2>"$W/trl-$mode.err"
  echo "trl $mode exit $?" | tee -a "$LOG"; tail -1 "$W/trl-$mode.out" | tee -a "$LOG"; peak trl-$mode
  grep -i "warn.*pack\|padding.free\|contamin" "$W/trl-$mode.err" | head -3 | tee -a "$LOG"
done
