#!/usr/bin/env bash
# Data-parallel training on a lent NVIDIA machine, same call: correctness and scaling against PyTorch DDP + PEFT.
#   G=.gpu/dp bash scripts/gpu_data_parallel.sh OUT [parts]   (parts: any of check,torchrun,kill,scale; default all)
# $G holds: metal-candle.xz (a --features cuda,nccl build), gpu-libs.sh (../shared/cuda), make_smollm2_hf.py,
# bench_peft_train.py, bench_ddp_peft.py and bench_ddp_unsloth.py (scripts/), and optionally unsloth-site.tar.xz
# (../shared/anchors: then Unsloth under torchrun joins the scale rows).
# - check: tiny-llama on sample-chat, f32 and bf16: one GPU against N GPUs through NCCL (--gpus 2, 4 where there are
#   that many), two ranks sharing GPU 0 summing on the host, and one rank through NCCL alone; losses, gradient norms
#   and validation losses compared step by step.
# - torchrun: the same run launched by torchrun (c10d and static rendezvous) against one process.
# - kill: two ranks started torchrun-style (no supervisor of ours): rank 1 killed with SIGKILL mid-run; rank 0 must
#   end by itself (the watchdog aborts NCCL) with an error naming rank 1, and its last checkpoint must load. Then the
#   same through --gpus 2.
# - scale: the Llama-3.2-1B shape (random bf16 weights), LoRA r8 on all seven linears, 4 x 1024 tokens per GPU:
#   our step time on 1, 2 (and 4) GPUs, and torchrun + DDP + PEFT (SDPA) and + Unsloth on the same counts; nvidia-smi
#   peaks.
# - profile (not in the default parts): the scale row's 1- and 2-GPU runs of ours under the CUPTI timeline ($G/tl, from
#   scripts/gpu_timeline/build.sh) with NCCL_DEBUG=INFO: each rank's GPU time per step, its idle gaps and NCCL's
#   transport, to see where the second GPU's step loses time.
# - tune (not in the default parts): ours on 2 GPUs at the scale row under each NCCL setting in $TUNE (";"-separated
#   lists of VAR=value, "-" for none), median step and the sum's kernel time per step.
set -uo pipefail
OUT="$1"; PARTS="${2:-check,torchrun,kill,scale}"; G="${G:-.gpu/dp}"; mkdir -p "$OUT"; LOG="$OUT/dp.txt"; W=/tmp/dpw
NGPU=$(nvidia-smi -L | wc -l)
python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('$G/metal-candle.xz'), open('/tmp/mc','wb'))"; chmod +x /tmp/mc
# The binary links libnccl.so.2, which PyTorch's nvidia-nccl wheel ships.
NCCL_LIB=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))')
export LD_LIBRARY_PATH="$NCCL_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
mc() { bash "$G/gpu-libs.sh" /tmp/mc "$@"; }
say() { echo "$@" | tee -a "$LOG"; }
rm -rf "$W"; mkdir -p "$W"
say "# gpu_data_parallel $(date -u +%FT%TZ), $NGPU GPUs: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"

compare() {  # reference.jsonl other.jsonl label
  python3 - "$1" "$2" "$3" <<'EOF' | tee -a "$LOG"
import json, sys
def ev(p):
    return [json.loads(l) for l in open(p) if l.startswith('{')]
a, b = ev(sys.argv[1]), ev(sys.argv[2])
def col(e, kind, f):
    return [x[f] for x in e if x['event'] == kind]
worst = {}
for kind, f in [('step', 'loss'), ('step', 'grad_norm'), ('eval', 'val_loss')]:
    x, y = col(a, kind, f), col(b, kind, f)
    if len(x) != len(y) or not x:
        worst[f] = f'count {len(x)} vs {len(y)}'
        continue
    worst[f] = max(abs(p - q) / max(abs(p), 1.0) for p, q in zip(x, y))
fails = [e.get('message') for e in b if e['event'] == 'failed']
print(f"{sys.argv[3]}: max relative difference " + ", ".join(f"{k} {v:.2e}" if isinstance(v, float) else f"{k} {v}" for k, v in worst.items()) + (f" FAILED {fails}" if fails else ""))
EOF
}

