#!/usr/bin/env bash
# Download throughput of `metal-candle hub download` beside huggingface_hub's snapshot_download, from the same
# local Hub stand-in (examples/hub_server.rs) on 127.0.0.1, alternating, each into a fresh cache; then the peak
# memory of each. Usage: scripts/bench_hub_download.sh [SIZE_MIB=1024] [ROUNDS=3]
# Needs: cargo build --release --examples; Python 3 with huggingface_hub; /usr/bin/time.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SIZE_MIB="${1:-1024}"
ROUNDS="${2:-3}"
PY="${PYTHON:-python3}"
BIN="$ROOT/target/release/metal-candle"
SERVER="$ROOT/target/release/examples/hub_server"
WORK="$(mktemp -d)"
trap 'kill $SERVER_PID 2>/dev/null || true; rm -rf "$WORK"' EXIT

mkdir -p "$WORK/repo"
head -c $((SIZE_MIB << 20)) /dev/urandom > "$WORK/repo/model.safetensors"
echo '{"model_type": "llama"}' > "$WORK/repo/config.json"
"$SERVER" --model org/big="$WORK/repo" > "$WORK/server.txt" &
SERVER_PID=$!
for _ in $(seq 100); do grep -q listening "$WORK/server.txt" 2>/dev/null && break; sleep 0.2; done
URL="$(sed -n 's/^listening on //p' "$WORK/server.txt")"
export HF_ENDPOINT="$URL" HF_HUB_DISABLE_XET=1 HF_HUB_DISABLE_TELEMETRY=1 HF_HUB_DISABLE_PROGRESS_BARS=1
echo "file: ${SIZE_MIB} MiB from $URL; $(nproc) cores; huggingface_hub $("$PY" -c 'import huggingface_hub as h; print(h.__version__)')"

timed() { # label, command...: prints seconds and peak RSS
  local label="$1"; shift
  local t0 t1
  t0=$(date +%s.%N)
  /usr/bin/time -f "%M" -o "$WORK/rss" "$@" > /dev/null
  t1=$(date +%s.%N)
  python3 -c "import sys; s=$t1-$t0; print(f'{sys.argv[1]:<16} {s:7.2f} s  {${SIZE_MIB}/s:8.1f} MiB/s  peak RSS {int(open(sys.argv[2]).read().split()[-1])/1024:7.1f} MiB')" "$label" "$WORK/rss"
}
for round in $(seq "$ROUNDS"); do
  rm -rf "$WORK/ours" "$WORK/theirs"
  HF_HUB_CACHE="$WORK/ours" timed "metal-candle" "$BIN" hub download org/big
  HF_HUB_CACHE="$WORK/theirs" timed "huggingface_hub" "$PY" -c "import huggingface_hub as h; h.snapshot_download('org/big')"
done
