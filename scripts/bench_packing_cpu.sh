#!/usr/bin/env bash
# Padding-free packing on this CPU: `train --packing` against unpacked, length-bucketed batches on the same rows
# (scripts/make_packing_data.py's log-normal lengths, in bytes; SmolLM2's tokenizer makes about a token of every
# four), SmolLM2-135M, f32, LoRA r8 all-linear. The figure is non-padding tokens per second over the steps after
# warm-up, from the step events (cumulative trained tokens and elapsed seconds), the two runs one after the other.
#   bash scripts/bench_packing_cpu.sh OUT [STEPS=12] [WARM=2] [SEQ=512]
set -euo pipefail
OUT=${1:?OUT}; STEPS=${2:-12}; WARM=${3:-2}; SEQ=${4:-512}
ROOT=$(cd "$(dirname "$0")/.." && pwd); BIN=${BIN:-$ROOT/target/release/metal-candle}
MODEL=${MODEL:-$(ls "$ROOT"/models/smollm2/*.gguf | head -1)}
mkdir -p "$OUT"
python3 "$ROOT/scripts/make_packing_data.py" "$OUT/rows.jsonl" 2000 400 0.9 40 2000 | tee "$OUT/data.json"
run() {
  local name=$1; shift
  "$BIN" train --model "$MODEL" --data "$OUT/rows.jsonl" --format text --seq-len "$SEQ" --iters "$STEPS" --rank 8 \
    --alpha 16 --targets all-linear --device cpu --dtype f32 --lr 2e-4 --schedule constant --warmup 0 --save-every 0 \
    --val-every 0 --out "$OUT/runs" --name "$name" --json "$@" >"$OUT/$name.jsonl" 2>"$OUT/$name.err"
  python3 - "$OUT/$name.jsonl" "$WARM" "$name $*" <<'PY'
import json, sys
steps = [e for e in map(json.loads, filter(str.strip, open(sys.argv[1]))) if e.get("event") == "step"]
w = int(sys.argv[2]); a, b = steps[w - 1], steps[-1]
rate = (b["trained_tokens"] - a["trained_tokens"]) / (b["elapsed_secs"] - a["elapsed_secs"])
print(json.dumps(dict(impl="ours " + sys.argv[3], steps=len(steps) - w, real_tokens_per_s=round(rate, 1),
                      mean_tokens_per_step=round((b["trained_tokens"] - a["trained_tokens"]) / (len(steps) - w)))))
PY
  grep -o "packing: [^\"]*" "$OUT/$name.jsonl" | head -1 || true
}
run packed-b2 --batch-size 2 --packing | tee -a "$OUT/packing.log"
run padded-b8 --batch-size 8 | tee -a "$OUT/packing.log"
