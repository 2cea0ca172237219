#!/usr/bin/env bash
# Side-by-side CPU benchmarks: metal-candle and PyTorch (transformers / PEFT) on the same machine in one run.
# Needs the reference Python packages (scripts/requirements-reference.txt). Prints JSON lines and a summary.
#   scripts/bench_cpu.sh [out.jsonl]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-bench-results/cpu-$(date -u +%Y%m%d-%H%M).jsonl}"
mkdir -p "$(dirname "$OUT")"
M="$(bash scripts/fetch_smollm2.sh | tail -n1)"
BIN=target/release/metal-candle
cargo build --release -q
: >"$OUT"
run() { echo "+ $*" >&2; "$@" 2>/dev/null | grep '^{' | tee -a "$OUT"; }
run $BIN bench generate --model "$M" --device cpu --prompt-tokens 128 --new-tokens 64 --repeats 3 --json
run python3 scripts/bench_transformers_generate.py --gguf "$M" --prompt-tokens 128 --new-tokens 64 --threads 2
run $BIN bench train --model "$M" --device cpu --batch-size 4 --seq-len 128 --rank 8 --targets q_proj,v_proj --steps 8 --warmup 2 --json
# The same step with Intel MKL instead of the system OpenBLAS, when `pip install mkl` put libmkl_rt here.
MKL_DIR="$(python3 -c "import sysconfig, os; print(os.path.join(sysconfig.get_paths()['data'], 'lib'))")"
if [ -e "$MKL_DIR/libmkl_rt.so.3" ] || [ -e "$MKL_DIR/libmkl_rt.so.2" ]; then
  MKL_LIB="$(ls "$MKL_DIR"/libmkl_rt.so.[23] | head -n1)"
  run env LD_LIBRARY_PATH="$MKL_DIR" METAL_CANDLE_BLAS_LIB="$MKL_LIB" $BIN bench train --model "$M" --device cpu --batch-size 4 --seq-len 128 --rank 8 --targets q_proj,v_proj --steps 8 --warmup 2 --json
fi
run python3 scripts/bench_peft_train.py --gguf "$M" --batch-size 4 --seq-len 128 --rank 8 --targets q_proj,v_proj --steps 8 --warmup 2 --threads 2
run $BIN bench lora --device cpu --repeats 10 --json
run python3 scripts/bench_torch_lora_micro.py --threads 2
echo "results in $OUT" >&2
