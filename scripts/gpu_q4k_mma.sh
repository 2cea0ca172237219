#!/usr/bin/env bash
# The tensor-core Q4_K decode product (ops/cuda/qgemv_mma.cuh, the default) against the FMA kernel
# (qgemv.cuh, `--no-q4k-tensor-cores`) in one binary, on a lent GPU. First the CUDA tests of quantized decoding (when
# $G/td.xz, the cuda_quantized_decode test binary, is there); then for each model `bench generate` (128 prompt + 256
# new tokens, greedy, best of 2) of the bf16 base, the Q4_K base on the tensor cores and on the FMA units, ROUNDS
# rounds in turn; then, for the 8B shape, each Q4_K kernel's GPU time over one decode (timeline.c, when $G/tl has it).
# Run from the repo root:
#   G=.gpu/qm bash scripts/gpu_q4k_mma.sh OUT
# $G: mc.xz (the release binary, --features cuda), gpu-libs.sh (../shared/cuda), optionally td.xz and tl/ (built by
# scripts/gpu_timeline/build.sh). Env: ROUNDS (2), MODELS ("llama-3.1-8b llama-3.2-1b").
set -uo pipefail
OUT="$1"; G="${G:-.gpu/qm}"; ROUNDS="${ROUNDS:-2}"; MODELS="${MODELS:-llama-3.1-8b llama-3.2-1b}"
mkdir -p "$OUT"
unpack() { python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('$G/$1.xz'), open('/tmp/$1','wb'))"; chmod +x "/tmp/$1"; }
unpack mc
if [ -e "$G/td.xz" ]; then
  unpack td
  # The tests find their fixtures under the path they were built in.
  [ -e /work/main ] || { mkdir -p /work; ln -s "$PWD" /work/main; }
  timeout 300 bash "$G/gpu-libs.sh" /tmp/td --test-threads 1 --nocapture >"$OUT/test.txt" 2>&1
  echo "cuda_quantized_decode: exit $? $(grep -E '^test result' "$OUT/test.txt")" | tee -a "$OUT/results.txt"
fi
generate() {  # MODEL QUANT [ENV...]: one bench generate, its JSON line
  local model="$1" quant="$2"; shift 2
  env "$@" timeout 240 bash "$G/gpu-libs.sh" /tmp/mc bench generate --model "$model" --device cuda --dtype bf16 \
    --quantize "$quant" --prompt-tokens 128 --new-tokens 256 --repeats "${REPEATS:-2}" --json 2>>"$OUT/log.txt" | grep '^{'
}
for m in $MODELS; do
  MC_RANDOM_TILED=1 python3 scripts/make_random_model.py "/tmp/m/$m" --preset "$m" >/dev/null
  for r in $(seq "$ROUNDS"); do
    for v in none q4k-mma q4k; do
      e=(MC_VARIANT="$v"); [ "$v" = q4k ] && e+=(METAL_CANDLE_NO_Q4K_TENSOR_CORES=1)
      line="$(generate "/tmp/m/$m" "${v%-mma}" "${e[@]}")"
      echo "$m round $r $v: $(python3 -c "import json,sys; d=json.loads(sys.argv[1] or '{}'); print(d.get('decode_tokens_per_sec'), 'tok/s, graph replays', d.get('graph_replays'))" "$line")" | tee -a "$OUT/results.txt"
    done
  done
  if [ "$m" = llama-3.1-8b ] && [ -e "$G/tl/libtimeline.so" ]; then
    for v in q4k-mma q4k; do
      e=(MC_VARIANT="$v"); [ "$v" = q4k ] && e+=(METAL_CANDLE_NO_Q4K_TENSOR_CORES=1)
      REPEATS=1 generate "/tmp/m/$m" q4k "${e[@]}" CUDA_INJECTION64_PATH="$PWD/$G/tl/libtimeline.so" TIMELINE_OUT=/tmp/tl.tsv >/dev/null
      python3 scripts/gpu_timeline/report.py /tmp/tl.tsv --by-kernel 256 >"$OUT/kernels-$m-$v.txt" 2>&1
      echo "$m $v kernels: $(head -4 "$OUT/kernels-$m-$v.txt" | tr '\n' ' ')" | tee -a "$OUT/results.txt"
    done
  fi
  rm -rf "/tmp/m/$m"
done
