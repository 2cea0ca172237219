#!/usr/bin/env bash
# Variants of the portable graph (`--kernels portable`, what a Mac runs), chosen by build and environment variables,
# beside the native step, on a lent GPU. $G/new.xz is the build (`--features cuda,nccl`) unless a variant names
# another; VARIANTS is a space-separated list of NAME[@BUILD][:VAR=VALUE[,VAR=VALUE...]] (BUILD: $G/BUILD.xz; the
# native step runs with new). For each variant:
# correctness (tiny fixtures on CUDA, 20 steps with dropout, the largest loss difference from the native run), then
# ROUNDS rounds (2) of the Llama-3.2-1B-shaped step (bf16, LoRA r8; 4 x 1024 on all linears, 1 x 4096 on q,v),
# native median of 10 steps and each variant's of 6, after 2 warm-up steps, nvidia-smi peaks; last a CUPTI kernel
# profile by kernel and grid of the variant named by PROFILE (default: the last) at 4 x 1024 ($G/tl holds
# libtimeline.so). Run from the repo root: G=DIR VARIANTS="before@before new" bash scripts/gpu_portable_variants.sh OUT
set -uo pipefail
OUT="$1"; G="${G:-.gpu/px}"; mkdir -p "$OUT"; LOG="$OUT/round.txt"
VARIANTS="${VARIANTS:-base}"
for x in $G/*.xz; do b=$(basename "$x" .xz); python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('$x'), open('/tmp/$b','wb'))"; chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$LOG"
env_of() {  # NAME[:VAR=VALUE,...] -> "VAR=VALUE VAR=VALUE" (or X=1)
  local spec="$1"; [[ "$spec" == *:* ]] && echo "${spec#*:}" | tr ',' ' ' || echo "X=1"
}
name_of() { local n="${1%%:*}"; echo "${n%%@*}"; }
build_of() { local n="${1%%:*}"; [[ "$n" == *@* ]] && echo "${n#*@}" || echo new; }
for run in "tiny-llama f32" "tiny-llama bf16" "tiny-llama f16" "tiny-gemma3 bf16" "tiny-llama bf16 --packing"; do
  set -- $run; arch=$1; d=$2; extra="${3:-}"; tag="${arch}_${d}${extra:+_packed}"
  for v in native $VARIANTS; do
    if [ "$v" = native ]; then k=native; e="X=1"; n=native; bin=new
    else k=portable; e=$(env_of "$v"); n=$(name_of "$v"); bin=$(build_of "$v"); fi
    env $e timeout 120 bash $G/gpu-libs.sh /tmp/$bin train --model tests/fixtures/$arch --data assets/sample-chat --iters 20 \
      --batch-size 4 --seq-len 96 --lr 1e-2 --targets all-linear --rank 4 --alpha 8 --dropout 0.1 --save-every 0 \
      --val-every 10 --seed 0 --device cuda --dtype $d --json --out "$(mktemp -d)" --name t --kernels $k $extra \
      > /tmp/train_${tag}_$n.out 2>/tmp/train_${tag}_$n.err
  done
  python3 - "$tag" $(for v in $VARIANTS; do name_of "$v"; done) >> "$LOG" <<'PY'
import json, sys
a = sys.argv[1]
def losses(k): return [json.loads(l)["loss"] for l in open(f"/tmp/train_{a}_{k}.out") if '"event":"step"' in l]
x = losses("native")
for k in sys.argv[2:]:
    y = losses(k)
    diff = max(abs(p - q) for p, q in zip(x, y)) if x and y else None
    print(f"{a} {k}: steps {len(x)} {len(y)} max |loss diff| vs native {diff} last {x[-1:]} {y[-1:]}")
PY
done
python3 scripts/make_random_model.py /tmp/m/llama-3.2-1b --preset llama-3.2-1b > /dev/null
ALL=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
run() {  # label kernels batch seq targets steps env build
  (while :; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; sleep 0.1; done) >"/tmp/$1.mem" 2>/dev/null &
  local poll=$!
  local line; line=$(env $7 timeout 150 bash $G/gpu-libs.sh /tmp/$8 bench train --model /tmp/m/llama-3.2-1b --device cuda \
    --dtype bf16 --batch-size "$3" --seq-len "$4" --rank 8 --targets "$5" --steps "$6" --warmup 2 --kernels "$2" --json \
    2>"/tmp/$1.err" | tail -1)
  kill "$poll"; wait "$poll" 2>/dev/null
  local res; res=$(echo "$line" | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print(d["median_step_secs"], "s/step, loss", d["last_loss"])' 2>&1 | tail -1)
  echo "$1 | $res | peak $(sort -n "/tmp/$1.mem" | tail -1) MiB" | tee -a "$LOG"
}
for r in $(seq 1 "${ROUNDS:-2}"); do
  run native_4x1024_$r native 4 1024 $ALL 10 X=1 new
  for v in $VARIANTS; do run "$(name_of "$v")_4x1024_$r" portable 4 1024 $ALL 6 "$(env_of "$v")" "$(build_of "$v")"; done
  run native_1x4096_$r native 1 4096 q_proj,v_proj 10 X=1 new
  for v in $VARIANTS; do run "$(name_of "$v")_1x4096_$r" portable 1 4096 q_proj,v_proj 6 "$(env_of "$v")" "$(build_of "$v")"; done
done
P="${PROFILE:-${VARIANTS##* }}"
for v in $VARIANTS; do [ "$(name_of "$v")" = "$P" ] && PE=$(env_of "$v") && PB=$(build_of "$v"); done
env ${PE:-X=1} CUDA_INJECTION64_PATH=$PWD/$G/tl/libtimeline.so TIMELINE_OUT=/tmp/tl.tsv timeout 200 bash $G/gpu-libs.sh \
  /tmp/${PB:-new} bench train --model /tmp/m/llama-3.2-1b --device cuda --dtype bf16 --batch-size 4 --seq-len 1024 --rank 8 \
  --targets $ALL --steps 2 --warmup 1 --kernels portable --json 2>/dev/null | tail -1 >> "$LOG"
python3 scripts/gpu_timeline/report.py /tmp/tl.tsv --by-grid 3 --top 80 > "$OUT/$P-by-grid.txt"
xz -T4 -6 -c /tmp/tl.tsv > "$OUT/$P-timeline.tsv.xz"
cat "$LOG"; head -50 "$OUT/$P-by-grid.txt"
