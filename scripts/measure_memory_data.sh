#!/usr/bin/env bash
# Peak RSS of short training runs on a real dataset against the memory estimate the CLI prints for it (batches
# are padded to their longest row, so the estimate uses the dataset's longest training row, not --seq-len).
#
# Usage: scripts/measure_memory_data.sh MODEL DATA "BATCH SEQ CHECKPOINTING" ...
#   e.g. scripts/measure_memory_data.sh models/smollm2/SmolLM2-135M-Instruct-Q4_1.gguf assets/sample-chat "64 2048 off"
# Each run is `metal-candle train` for ITERS (default 3) steps, rank 8, f32 on the CPU, under Python's resource
# module; prints a markdown row: data, batch x seq, checkpointing, the estimate, the measured peak RSS of the whole
# process (load and tokenization included) and their difference. Env: BIN (default target/release/metal-candle).
set -euo pipefail
model=$1; data=$2; shift 2
bin=${BIN:-${CARGO_TARGET_DIR:-target}/release/metal-candle}
for run in "$@"; do
  read -r batch seq ckpt <<< "$run"
  log=$(mktemp); out=$(mktemp -d)
  python3 -c 'import resource, subprocess, sys
code = subprocess.run(sys.argv[1:]).returncode
print(f"Maximum resident set size (kbytes): {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}", file=sys.stderr)
sys.exit(code)' "$bin" train --model "$model" --data "$data" --out "$out" --device cpu --dtype f32 --rank 8 \
    --batch-size "$batch" --seq-len "$seq" --iters "${ITERS:-3}" --checkpointing "$ckpt" --save-every 0 > "$log" 2>&1 \
    || { cat "$log" >&2; exit 1; }
  grep -E "^(note|warning)" "$log" >&2 || true
  est=$(grep -o 'memory estimate [0-9.]* GB' "$log" | awk '{print $3}')
  longest=$(grep -o "longest row, [0-9]* tokens" "$log" | awk '{print $3}' || true)
  rss_kb=$(grep 'Maximum resident set size' "$log" | awk '{print $6}')
  python3 - "$(basename "$data")" "$batch" "$seq" "$ckpt" "${longest:-$seq}" "$est" "$rss_kb" <<'PY'
import sys
data, b, t, ck, longest, est, rss_kb = sys.argv[1:]
rss = int(rss_kb) * 1024 / 1e9
print(f"| {data} | {b} x {t} | {longest} | {ck} | {float(est):.2f} | {rss:.2f} | {100 * (float(est) - rss) / rss:+.1f}% |")
PY
  rm -rf "$log" "$out"
done
