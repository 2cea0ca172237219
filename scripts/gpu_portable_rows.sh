#!/usr/bin/env bash
# Portable-graph round on a lent GPU: correctness (native vs portable losses of both builds, tiny fixtures on
# CUDA), then the portable step of two builds ($G/before.xz, $G/new.xz; `--features cuda,nccl`) beside the native
# one at the Llama-3.2-1B shape, ROUNDS rounds (2), and a CUPTI kernel profile of the new build's portable step
# ($G/tl holds libtimeline.so). Run from the repo root: G=DIR bash scripts/gpu_portable_rows.sh OUT
set -uo pipefail
OUT="$1"; G="${G:-.gpu/pr}"; mkdir -p "$OUT"; LOG="$OUT/round.txt"
for b in before new; do python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('$G/$b.xz'), open('/tmp/$b','wb'))"; chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$LOG"
for run in "tiny-llama f32" "tiny-llama bf16" "tiny-llama f16" "tiny-gemma3 bf16" "tiny-llama bf16 --packing"; do
  set -- $run; arch=$1; d=$2; extra="${3:-}"; tag="${arch}_${d}${extra:+_packed}"
  for k in native:new portable:before portable:new; do kk=${k%%:*}; bb=${k##*:}
  timeout 120 bash $G/gpu-libs.sh /tmp/$bb train --model tests/fixtures/$arch --data assets/sample-chat --iters 20 --batch-size 4 \
    --seq-len 96 --lr 1e-2 --targets all-linear --rank 4 --alpha 8 --dropout 0.1 --save-every 0 --val-every 10 --seed 0 \
    --device cuda --dtype $d --json --out "$(mktemp -d)" --name t --kernels $kk $extra > /tmp/train_${tag}_${kk}_$bb.out 2>/tmp/train_${tag}_${kk}_$bb.err
  done
python3 - "$tag" >> "$LOG" <<'PY'
import json, sys
a = sys.argv[1]
def losses(k): return [json.loads(l)["loss"] for l in open(f"/tmp/train_{a}_{k}.out") if '"event":"step"' in l]
x = losses("native_new")
for k in ["portable_before", "portable_new"]:
    y = losses(k)
    print(f"{a} {k}: steps {len(x)} {len(y)} max |loss diff| vs native {max(abs(p - q) for p, q in zip(x, y)) if x and y else None} last {x[-1:]} {y[-1:]}")
PY
done
python3 scripts/make_random_model.py /tmp/m/llama-3.2-1b --preset llama-3.2-1b > /dev/null
ALL=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
run() {  # name binary kernels batch seq targets steps
  (while :; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; sleep 0.1; done) >"/tmp/$1.mem" 2>/dev/null &
  local poll=$!
  local line; line=$(timeout 150 bash $G/gpu-libs.sh "/tmp/$2" bench train --model /tmp/m/llama-3.2-1b --device cuda --dtype bf16 \
    --batch-size "$4" --seq-len "$5" --rank 8 --targets "$6" --steps "$7" --warmup 2 --kernels "$3" --json 2>"/tmp/$1.err" | tail -1)
  kill "$poll"; wait "$poll" 2>/dev/null
  echo "$1 | $(echo "$line" | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print(d["median_step_secs"], "s/step, loss", d["last_loss"])' 2>&1 | tail -1) | peak $(sort -n "/tmp/$1.mem" | tail -1) MiB" | tee -a "$LOG"
}
for r in $(seq 1 "${ROUNDS:-2}"); do
  run native_4x1024_$r new native 4 1024 $ALL 10
  for b in before new; do run ${b}_portable_4x1024_$r $b portable 4 1024 $ALL 6; done
  run native_1x4096_$r new native 1 4096 q_proj,v_proj 10
  for b in before new; do run ${b}_portable_1x4096_$r $b portable 1 4096 q_proj,v_proj 6; done
done
CUDA_INJECTION64_PATH=$PWD/$G/tl/libtimeline.so TIMELINE_OUT=/tmp/tl.tsv timeout 200 bash $G/gpu-libs.sh /tmp/new bench train \
  --model /tmp/m/llama-3.2-1b --device cuda --dtype bf16 --batch-size 4 --seq-len 1024 --rank 8 --targets $ALL \
  --steps 2 --warmup 1 --kernels portable --json 2>/dev/null | tail -1 >> "$LOG"
python3 scripts/gpu_timeline/report.py /tmp/tl.tsv --by-kernel 45 > "$OUT/new-by-kernel.txt" 2>&1
python3 scripts/gpu_timeline/report.py /tmp/tl.tsv --by-grid 3 --top 60 > "$OUT/new-by-grid.txt"
cat "$LOG"; head -30 "$OUT/new-by-grid.txt"
