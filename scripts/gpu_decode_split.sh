#!/usr/bin/env bash
# Decode with the split decode attention (attn_decode_part + merge) against the build before it, same call, on
# the lent GPU: $G/D.xz (new), $G/C.xz (before), $G/td.xz (tests/cuda_decode.rs built with --features cuda,nccl),
# $G/gpu-libs.sh. The 8B shape (bf16 and Q4_K bases, 128 prompt tokens; bf16 at 4,096 prompt tokens) and the 1B
# shape, 256 new tokens, best of 2 per run. Run from the repo root: G=.gpu/qs bash scripts/gpu_decode_split.sh
# (OUT is the device's $OUT).
set -uo pipefail
G=${G:-.gpu/qs}; mkdir -p /work; ln -sfn $PWD /work/main
for b in C D td; do python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('$G/$b.xz'), open('/tmp/$b','wb'))"; chmod +x /tmp/$b; done
bash $G/gpu-libs.sh /tmp/td > $OUT/tests.txt 2>&1; grep -E "test result|FAILED|panicked|decode attention pos" $OUT/tests.txt | head -30
bench() { # NAME BUILD MODEL ROUNDS VARIANTS [P]
  MC="bash $G/gpu-libs.sh /tmp/$2" P=${6:-128} R=2 N=256 VARIANTS="$5" timeout 300 bash scripts/bench_quant_decode_gpu.sh /tmp/o/$1 $4 /tmp/m/$3 > /dev/null 2>&1
  python3 -c "
import json
for l in open('/tmp/o/$1/results.jsonl'):
    d=json.loads(l); print('$1', d['quantize'], d.get('decode_tokens_per_sec'), d.get('prefill_tokens_per_sec'))" | tee -a $OUT/decode.txt
  cp /tmp/o/$1/results.jsonl $OUT/$1.jsonl
}
MC_RANDOM_TILED=1 python3 scripts/make_random_model.py /tmp/m/8b --preset llama-3.1-8b > /dev/null
bench 8b-new D 8b 2 "none q4k"
bench 8b-old C 8b 1 "none q4k"
bench 8b-p4096-new D 8b 1 "none" 4096
bench 8b-p4096-old C 8b 1 "none" 4096
rm -rf /tmp/m/8b
MC_RANDOM_TILED=1 python3 scripts/make_random_model.py /tmp/m/1b --preset llama-3.2-1b > /dev/null
bench 1b-new D 1b 1 "none q4k"
bench 1b-old C 1b 1 "none q4k"
