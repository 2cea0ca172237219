#!/usr/bin/env bash
# The longest context that trains at batch 1 within a device-memory cap, ours against Unsloth, found by bisection in
# one call on a lent 2-GPU machine (issue 37): ours on GPU 0, Unsloth on GPU 1, at the same time. The Llama-3.1-8B
# shape (random weights), QLoRA (our Q4_K base, `--checkpointing offload`; Unsloth's bitsandbytes NF4 base and its
# offloaded "unsloth" checkpointing), LoRA r8 alpha 16 on all seven linears, one training step a probe.
#
#   bash scripts/gpu_context_limit.sh OUT G CAP_MIB SECONDS OURS_LO:OURS_HI UNSLOTH_LO:UNSLOTH_HI
# G: the carried folder (metal-candle.xz, gpu-libs.sh, gpu_unsloth.py, gpu_anchor.py, unsloth-site.tar.xz).
# CAP_MIB: the device memory each side meets free (scripts/gpu_ballast.py holds the rest of its GPU, started after
# the models are made). SECONDS: when both sides stop probing, from the script's start. LO:HI: each side's bracket,
# LO assumed to fit and HI not; probes are multiples of 1,024 tokens, and a side stops when its bracket is 1,024
# wide or the next probe (estimated from the last one) would run past SECONDS.
# A probe fits when its step finishes with a finite loss, fails on the device's out-of-memory error, and anything
# else stops that side with the error in OUT/log.txt. Each probe's line (tokens, result, step seconds, the GPU's
# peak memory above the ballast from nvidia-smi every 100 ms, seconds) and each side's answer go to OUT/results.txt.
set -uo pipefail
OUT="$1"; G="$2"; CAP="$3"; SECONDS_LEFT="$4"; OURS_BRACKET="$5"; UNSLOTH_BRACKET="$6"
export CUDA_DEVICE_ORDER=PCI_BUS_ID  # CUDA numbers the GPUs as nvidia-smi does
START=$(date +%s); DEADLINE=$((START + SECONDS_LEFT)); GRAN=1024
LOG="$OUT/log.txt"; RES="$OUT/results.txt"; mkdir -p "$OUT"; : >"$LOG"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tee "$RES"
echo "cap: $CAP MiB free on each GPU; deadline $SECONDS_LEFT s" | tee -a "$RES"
M=/tmp/m/llama-3.1-8b; ALL=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
  UNSLOTH_DISABLE_STATISTICS=1

# The models, both at once: ours on the CPU, Unsloth's bf16 folder on GPU 1 (16 GB on the device while it is made,
# so before the ballast).
python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('$G/metal-candle.xz'), open('/tmp/mc','wb'))"; chmod +x /tmp/mc
mkdir -p /tmp/site; tar -xJf "$G/unsloth-site.tar.xz" -C /tmp/site
( [ -f "$M/config.json" ] || MC_RANDOM_TILED=1 python3 scripts/make_random_model.py "$M" --preset llama-3.1-8b ) >>"$LOG" 2>&1 &
ours_model=$!
CUDA_VISIBLE_DEVICES=1 python3 -c "import sys; sys.path.insert(0, '$G'); import gpu_unsloth; print(gpu_unsloth.folder('llama-8b'))" \
  >>"$LOG" 2>&1
wait "$ours_model"
echo "models made: $(( $(date +%s) - START )) s" | tee -a "$RES"

# The ballast on each GPU.
ballasts=()
for gpu in 0 1; do
  rm -f "/tmp/ballast$gpu"
  CUDA_VISIBLE_DEVICES=$gpu python3 scripts/gpu_ballast.py "$CAP" "/tmp/ballast$gpu" >>"$LOG" 2>&1 &
  ballasts+=($!)
done
for gpu in 0 1; do
  for _ in $(seq 120); do [ -s "/tmp/ballast$gpu" ] && break; sleep 0.5; done
  echo "GPU $gpu ballast: free/total MiB $(cat "/tmp/ballast$gpu" 2>/dev/null || echo 'not ready')" | tee -a "$RES"
