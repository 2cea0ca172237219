# Shared by the side-by-side benchmark scripts (bench_families.sh, bench_qlora_gpu.sh): `run`, one measurement.
# Needs DEVICE (cpu | cuda), OUT, RES (the results.jsonl), LOG and PY set by the caller.
# run TAG PRESET CMD...: its JSON line, tagged with TAG and PRESET (and on CUDA nvidia-smi's peak device memory
# during the command, MiB), is appended to RES; everything else goes to LOG. RUN_TIMEOUT: seconds per command (900).
run() {
  local tag="$1" preset="$2"; shift 2
  echo "### $preset $tag: $*" >>"$LOG"
  local t0 poll="" mem="$OUT/.mem"; t0=$(date +%s); : >"$mem"
  if [ "$DEVICE" = cuda ]; then  # the device's memory as the driver sees it, for both sides alike
    (while :; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; sleep 0.1; done) >"$mem" 2>/dev/null &
    poll=$!
  fi
  local line; line=$(timeout "${RUN_TIMEOUT:-900}" "$@" 2>>"$LOG" | grep '^{"' | tail -n1)
  [ -n "$poll" ] && { kill "$poll"; wait "$poll"; } 2>/dev/null
  local peak; peak=$(sort -n "$mem" | tail -n1)
  echo "[$(( $(date +%s) - t0 )) s, nvidia-smi peak ${peak:-n/a} MiB]" >>"$LOG"
  if [ -n "$line" ]; then
    $PY -c 'import json,sys; d=json.loads(sys.argv[1]); d.update(tag=sys.argv[2], preset=sys.argv[3])
if sys.argv[4]: d["nvidia_smi_peak_mib"] = int(sys.argv[4])
print(json.dumps(d))' "$line" "$tag" "$preset" "${peak:-}" | tee -a "$RES"
  else
    echo "{\"tag\":\"$tag\",\"preset\":\"$preset\",\"error\":\"no result (see log.txt)\"}" | tee -a "$RES"
  fi
}

