#!/usr/bin/env bash
# The quantized decode product's launch shape (ops/cuda/qgemv.rs's launch_shape: rows per warp, warps per row),
# A/B over builds that differ only in it, carried as $G/NAME.xz with $G/gpu-libs.sh. For each model (the 8B shape,
# then the 1B shape), the first build also decodes the bf16 base; every build decodes the Q4_K base (`bench
# generate`, 128 prompt + 256 new tokens, best of 2). Run from the repo root on the lent GPU:
#   G=.gpu/qs BUILDS="O A B" bash scripts/gpu_qgemv_rows.sh OUT
# (2026-11-29's rows-per-warp call was G=.gpu/qv BUILDS="A B C", the 8B shape only.)
set -uo pipefail
OUT="$1"; G="${G:-.gpu/qv}"; BUILDS="${BUILDS:-A B C}"; MODELS="${MODELS:-llama-3.1-8b llama-3.2-1b}"
for b in $BUILDS; do python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('$G/$b.xz'), open('/tmp/$b','wb'))"; chmod +x /tmp/$b; done
for m in $MODELS; do
  MC_RANDOM_TILED=1 python3 scripts/make_random_model.py /tmp/m/$m --preset $m > /dev/null
  first=1
  for b in $BUILDS; do
    v="q4k"; [ $first = 1 ] && v="none q4k"; first=0
    MC="bash $G/gpu-libs.sh /tmp/$b" R=2 N=256 VARIANTS="$v" timeout 300 bash scripts/bench_quant_decode_gpu.sh "$OUT/$m-$b" 1 /tmp/m/$m > /dev/null 2>&1
    echo "== $m $b"; python3 -c "
import json,sys
for l in open('$OUT/$m-$b/results.jsonl'):
    d=json.loads(l); print(d['quantize'], d.get('decode_tokens_per_sec'), d.get('graph_replays'))"
  done
  rm -rf /tmp/m/$m
done
