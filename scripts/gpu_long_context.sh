#!/usr/bin/env bash
# Long context on a lent GPU (issue 37): the Llama-3.1-8B shape, QLoRA (our Q4_K base; Unsloth's bitsandbytes NF4),
# LoRA r8 alpha 16 on all seven linears, batch 1, gradient checkpointing (ours: --checkpointing on, plus the flags
# given; Unsloth's "unsloth" mode, which offloads to host memory), ours and Unsloth in the same call.
#
#   bash scripts/gpu_long_context.sh OUT G PLAN...
# G: the carried folder (metal-candle.xz and any other builds as NAME.xz, gpu-libs.sh, tl/, gpu_unsloth.py,
# gpu_anchor.py, unsloth-site.tar.xz). PLAN items, run in order:
#   ours:NAME:T:STEPS:CKPT[:FLAGS]  our build NAME (G/NAME.xz) at 1 x T, --checkpointing CKPT (on | offload), FLAGS:
#                               extra bench flags, commas for spaces (one warm-up step unless FLAGS has --warmup)
#   test:NAME                   a test binary G/NAME.xz built with --features cuda (cargo test --no-run)
#   unsloth:T:STEPS[:WARM[:CKPT]]  Unsloth at 1 x T (WARM warm-up steps, 2 unless given; CKPT its checkpointing,
#                               unsloth (offloaded, the default) or none)
#   ours1b:NAME:B:T:STEPS       our build at the Llama-3.2-1B shape, bf16, B x T, all linear, no checkpointing
#   unsloth1b:B:T:STEPS         Unsloth at the same 1B shape and settings
#   timeline:NAME:T:CKPT        one step of ours under the CUPTI timeline, GPU time by kernel into OUT/tl-T-CKPT.txt
# Each result line (step seconds, nvidia-smi peak MiB, and for Unsloth torch's peak allocated) goes to OUT/results.txt.
set -uo pipefail
OUT="$1"; G="$2"; shift 2; LOG="$OUT/log.txt"; RES="$OUT/results.txt"; mkdir -p "$OUT"; : >"$LOG"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$RES"
M=/tmp/m/llama-3.1-8b; M1=/tmp/m/llama-3.2-1b
if printf '%s\n' "$@" | grep -qE '^(ours|timeline):'; then
  [ -f "$M/config.json" ] || MC_RANDOM_TILED=1 python3 scripts/make_random_model.py "$M" --preset llama-3.1-8b >>"$LOG" 2>&1
  # Past Llama-3.1's 131,072 positions our runs refuse the length: the model's context is raised to the longest T
  # asked (the shape of this model's long-context variants; the rotary tables grow with it).
  longest=$(printf '%s\n' "$@" | awk -F: '$1 == "ours" && $3 > m { m = $3 } END { print m + 0 }')
  python3 -c "import json,sys; p=sys.argv[1]; c=json.load(open(p)); c['max_position_embeddings']=max(131072,int(sys.argv[2])); json.dump(c,open(p,'w'),indent=2)" "$M/config.json" "$longest"
fi
if printf '%s\n' "$@" | grep -q '^ours1b:'; then
  [ -f "$M1/config.json" ] || python3 scripts/make_random_model.py "$M1" --preset llama-3.2-1b >>"$LOG" 2>&1
