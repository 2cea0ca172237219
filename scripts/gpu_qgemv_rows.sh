#!/usr/bin/env bash
# Rows per warp of the Q4_K decode product at 8B, three builds of ops/cuda/qgemv.rs's rows_per_warp carried as
# .gpu/qv/{A,B,C}.xz (with gpu-libs.sh): A (>=16384: 4, >=8192: 2), B (>=16384: 4, >=4096: 2), C (>=4096: 4).
# Run from the repo root on the lent GPU: bash scripts/gpu_qgemv_rows.sh OUT
set -uo pipefail
OUT="$1"; G=.gpu/qv
for b in A B C; do python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('$G/$b.xz'), open('/tmp/$b','wb'))"; chmod +x /tmp/$b; done
MC_RANDOM_TILED=1 python3 scripts/make_random_model.py /tmp/m/llama-3.1-8b --preset llama-3.1-8b > /dev/null
for b in A B C; do
  v="q4k"; [ $b = A ] && v="none q4k"; [ $b = C ] && v="q4k q8_0"
  MC="bash $G/gpu-libs.sh /tmp/$b" R=2 N=256 VARIANTS="$v" timeout 300 bash scripts/bench_quant_decode_gpu.sh "$OUT/$b" 1 /tmp/m/llama-3.1-8b > /dev/null 2>&1
  echo "== $b"; python3 -c "
import json,sys
for l in open('$OUT/$b/results.jsonl'):
    d=json.loads(l); print(d['quantize'], d.get('decode_tokens_per_sec'), d.get('graph_replays'))"
done
