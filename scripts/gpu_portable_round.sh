#!/usr/bin/env bash
# The portable graph (what a Mac runs) against the native one on a lent GPU, same call, at the Llama-3.2-1B shape
# (bf16, LoRA r8): 4 x 1024 all-linear and 1 x 4096 q,v, step time and nvidia-smi peak memory; the build before the
# blocked attention ($G/metal-candle-prev.xz) alternates with this one on the portable rows when carried. Then our
# CUDA flash attention kernels alone at 4 x 1024 ($G/flash_kernel_bench, scripts/flash_kernel_bench.cu), the
# reference for the WGSL attention's timing. Run from the repo root: G=DIR bash scripts/gpu_portable_round.sh OUT
set -uo pipefail
OUT="$1"; G="${G:-.gpu/port}"; mkdir -p "$OUT"; LOG="$OUT/round.txt"
unxz() { python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" "$1" "$2"; chmod +x "$2"; }
for b in metal-candle metal-candle-prev; do [ -f "$G/$b.xz" ] && unxz "$G/$b.xz" "/tmp/$b"; done
[ -d /tmp/llama1b ] || python3 "$G/make_smollm2_hf.py" --out /tmp/llama1b --shape llama-3.2-1b --dtype bf16 --tokenizer "$G/smollm2_tokenizer.json" >/dev/null
ALL=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
run() {  # name binary kernels batch seq targets steps
  (while :; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; sleep 0.1; done) >"/tmp/$1.mem" 2>/dev/null &
  local poll=$!
  local line; line=$(timeout 300 bash "$G/gpu-libs.sh" "/tmp/$2" bench train --model /tmp/llama1b --device cuda --dtype bf16 \
    --batch-size "$4" --seq-len "$5" --rank 8 --targets "$6" --steps "$7" --warmup 2 --kernels "$3" --json 2>"/tmp/$1.err" | tail -1)
  kill "$poll"; wait "$poll" 2>/dev/null
  echo "$1 | $(echo "$line" | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print(d["median_step_secs"], "s/step, loss", d["last_loss"])' 2>&1 | tail -1) | peak $(sort -n "/tmp/$1.mem" | tail -1) MiB" | tee -a "$LOG"
}
echo "# gpu_portable_round $(date -u +%FT%TZ)" >"$LOG"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >>"$LOG"
for r in 1 2; do
  run "native_4x1024_all_$r" metal-candle native 4 1024 $ALL 20
  run "portable_4x1024_all_$r" metal-candle portable 4 1024 $ALL 10
  [ -x /tmp/metal-candle-prev ] && run "prev_portable_4x1024_all_$r" metal-candle-prev portable 4 1024 $ALL 10
  run "native_1x4096_qv_$r" metal-candle native 1 4096 q_proj,v_proj 20
  run "portable_1x4096_qv_$r" metal-candle portable 1 4096 q_proj,v_proj 10
  [ -x /tmp/metal-candle-prev ] && run "prev_portable_1x4096_qv_$r" metal-candle-prev portable 1 4096 q_proj,v_proj 10
done
[ -x "$G/flash_kernel_bench" ] && { echo "## our CUDA flash attention alone, 4 x 1024, bf16, 32/8 heads of 64"; "$G/flash_kernel_bench" 4 1024 20 /tmp/flash; } >>"$LOG" 2>&1
cat "$LOG"
