#!/usr/bin/env bash
# Lent-GPU rounds for the fused CUDA attention and the training-step comparison against PyTorch, run on the device
# machine from the repo root with a carried folder $G (default .gpu-cuda) that holds:
#   metal-candle.xz, cuda_attention.xz, cuda_decode.xz, cuda_optimizer.xz
#                              this build (--no-default-features --features cuda), xz'd
#   gpu-libs.sh                ../shared/cuda/gpu-libs.sh (LD_LIBRARY_PATH to PyTorch's CUDA libraries)
#   smollm2_tokenizer.json     a tokenizer for the random model folders
#   liger_kernel-*.whl         Liger kernels (installed into /tmp/site; triton and torch are on the machine)
#   bench_peft_train.py, make_smollm2_hf.py   copies of scripts/ of the same commit
# Modes (each one device call; logs under $2, a summary in $2/round.txt, every step's output in $2/raw.tar.xz):
#   check   the fused attention against autograd (tests/cuda_attention.rs), the fused decode and prefill against
#           the CPU (tests/cuda_decode.rs), the optimizer and the head loss (tests/cuda_optimizer.rs), tiny-llama
#           training native vs portable (f32 and bf16), and our step on the Llama-3.2-1B shape (4 x 1024,
#           1 x 4096; all-linear, q,v), alternating with the previous build ($G/metal-candle-prev.xz) when
#           carried; one run with phases, one without the fused attention
#   table SHAPE   SHAPE = 1b-4x1024 | 1b-1x4096 | smollm2-8x512 | 3b-4x1024 | 3b-1x4096 (Llama-3.2-3B's shape,
#           head_dim 128): for q,v and all-linear, alternating ours,
#           torch+PEFT (SDPA), torch+PEFT+Liger (SDPA) twice, then torch+PEFT eager once; 20 steps after 3
#   decode SHAPE  SHAPE = 1b | smollm2: greedy decode of 128 + 256 tokens, ours (bf16, fused decode) against
#           transformers generate (bf16, SDPA), alternating, ROUNDS (default 2) times
#   Peak GPU memory for every step: nvidia-smi memory.used polled every 0.1 s (the whole device, as the
#   driver sees it); PyTorch also reports torch.cuda.max_memory_allocated/reserved.
set -uo pipefail
MODE="$1"; DEST="$2"; SHAPE="${3:-}"; G="${G:-.gpu-cuda}"
RAW=/tmp/round-$MODE$SHAPE; mkdir -p "$RAW" "$DEST"; LOG="$DEST/round.txt"
unxz() { python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" "$1" "$2"; chmod +x "$2"; }
for b in metal-candle cuda_attention cuda_decode cuda_optimizer; do [ -f "$G/$b.xz" ] && unxz "$G/$b.xz" "/tmp/$b"; done
MC="bash $G/gpu-libs.sh /tmp/metal-candle"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$G"/liger_kernel-*.whl \
  && export PYTHONPATH=/tmp/site
step() {
  local name="$1"; shift; echo "### $name" >>"$LOG"; echo "\$ $*" >>"$LOG"
  (while :; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; sleep 0.1; done) >"$RAW/$name.mem" 2>/dev/null &
  local poll=$! t0; t0=$(date +%s.%N)
  timeout 300 "$@" >"$RAW/$name.out" 2>"$RAW/$name.err"; local rc=$?
  kill "$poll" 2>/dev/null; wait "$poll" 2>/dev/null
  grep -v '^\s*$' "$RAW/$name.out" | tail -n 30 >>"$LOG"
  echo "[rc=$rc, $(python3 -c "print(round($(date +%s.%N)-$t0,1))")s, nvidia-smi peak $(sort -n "$RAW/$name.mem" | tail -1) MiB; stderr tail:]" >>"$LOG"
  tail -n 30 "$RAW/$name.err" >>"$LOG"; echo >>"$LOG"
}
echo "# gpu_attention_round $MODE $SHAPE $(date -u +%FT%TZ)" >"$LOG"
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv >>"$LOG"
make_model() {  # $1 smollm2 | 1b | 3b
  case "$1" in
    smollm2) [ -d /tmp/smollm2 ] || step make_smollm2 python3 "$G/make_smollm2_hf.py" --out /tmp/smollm2 --tokenizer "$G/smollm2_tokenizer.json" ;;
    1b) [ -d /tmp/llama1b ] || step make_llama1b python3 "$G/make_smollm2_hf.py" --out /tmp/llama1b --shape llama-3.2-1b --dtype bf16 --tokenizer "$G/smollm2_tokenizer.json" ;;
    3b) [ -d /tmp/llama3b ] || step make_llama3b python3 "$G/make_smollm2_hf.py" --out /tmp/llama3b --shape llama-3.2-3b --dtype bf16 --tokenizer "$G/smollm2_tokenizer.json" ;;
  esac
}
ours() {  # name model batch seq targets [extra flags]
  local name=$1 m=$2 b=$3 t=$4 tg=$5; shift 5
  step "$name" $MC bench train --model "$m" --device cuda --dtype bf16 --batch-size "$b" --seq-len "$t" --rank 8 --targets "$tg" --steps 20 --warmup 3 --json "$@"
}
theirs() {  # name model batch seq targets [extra flags]
  local name=$1 m=$2 b=$3 t=$4 tg=$5; shift 5
  step "$name" python3 "$G/bench_peft_train.py" --hf-dir "$m" --device cuda --dtype bf16 --batch-size "$b" --seq-len "$t" --rank 8 --targets "$tg" --steps 20 --warmup 3 "$@"
}
ALL=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
case "$MODE" in
check)
  step cuda_attention_test bash "$G/gpu-libs.sh" /tmp/cuda_attention --test-threads 1 --nocapture
  step cuda_decode_test bash "$G/gpu-libs.sh" /tmp/cuda_decode --test-threads 1
  step cuda_optimizer_test bash "$G/gpu-libs.sh" /tmp/cuda_optimizer --test-threads 1 --nocapture
  T="--model tests/fixtures/tiny-llama --data assets/sample-chat --iters 20 --batch-size 4 --seq-len 96 --lr 1e-2 --targets all-linear --rank 4 --alpha 8 --dropout 0.1 --save-every 0 --val-every 10 --seed 0 --device cuda --json"
  for d in f32 bf16; do for k in native portable; do
    step "train_tiny_${d}_$k" $MC train $T --dtype $d --out "$(mktemp -d)" --name t --kernels $k
  done; done
  python3 - "$RAW" >>"$LOG" <<'PY'
