#!/usr/bin/env bash
# One lent-GPU round, run on the device machine from the repo root, with the folder .gpu/ carried beside it:
#   .gpu/metal-candle.xz      this build (--no-default-features --features cuda), xz-compressed
#   .gpu/cuda_decode.xz       the tests/cuda_decode.rs test binary of the same build
#   .gpu/gpu-libs.sh          ../shared/cuda/gpu-libs.sh (sets LD_LIBRARY_PATH to PyTorch's CUDA libraries)
#   .gpu/smollm2_tokenizer.json
# Correctness: the fused decode against the CPU (tests/cuda_decode.rs); the fast path and the portable op graph
# (--kernels portable: what a Mac runs) train with the same losses and decode the same ids. Speed, alternating
# ours and PyTorch's in one call: decode (f32, bf16) against transformers, the training step (bf16 8 x 512, r8
# q,v) against torch+PEFT, and the portable graph's decode and step as the nearest measurable proxy for Metal.
#   bash scripts/gpu_round.sh "$OUT"
set -uo pipefail
# Each step's full output stays in /tmp/gpu-round; the log (commands, output tails) is written to $1.
OUT=/tmp/gpu-round; mkdir -p "$OUT"; LOG="${1:-$OUT}/gpu-round.txt"
unxz() { python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" "$1" "$2"; chmod +x "$2"; }
unxz .gpu/metal-candle.xz /tmp/metal-candle; unxz .gpu/cuda_decode.xz /tmp/cuda_decode
MC="bash .gpu/gpu-libs.sh /tmp/metal-candle"
step() { local name="$1"; shift; echo "### $name" >>"$LOG"; echo "\$ $*" >>"$LOG"; local t0=$(date +%s.%N)
  timeout 240 "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"; local rc=$?
  grep -v '^\s*$' "$OUT/$name.out" | tail -n 40 >>"$LOG"
  echo "[rc=$rc, $(python3 -c "print(round($(date +%s.%N)-$t0,1))")s; stderr tail:]" >>"$LOG"; tail -n 6 "$OUT/$name.err" >>"$LOG"; echo >>"$LOG"; }
echo "# gpu_round $(date -u +%FT%TZ)" >"$LOG"; nvidia-smi --query-gpu=name,driver_version --format=csv >>"$LOG"
step make_random python3 scripts/make_smollm2_hf.py --out /tmp/smollm2-random --tokenizer .gpu/smollm2_tokenizer.json
step cuda_decode_test bash .gpu/gpu-libs.sh /tmp/cuda_decode --test-threads 1
T="--model tests/fixtures/tiny-llama --data assets/sample-chat --iters 20 --batch-size 4 --seq-len 96 --lr 1e-2 --targets all-linear --rank 4 --alpha 8 --dropout 0.1 --save-every 0 --val-every 10 --seed 0 --device cuda --dtype f32 --json"
for k in native portable; do
  step "train_tiny_$k" $MC train $T --out "$(mktemp -d)" --name t --kernels $k
  step "generate_tiny_$k" $MC generate --model tests/fixtures/tiny-llama --prompt "Once upon a time" --max-tokens 24 --temperature 0 --ignore-eos --device cuda --dtype f32 --json --kernels $k
done
python3 - "$OUT" >>"$LOG" <<'PY'
import json, sys
out = sys.argv[1]
def losses(k): return [json.loads(l)["loss"] for l in open(f"{out}/train_tiny_{k}.out") if '"event":"step"' in l]
a, b = losses("native"), losses("portable")
print("### train losses native vs portable (tiny-llama, CUDA f32, 20 steps, dropout 0.1)")
print("steps", len(a), len(b), "max |diff|", max(abs(x - y) for x, y in zip(a, b)) if a and b else None)
ids = [json.loads(open(f"{out}/generate_tiny_{k}.out").read())["generated_ids"] for k in ("native", "portable")]
print("greedy ids native vs portable identical:", ids[0] == ids[1], ids[0])
PY
M=/tmp/smollm2-random
for round in 1 2; do
  for d in f32 bf16; do
    step "gen_${d}_ours_$round" $MC bench generate --model $M --device cuda --dtype $d --repeats 5 --json
    step "gen_${d}_transformers_$round" python3 scripts/bench_transformers_generate.py --hf-dir $M --device cuda --dtype $d --repeats 5
  done
  B="--model $M --device cuda --dtype bf16 --batch-size 8 --seq-len 512 --rank 8 --targets q_proj,v_proj --steps 10 --warmup 3 --json"
  step "train_ours_$round" $MC bench train $B
  step "train_peft_$round" python3 scripts/bench_peft_train.py --hf-dir $M --device cuda --dtype bf16 --batch-size 8 --seq-len 512 --rank 8 --targets q_proj,v_proj --steps 10 --warmup 3
done
step gen_bf16_portable $MC bench generate --model $M --device cuda --dtype bf16 --repeats 5 --json --kernels portable
step train_portable $MC bench train $B --kernels portable
echo "done $(date -u +%FT%TZ)" >>"$LOG"
