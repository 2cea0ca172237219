#!/usr/bin/env bash
# Peak RSS of short training runs against the engine's memory estimate, one run at a time.
#
# Usage: scripts/measure_memory.sh MODEL_DIR "BATCH SEQ TARGETS DTYPE QUANTIZE CHECKPOINTING" ...
#   e.g. scripts/measure_memory.sh /tmp/llama-3.2-1b "1 256 q_proj,v_proj f32 none off" "4 256 all-linear bf16 none on"
# Each run is `metal-candle bench train` (one step unless STEPS says more, rank 8, random tokens, every position a target) under
# Python's resource module; prints a markdown row: the settings, the estimate the bench printed, the measured peak RSS of
# the whole process (load included), and their difference. The bench's own output goes to stderr.
# Env: BIN, the command that runs metal-candle (default target/release/metal-candle; on a lent GPU machine
# "bash .gpu/gpu-libs.sh /tmp/metal-candle"). Peak RSS is the children's ru_maxrss (Python's resource module), so
# no /usr/bin/time is needed. STEPS / WARMUP (default 1 / 0): measured and warm-up steps of each run (s/step is
# then the bench's mean over the measured steps).
set -euo pipefail
model=$1; shift
read -r -a bin <<< "${BIN:-${CARGO_TARGET_DIR:-target}/release/metal-candle}"
peak_rss() {
  python3 -c 'import resource, subprocess, sys
code = subprocess.run(sys.argv[1:]).returncode
print(f"Maximum resident set size (kbytes): {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}", file=sys.stderr)
sys.exit(code)' "$@"
}
for run in "$@"; do
  read -r batch seq targets dtype quantize ckpt <<< "$run"
  log=$(mktemp)
  peak_rss "${bin[@]}" bench train --model "$model" --device cpu --dtype "$dtype" --quantize "$quantize" \
    --batch-size "$batch" --seq-len "$seq" --rank 8 --targets "$targets" --steps "${STEPS:-1}" --warmup "${WARMUP:-0}" \
    --checkpointing "$ckpt" > "$log" 2>&1 || { cat "$log" >&2; exit 1; }
  cat "$log" >&2
  est_gb=$(grep -o 'estimate [0-9.]* GB' "$log" | awk '{print $2}')
  rss_kb=$(grep 'Maximum resident set size' "$log" | awk '{print $6}')
  secs=$(grep -o '[0-9.]* s/step' "$log" | awk '{print $1}')
  python3 - "$batch" "$seq" "$targets" "$dtype" "$quantize" "$ckpt" "$est_gb" "$rss_kb" "$secs" <<'PY'
import sys
b, t, targets, dtype, q, ck, est, rss_kb, secs = sys.argv[1:]
rss = int(rss_kb) * 1024 / 1e9
print(f"| {b} x {t} | {targets} | {dtype} | {q} | {ck} | {float(est):.2f} | {rss:.2f} | {100 * (float(est) - rss) / rss:+.1f}% | {secs} |")
PY
  rm -f "$log"
done