import json, sys
raw = sys.argv[1]
def losses(n): return [json.loads(l)["loss"] for l in open(f"{raw}/{n}.out") if '"event":"step"' in l]
for d in ("f32", "bf16"):
    a, b = losses(f"train_tiny_{d}_native"), losses(f"train_tiny_{d}_portable")
    print(f"### tiny-llama {d} 20 steps native vs portable: steps {len(a)}/{len(b)}, max |loss diff|",
          max(abs(x - y) for x, y in zip(a, b)) if a and b else None, "first/last", a[:1], a[-1:], b[-1:])
PY
  make_model 1b
  # Before/after in one call: $G/metal-candle-prev.xz (the previous build), when carried, alternates with this one.
  [ -f "$G/metal-candle-prev.xz" ] && unxz "$G/metal-candle-prev.xz" /tmp/metal-candle-prev
  for shape in "4 1024" "1 4096"; do set -- $shape; for tg in $ALL q_proj,v_proj; do
    short=$([ "$tg" = "$ALL" ] && echo all || echo qv)
    for r in 1 2; do
      [ -x /tmp/metal-candle-prev ] && MC="bash $G/gpu-libs.sh /tmp/metal-candle-prev" ours "prev_1b_$1x$2_${short}_$r" /tmp/llama1b $1 $2 $tg
      ours "ours_1b_$1x$2_${short}_$r" /tmp/llama1b $1 $2 $tg
    done
  done; done
  ours ours_1b_4x1024_all_phases /tmp/llama1b 4 1024 $ALL --step-phases
  ours ours_1b_1x4096_all_composed /tmp/llama1b 1 4096 $ALL --no-fused-attention
  ;;