# The 1B rows' inputs: the Llama-3.2-1B shape with random bf16 weights, and 1200 rows of 900 random words.
ONE_B_ALL=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
one_b_inputs() {
  [ -d /tmp/llama1b ] || python3 "$G/make_smollm2_hf.py" --out /tmp/llama1b --shape llama-3.2-1b --dtype bf16 --tokenizer tests/fixtures/tiny-llama/tokenizer.json >/dev/null
  [ -f /tmp/long.jsonl ] || python3 - <<'EOF'
import json, random
random.seed(0)
words = [''.join(random.choice('abcdefghijklmnopqrstuvwxyz') for _ in range(random.randint(2, 9))) for _ in range(3000)]
with open('/tmp/long.jsonl', 'w') as f:
    for _ in range(1200):
        f.write(json.dumps({"text": ' '.join(random.choice(words) for _ in range(900))}) + '\n')
EOF
}
# Ours at the 1B rows' shape, 4 x 1024 tokens per GPU: add --batch-size, --name and any --gpus.
ONE_B="--model /tmp/llama1b --data /tmp/long.jsonl --format text --device cuda --dtype bf16 --seq-len 1024 --rank 8 --targets $ONE_B_ALL --iters 30 --warmup 2 --val-every 0 --save-every 0 --out $W --json"
if [[ $PARTS == *check* ]]; then
  T="--model tests/fixtures/tiny-llama --data assets/sample-chat --device cuda --seq-len 96 --batch-size 8 --rank 4 --targets all-linear --dropout 0 --iters 12 --val-every 4 --save-every 4 --lr 2e-3 --warmup 1 --grad-accum 2 --out $W --json"
  for dt in f32 bf16; do
    mc train $T --dtype $dt --name one-$dt >"$W/one-$dt.jsonl" 2>"$W/one-$dt.err"
    for n in 2 4; do
      [ "$NGPU" -ge $n ] || continue
      mc train $T --dtype $dt --name nccl$n-$dt --gpus $n >"$W/nccl$n-$dt.jsonl" 2>"$W/nccl$n-$dt.err"
      compare "$W/one-$dt.jsonl" "$W/nccl$n-$dt.jsonl" "$dt: $n GPUs (NCCL) vs one"
      grep -h "data-parallel" "$W/nccl$n-$dt.err" | head -1 | tee -a "$LOG"
    done
    PORT=$((29500 + RANDOM % 1000))
    for r in 0 1; do
      RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 MASTER_PORT=$PORT mc train $T --dtype $dt --name host2-$dt --sum-on-host >"$W/host2-$dt-$r.jsonl" 2>"$W/host2-$dt-$r.err" &
    done; wait
    compare "$W/one-$dt.jsonl" "$W/host2-$dt-0.jsonl" "$dt: 2 ranks on GPU 0 (host sums) vs one"
    RANK=0 WORLD_SIZE=1 MASTER_PORT=$((PORT + 1)) mc train $T --dtype $dt --name nccl1-$dt >"$W/nccl1-$dt.jsonl" 2>"$W/nccl1-$dt.err"
    compare "$W/one-$dt.jsonl" "$W/nccl1-$dt.jsonl" "$dt: 1 rank through NCCL vs one"
  done
  tail -n 3 "$W"/*.err | tail -n 40 >>"$LOG"
fi

if [[ $PARTS == *torchrun* ]]; then
  # torchrun as the launcher (--no-python), with its two rendezvous kinds: c10d (--standalone) and static (its agent
  # serves a store on MASTER_PORT; ours takes the next port). CPU ranks where there is one GPU, else one GPU each.
  DEV=cpu; [ "$NGPU" -ge 2 ] && DEV=cuda
  TR="--model tests/fixtures/tiny-llama --data assets/sample-chat --device $DEV --seq-len 96 --batch-size 8 --rank 4 --targets all-linear --dropout 0 --iters 6 --val-every 3 --save-every 3 --lr 2e-3 --warmup 1 --out $W --json"
  mc train $TR --name tr-one >"$W/tr-one.jsonl" 2>"$W/tr-one.err"
  timeout 300 torchrun --standalone --nproc-per-node 2 --no-python bash "$G/gpu-libs.sh" /tmp/mc train $TR --name tr-c10d >"$W/tr-c10d.jsonl" 2>"$W/tr-c10d.err"
  compare "$W/tr-one.jsonl" "$W/tr-c10d.jsonl" "torchrun --standalone, 2 ranks on $DEV"
  timeout 300 torchrun --nnodes 1 --node-rank 0 --master-addr 127.0.0.1 --master-port 29533 --nproc-per-node 2 --no-python bash "$G/gpu-libs.sh" /tmp/mc train $TR --name tr-static >"$W/tr-static.jsonl" 2>"$W/tr-static.err"
  compare "$W/tr-one.jsonl" "$W/tr-static.jsonl" "torchrun static rendezvous, 2 ranks on $DEV"
  tail -n 4 "$W"/tr-*.err >>"$LOG"
fi

if [[ $PARTS == *kill* && $NGPU -ge 2 ]]; then
  K="--model tests/fixtures/tiny-llama --data assets/sample-chat --device cuda --seq-len 96 --batch-size 8 --rank 4 --iters 1000000 --val-every 0 --save-every 200 --out $W"
  PORT=$((30600 + RANDOM % 1000))
  RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_PORT=$PORT mc train $K --name killed >"$W/killed-0.out" 2>"$W/killed-0.err" & P0=$!
  RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_PORT=$PORT mc train $K --name killed >"$W/killed-1.out" 2>"$W/killed-1.err" & P1=$!
  sleep 25; kill -KILL "$(pgrep -P "$P1" | head -1)"; T0=$(date +%s.%N)
  timeout 120 tail --pid="$P0" -f /dev/null; RC=$?; wait "$P0"; RC0=$?; T1=$(date +%s.%N)
  say "kill (torchrun-style): rank 0 exit $RC0 $(python3 -c "print(f'{$T1-$T0:.1f}')") s after rank 1 was killed (timeout rc $RC); its last lines:"
  tail -c 600 "$W/killed-0.err" | tee -a "$LOG"; echo | tee -a "$LOG"
  ls "$W/killed" | tee -a "$LOG"
  mc train $K --name killed2 --gpus 2 >"$W/killed2.out" 2>"$W/killed2.err" & L=$!
  # The launcher and its two ranks carry `--name killed2`; rank 1 started last.
  sleep 25; kill -KILL "$(pgrep -f 'name killed2' | sort -n | tail -1)"; wait "$L"; say "kill (--gpus 2): launcher exit $?"
  tail -c 800 "$W/killed2.err" | tee -a "$LOG"; echo | tee -a "$LOG"
  LAST=$(ls -d "$W"/killed/checkpoint-* 2>/dev/null | sort -V | tail -1)
  [ -n "$LAST" ] && mc train --resume "$LAST" --device cuda --iters $(( ${LAST##*-} + 5 )) --json 2>&1 | grep -c '"event":"step"' | sed 's/^/resumed steps after the kill: /' | tee -a "$LOG"
fi

if [[ $PARTS == *scale* ]]; then
  one_b_inputs
  anchor() {  # label name gpus script: a torchrun anchor at the same shape, its JSON line and the nvidia-smi peak
    local P; P=$(peak "$W/$2$3.mem")
    timeout 500 torchrun --standalone --nproc-per-node "$3" "$4" --model /tmp/llama1b --global-batch-size $((4 * $3)) --seq-len 1024 --rank 8 --targets $ONE_B_ALL --steps 20 --warmup 3 --dtype bf16 2>"$W/$2$3.err" | tail -1 >"$W/$2$3.json"
    kill "$P"
    python3 - "$W/$2$3.json" "$1" "$3" "$(sort -n "$W/$2$3.mem" | tail -1)" <<'EOF' | tee -a "$LOG"
import json, sys
try:
    d = json.loads(open(sys.argv[1]).read())
    print(f"{sys.argv[2]} {sys.argv[3]} GPU(s): median step {d['median_step_secs']:.4f} s, {d['tokens_per_sec']:.0f} tokens/s, peak {sys.argv[4]} MiB (busiest GPU), torch {d.get('torch')}")
except Exception as e:
    print(f"{sys.argv[2]} {sys.argv[3]} GPU(s): failed ({e})")
EOF
  }
  peak() { (while :; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | sort -n | tail -1; sleep 0.1; done) >"$1" 2>/dev/null & echo $!; }
  for n in 1 2 4; do
    [ "$NGPU" -ge $n ] || continue
    GPUS=""; [ $n -gt 1 ] && GPUS="--gpus $n"
    P=$(peak "$W/ours$n.mem")
    mc train $ONE_B --batch-size $((4 * n)) --name scale$n $GPUS >"$W/scale$n.jsonl" 2>"$W/scale$n.err"
    kill $P
    python3 - "$W/scale$n.jsonl" "$n" "$(sort -n "$W/ours$n.mem" | tail -1)" <<'EOF' | tee -a "$LOG"
import json, sys, statistics
ev = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
steps = [e for e in ev if e['event'] == 'step']
t = [b['elapsed_secs'] - a['elapsed_secs'] for a, b in zip(steps, steps[1:])][5:]
n = int(sys.argv[2]); med = statistics.median(t) if t else float('nan')
print(f"ours {n} GPU(s): median step {med:.4f} s, {4*n*1024/med:.0f} tokens/s, last loss {steps[-1]['loss'] if steps else None:.4f}, peak {sys.argv[3]} MiB (busiest GPU)")
EOF
    anchor "torch DDP + PEFT" ddp "$n" "$G/bench_ddp_peft.py"
    [ -f "$G/unsloth-site.tar.xz" ] || continue
    [ -d /tmp/site ] || { mkdir -p /tmp/site && tar -xJf "$G/unsloth-site.tar.xz" -C /tmp/site; }
    PYTHONPATH=/tmp/site anchor "Unsloth (torch DDP)" unsloth "$n" "$G/bench_ddp_unsloth.py"
  done
  tail -n 5 "$W"/scale*.err "$W"/ddp*.err "$W"/unsloth*.err >>"$LOG" 2>/dev/null
fi
if [[ $PARTS == *profile* ]]; then
  one_b_inputs
  for n in 1 2; do
    GPUS=""; [ $n -gt 1 ] && GPUS="--gpus $n"
    NCCL_DEBUG=INFO CUDA_INJECTION64_PATH="$PWD/$G/tl/libtimeline.so" TIMELINE_OUT="$W/tl$n-%d.tsv" mc train $ONE_B --batch-size $((4 * n)) --name prof$n $GPUS >"$W/prof$n.jsonl" 2>"$W/prof$n.err"
    grep -hE "via|NCCL INFO comm .* nRanks" "$W/prof$n.jsonl" "$W/prof$n.err" | head -8 | tee -a "$LOG"
    for f in "$W"/tl$n-*.tsv; do
      say "== $n GPU(s), $(basename "$f") =="
      python3 scripts/gpu_timeline/report.py "$f" --every-read --steps 8 --top 6 2>&1 | head -40 | tee -a "$LOG"
      python3 scripts/gpu_timeline/report.py "$f" --by-kernel 30 2>&1 | head -14 | tee -a "$LOG"
    done
  done
fi
if [[ $PARTS == *tune* ]]; then
  one_b_inputs
  IFS=';' read -ra VARIANTS <<<"${TUNE:--}"
  for round in 1 2; do
    for v in "${VARIANTS[@]}"; do
      envs=(); [ "$v" = - ] || read -ra envs <<<"$v"
      tag=$(echo "$v" | tr -c 'A-Za-z0-9\n' _)
      env "${envs[@]}" bash "$G/gpu-libs.sh" /tmp/mc train $ONE_B --batch-size 8 --name tune-$round-$tag --gpus 2 >"$W/tune.jsonl" 2>"$W/tune-$tag.err"
      grep -o '{"event":"step".*' "$W/tune.jsonl" | python3 -c "
import sys, json, statistics
e = [json.loads(l) for l in sys.stdin]
t = [b['elapsed_secs'] - a['elapsed_secs'] for a, b in zip(e, e[1:])][5:-1]
print(f'tune round $round [$v]: median step {statistics.median(t) * 1000:.2f} ms over {len(t)} steps')" 2>&1 | tee -a "$LOG"
    done
  done
fi
cp "$W"/*.jsonl "$W"/*.err "$OUT"/ 2>/dev/null
cat "$LOG"
