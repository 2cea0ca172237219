#!/usr/bin/env bash
# CPU decode with a 4-bit base against llama.cpp on the same GGUF file, in one run: rounds that alternate ours
# with the file's Q4_1 weights kept quantized (--quantize keep), ours dequantized to f32 (--quantize none), ours
# requantized at load (q8_0, q4k) and llama.cpp (node-llama-cpp's prebuilt CPU build, scripts/llamacpp, after
# `npm install` there) with the same thread count. Prints JSON lines and a table of decode/prefill tokens/s
# per round, with each one's ratio to llama.cpp in the same round (the machine is shared: compare within a round).
#   scripts/bench_quant_decode.sh [ROUNDS] [out.jsonl]     env: MODEL, THREADS (2), P (128), M (64), R (3), BIN
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${1:-3}"
OUT="${2:-bench-results/quant-decode-$(date -u +%Y%m%d-%H%M).jsonl}"
MODEL="${MODEL:-models/smollm2/SmolLM2-135M-Instruct-Q4_1.gguf}"
THREADS="${THREADS:-2}" P="${P:-128}" M="${M:-64}" R="${R:-3}"
BIN="${BIN:-${CARGO_TARGET_DIR:-target}/release/metal-candle}"
mkdir -p "$(dirname "$OUT")"
: >"$OUT"
for round in $(seq 1 "$ROUNDS"); do
  for side in keep none q8_0 q4k llama.cpp; do
    if [ "$side" = llama.cpp ]; then
      line="$(node scripts/llamacpp/bench_decode.mjs "$MODEL" --threads "$THREADS" --prompt-tokens "$P" --new-tokens "$M" --repeats "$R")"
    else
      line="$("$BIN" bench generate --model "$MODEL" --device cpu --quantize "$side" --prompt-tokens "$P" --new-tokens "$M" --repeats "$R" --json 2>/dev/null | grep '^{')"
    fi
    echo "{\"round\": $round, \"side\": \"$side\", \"result\": $line}" | tee -a "$OUT"
  done
done
python3 - "$OUT" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
sides = ["keep", "none", "q8_0", "q4k", "llama.cpp"]
names = {"keep": "ours Q4_1 kept", "none": "ours f32 (dequantized)", "q8_0": "ours q8_0", "q4k": "ours q4k", "llama.cpp": "llama.cpp Q4_1"}
print("\n| round | " + " | ".join(names[s] for s in sides) + " |")
print("|---|" + "---|" * len(sides))
for r in sorted({x["round"] for x in rows}):
    got = {x["side"]: x["result"] for x in rows if x["round"] == r}
    ref = got["llama.cpp"]["decode_tokens_per_sec"]
    cells = []
    for s in sides:
        d, p = got[s]["decode_tokens_per_sec"], got[s]["prefill_tokens_per_sec"]
        cells.append(f"{d:.1f} ({d / ref:.2f}x) / {p:.0f}")
    print(f"| {r} | " + " | ".join(cells) + " |")
print("\ncells: decode tokens/s (ratio to llama.cpp's decode in the same round) / prefill tokens/s")
PY
echo "results in $OUT" >&2