done

used_mib() { nvidia-smi -i "$1" --query-gpu=memory.used --format=csv,noheader,nounits; }

# probe SIDE GPU T LIMIT: one step at 1 x T; prints "fit STEP_S", "oom" or "error".
probe() {
  local side=$1 gpu=$2 t=$3 limit=$4 tag="$1-$3" line
  if [ "$side" = ours ]; then
    CUDA_VISIBLE_DEVICES=$gpu timeout "$limit" bash "$G/gpu-libs.sh" /tmp/mc bench train --model "$M" --device cuda \
      --dtype bf16 --quantize q4k --checkpointing offload --batch-size 1 --seq-len "$t" --rank 8 --alpha 16 \
      --targets $ALL --steps 1 --warmup 0 --json >"/tmp/$tag.out" 2>"/tmp/$tag.err"
    line=$(grep '^{"' "/tmp/$tag.out" | tail -1)
    step=$(python3 -c 'import json,math,sys; d=json.loads(sys.argv[1]); print(d["median_step_secs"] if math.isfinite(d["last_loss"]) else "")' "$line" 2>/dev/null)
  else
    CUDA_VISIBLE_DEVICES=$gpu STEPS=1 WARM=0 timeout "$limit" python3 "$G/gpu_unsloth.py" llama-8b 1 "$t" all qlora unsloth \
      >"/tmp/$tag.out" 2>"/tmp/$tag.err"
    line=$(grep '^{"' "/tmp/$tag.out" | tail -1)
    step=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1]).get("median_s", ""))' "$line" 2>/dev/null)
  fi
  { echo "== $tag"; tail -4 "/tmp/$tag.err"; echo "$line"; } >>"$LOG"
  if [ -n "$step" ]; then echo "fit $step"
  elif grep -qiE 'out of memory|OUT_OF_MEMORY|OutOfMemoryError' "/tmp/$tag.err" "/tmp/$tag.out"; then echo oom
  else echo error; fi
}

# bisect SIDE GPU LO:HI
bisect() {
  local side=$1 gpu=$2 lo=${3%%:*} hi=${3##*:} last=150 t0 result base peak pid mid
  while (( hi - lo > GRAN )); do
    mid=$(( (lo + hi) / 2 / GRAN * GRAN ))
    (( mid <= lo )) && mid=$((lo + GRAN))
    local now; now=$(date +%s)
    if (( now + last * 5 / 4 > DEADLINE )); then echo "$side: stopped, the next probe ($mid) would pass the deadline" | tee -a "$RES"; break; fi
    base=$(used_mib "$gpu"); t0=$now
    (while :; do used_mib "$gpu"; sleep 0.1; done) >"/tmp/$side.mem" 2>/dev/null & pid=$!
    result=$(probe "$side" "$gpu" "$mid" $((DEADLINE - now)))
    kill "$pid"; wait "$pid" 2>/dev/null
    peak=$(( $(sort -n "/tmp/$side.mem" | tail -1) - base )); last=$(( $(date +%s) - t0 ))
    echo "$side 1x$mid | ${result} | peak above the ballast $peak MiB | $last s" | tee -a "$RES"
    case "$result" in
      fit*) lo=$mid ;;
      oom) hi=$mid ;;
      *) echo "$side: stopped on an error at $mid (log.txt)" | tee -a "$RES"; break ;;
    esac
  done
  echo "$side ANSWER: longest that fit $lo, shortest that failed $hi (bracket given ${3})" | tee -a "$RES"
}

bisect ours 0 "$OURS_BRACKET" & a=$!
bisect unsloth 1 "$UNSLOTH_BRACKET" & b=$!
wait "$a" "$b"
kill "${ballasts[@]}" 2>/dev/null
tail -30 "$LOG"
