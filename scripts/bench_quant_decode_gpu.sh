#!/usr/bin/env bash
# GPU decode with a quantized base against the dense bf16 base, in one run: for each model folder, `metal-candle
# bench generate` (greedy, bf16 activations) with `--quantize none` (bf16 weights), q8_0 and q4k, alternating the
# three for ROUNDS rounds. A 4-bit base reads about a quarter of the bytes per token, so its decode should be faster
# where decoding is bound by memory. The quantized bases run twice: through our single-row kernels (ops/cuda/
# qgemv.rs, the default) and with --no-gemv (Candle's quantized kernels, the path before them: "candle").
#
#   scripts/bench_quant_decode_gpu.sh OUT ROUNDS MODEL_DIR...
# Env: MC (our binary: on the lent GPU "bash .gpu/gpu-libs.sh /tmp/metal-candle"), P (prompt tokens, 128),
# N (new tokens, 256), R (repeats inside one run, 3), DEVICE (cuda), DTYPE (bf16; the "bf16" column is this dtype),
# VARIANTS (default "none q8_0 q4k q8_0:candle q4k:candle"). Writes OUT/results.jsonl (one line per run) and prints a table.
set -uo pipefail
OUT="$1"; ROUNDS="$2"; shift 2
HERE="$(cd "$(dirname "$0")" && pwd)"
MC="${MC:-$HERE/../target/release/metal-candle}"; P="${P:-128}"; N="${N:-256}"; R="${R:-3}"
mkdir -p "$OUT"; RES="$OUT/results.jsonl"; : >"$RES"
for model in "$@"; do
  for round in $(seq "$ROUNDS"); do
    for variant in ${VARIANTS:-none q8_0 q4k q8_0:candle q4k:candle}; do
      quant="${variant%%:*}"; flags=""; [ "$variant" != "$quant" ] && flags="--no-gemv"
      line="$($MC bench generate --model "$model" --device "${DEVICE:-cuda}" --dtype "${DTYPE:-bf16}" --quantize "$quant" \
        --prompt-tokens "$P" --new-tokens "$N" --repeats "$R" --json $flags 2>>"$OUT/log.txt" | grep '^{')"
      python3 - "$RES" "$(basename "$model")" "$variant" "$round" "${line:-{\}}" <<'PY'
import json, sys
res, model, variant, round_, line = sys.argv[1:]
row = dict(json.loads(line), model=model, quantize=variant, round=int(round_))
open(res, "a").write(json.dumps(row) + "\n")
PY
    done
  done
done
python3 - "$RES" <<'PY' | tee "$OUT/table.md"
import json, sys
from collections import defaultdict
runs = defaultdict(list)
for row in map(json.loads, open(sys.argv[1])):
    if "decode_tokens_per_sec" in row:
        runs[row["model"], row["quantize"]].append(row["decode_tokens_per_sec"])
cols = ["q8_0", "q4k", "q8_0:candle", "q4k:candle"]
print("| model | bf16 decode tok/s | " + " | ".join(f"{c} tok/s (x bf16)" for c in cols) + " |")
print("|---|---|" + "---|" * len(cols))
for model in dict.fromkeys(m for m, _ in runs):
    dense = runs.get((model, "none"), [])
    def cell(q):
        r = runs.get((model, q), [])
        if not r:
            return "-"
        ratio = f" ({max(r) / max(dense):.2f}x)" if dense and q != "none" else ""
        return f"{min(r):.0f}-{max(r):.0f}{ratio}"
    print(f"| {model} | {cell('none')} | " + " | ".join(cell(c) for c in cols) + " |")
PY