fi
unpack() { [ -x "/tmp/$1" ] || { python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('$G/$1.xz'), open('/tmp/$1','wb'))"; chmod +x "/tmp/$1"; }; }
poll() { (while :; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; sleep 0.1; done) >"/tmp/$1.mem" 2>/dev/null & echo $!; }
peak() { sort -n "/tmp/$1.mem" | tail -1; }
ALL=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
ours_cmd() { local name=$1 t=$2 steps=$3 ckpt=$4 flags=${5:-}; unpack "$name"
  echo timeout 590 bash "$G/gpu-libs.sh" "/tmp/$name" bench train --model "$M" --device cuda --dtype bf16 --quantize q4k \
    --checkpointing "$ckpt" --batch-size 1 --seq-len "$t" --rank 8 --alpha 16 --targets $ALL --steps "$steps" \
    $([[ "$flags" == *--warmup* ]] || echo --warmup 1) --json ${flags//,/ }; }
ours_line() { python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(d["median_step_secs"], "s/step (median), mean", d["mean_step_secs"])' "$1" 2>&1 | tail -1; }
unsloth_site() { mkdir -p /tmp/site; [ -d /tmp/site/unsloth ] || tar -xJf "$G/unsloth-site.tar.xz" -C /tmp/site; }
for item in "$@"; do
  IFS=: read -r kind a b c d e <<<"$item"; tag="${item//[:,]/_}"; tag="${tag//--/}"; t0=$(date +%s)
  case "$kind" in
    ours)
      p=$(poll "$tag"); line=$(METAL_CANDLE_STEP_PHASES=1 $(ours_cmd "$a" "$b" "$c" "$d" "$e") 2>"/tmp/$tag.err" | grep '^{"' | tail -1)
      kill "$p"; wait "$p" 2>/dev/null
      grep "step phases" "/tmp/$tag.err" | tail -1 >>"$LOG"; tail -3 "/tmp/$tag.err" >>"$LOG"
      echo "$tag | $(ours_line "$line") | nvidia-smi peak $(peak "$tag") MiB | $(( $(date +%s) - t0 )) s" | tee -a "$RES" ;;
    ours1b)
      unpack "$a"; p=$(poll "$tag")
      line=$(timeout 590 bash "$G/gpu-libs.sh" "/tmp/$a" bench train --model "$M1" --device cuda --dtype bf16 --checkpointing off \
        --batch-size "$b" --seq-len "$c" --rank 8 --alpha 16 --targets $ALL --steps "$d" --warmup 3 --json 2>"/tmp/$tag.err" | grep '^{"' | tail -1)
      kill "$p"; wait "$p" 2>/dev/null; tail -3 "/tmp/$tag.err" >>"$LOG"
      echo "$tag | $(ours_line "$line") | nvidia-smi peak $(peak "$tag") MiB | $(( $(date +%s) - t0 )) s" | tee -a "$RES" ;;
    unsloth|unsloth1b)
      unsloth_site
      if [ "$kind" = unsloth ]; then args=(llama-8b 1 "$a" all qlora "${d:-unsloth}"); steps="$b"; warm="${c:-2}"
      else args=(llama-1b "$a" "$b" all bf16 none); steps="$c"; warm=3; fi
      p=$(poll "$tag"); line=$(PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 STEPS="$steps" WARM="$warm" timeout 590 python3 "$G/gpu_unsloth.py" "${args[@]}" 2>"/tmp/$tag.err" | grep '^{"' | tail -1)
      kill "$p"; wait "$p" 2>/dev/null; tail -3 "/tmp/$tag.err" >>"$LOG"
      echo "$tag | $line | nvidia-smi peak $(peak "$tag") MiB | $(( $(date +%s) - t0 )) s" | tee -a "$RES" ;;
    timeline)
      CUDA_INJECTION64_PATH=$PWD/$G/tl/libtimeline.so TIMELINE_OUT=/tmp/tl.tsv $(ours_cmd "$a" "$b" 1 "$c") >/dev/null 2>>"$LOG"
      python3 scripts/gpu_timeline/report.py /tmp/tl.tsv --by-kernel 2 --top 30 > "$OUT/tl-$b-$c.txt" 2>&1
      echo "$tag | timeline in tl-$b-$c.txt | $(( $(date +%s) - t0 )) s" | tee -a "$RES" ;;
    test)
      # The tests find their fixtures under the path they were built in.
      [ -e /work/main ] || { mkdir -p /work; ln -s "$PWD" /work/main; }
      unpack "$a"; timeout 300 bash "$G/gpu-libs.sh" "/tmp/$a" --test-threads 1 >"/tmp/$tag.out" 2>&1; rc=$?
      tail -5 "/tmp/$tag.out" >>"$LOG"; echo "$tag | exit $rc | $(grep -E '^test result' "/tmp/$tag.out" | tail -1)" | tee -a "$RES" ;;
  esac
done
cat "$LOG" | tail -40
