#!/usr/bin/env bash
# Multiple-choice throughput, side by side on this CPU in one run: `metal-candle bench multiple-choice` and
# lm-evaluation-harness's `hf` model (scripts/bench_mc_lmeval.py) on the same items, the same Hugging Face folder
# (SmolLM2-135M-Instruct's real weights, f32) and the same batch size. The folder is made from the GGUF by a
# one-step run at lr 1e-20 exported merged (the adapter's B is zero, so the merge is the dequantized base; the
# export writes config.json, tokenizer.json and f32 safetensors that both sides load). The runs alternate
# (ours, theirs, ours, ...) so a busy machine slows both alike; the best of each is printed last.
#   scripts/bench_mc_lmeval.sh [data.jsonl] [repeats]
set -euo pipefail
cd "$(dirname "$0")/.."
DATA="${1:-assets/sample-mc/test.jsonl}"
REPEATS="${2:-3}"
PY="${PYTHON:-/work/venv-tf/bin/python}"
OUT="bench-results/mc-$(date -u +%Y%m%d-%H%M).jsonl"
HF="${SMOLLM2_HF:-/tmp/smollm2-135m-hf}"
M="$(bash scripts/fetch_smollm2.sh | tail -n1)"
BIN=target/release/metal-candle
cargo build --release -q
if [ ! -e "$HF/model.safetensors" ]; then
  RUN="$(mktemp -d)"
  $BIN train --model "$M" --data assets/sample-chat --out "$RUN" --iters 1 --batch-size 1 --seq-len 64 --lr 1e-20 \
    --save-every 1 >/dev/null 2>&1
  $BIN export --checkpoint "$(ls -d "$RUN"/run-*/checkpoint-1)" --format merged --model "$M" --out "$HF" >&2
  rm -rf "$RUN"
fi
mkdir -p bench-results
: >"$OUT"
for _ in $(seq "$REPEATS"); do
  echo "+ metal-candle bench multiple-choice --model $HF --data $DATA --batch-size 8" >&2
  $BIN bench multiple-choice --model "$HF" --device cpu --data "$DATA" --batch-size 8 --json 2>/dev/null | grep '^{' | tee -a "$OUT"
  echo "+ $PY scripts/bench_mc_lmeval.py --model $HF --data $DATA --batch-size 8 --threads $(nproc)" >&2
  "$PY" scripts/bench_mc_lmeval.py --model "$HF" --data "$DATA" --batch-size 8 --threads "$(nproc)" 2>/dev/null \
    | grep '^{' | tee -a "$OUT"
done
python3 - "$OUT" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for impl in sorted({r["impl"] for r in rows}):
    best = max((r for r in rows if r["impl"] == impl), key=lambda r: r["items_per_sec"])
    print(f"{impl:>16}: {best['items_per_sec']:.2f} items/s best of {sum(r['impl'] == impl for r in rows)} "
          f"({best['items']} items, {best['choices']} choices), acc {best['acc']:.4f}, acc_norm {best['acc_norm']:.4f}")
PY