decode)
  make_model "$SHAPE"; M=$([ "$SHAPE" = 1b ] && echo /tmp/llama1b || echo /tmp/smollm2)
  for r in $(seq 1 "${ROUNDS:-2}"); do
    step "ours_decode_$r" $MC bench generate --model "$M" --device cuda --dtype bf16 --prompt-tokens 128 --new-tokens 256 --repeats 3 --json
    step "transformers_decode_$r" python3 "$G/bench_transformers_generate.py" --hf-dir "$M" --device cuda --dtype bf16 --prompt-tokens 128 --new-tokens 256 --repeats 3
  done
  ;;
table)
  case "$SHAPE" in
    1b-4x1024) make_model 1b; M=/tmp/llama1b; B=4; T=1024 ;;
    1b-1x4096) make_model 1b; M=/tmp/llama1b; B=1; T=4096 ;;
    smollm2-8x512) make_model smollm2; M=/tmp/smollm2; B=8; T=512 ;;
    3b-1x4096) make_model 3b; M=/tmp/llama3b; B=1; T=4096 ;;
    3b-4x1024) make_model 3b; M=/tmp/llama3b; B=4; T=1024 ;;
    *) echo "unknown shape $SHAPE" >>"$LOG"; exit 2 ;;
  esac
  # ROUNDS (default 2), TARGETS (default "q_proj,v_proj $ALL") and EAGER (default 1) trim a table to fit a call.
  for tg in ${TARGETS:-q_proj,v_proj $ALL}; do
    short=$([ "$tg" = "$ALL" ] && echo all || echo qv)
    for r in $(seq 1 "${ROUNDS:-2}"); do
      ours "ours_${short}_$r" $M $B $T $tg
      theirs "sdpa_${short}_$r" $M $B $T $tg
      theirs "liger_${short}_$r" $M $B $T $tg --liger
    done
    [ "${EAGER:-1}" = 1 ] && theirs "eager_${short}" $M $B $T $tg --attn eager
  done
  ;;
esac
python3 - "$RAW" >>"$LOG" <<'PY'
import glob, json, os, sys
raw = sys.argv[1]
print("### summary: name | s/step (ours: median; torch: mean, median) | nvidia-smi peak MiB | torch max allocated / reserved GiB")
for out in sorted(glob.glob(f"{raw}/*.out")):
    name = os.path.basename(out)[:-4]
    rows = [json.loads(l) for l in open(out) if l.startswith("{")]
    mem = [int(x) for x in open(f"{raw}/{name}.mem").read().split() if x.isdigit()] if os.path.exists(f"{raw}/{name}.mem") else []
    peak = max(mem) if mem else None
    for r in rows:
        if "decode_tokens_per_sec" in r or "decode_tok_s" in r:
            print(name, "| decode", {k: round(v, 1) for k, v in r.items() if "tok" in k and isinstance(v, (int, float))}, "|", peak)
        if "mean_step_s" in r or "mean_step_secs" in r:
            s = {k: round(v, 4) for k, v in r.items() if k.startswith(("mean_step", "median_step", "min_step"))}
            alloc = r.get("peak_memory_bytes") if r.get("peak_memory_kind") == "cuda_max_memory_allocated" else None
            res = r.get("peak_memory_reserved_bytes")
            gib = lambda b: None if b is None else round(b / 2**30, 2)
            print(name, "|", s, "|", peak, "|", gib(alloc), "/", gib(res))
PY
tar -C "$RAW" -cJf "$DEST/raw.tar.xz" . 2>/dev/null
echo "done $(date -u +%FT%TZ)" >>"$LOG"
