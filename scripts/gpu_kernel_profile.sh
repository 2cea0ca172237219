#!/usr/bin/env bash
# Per-kernel GPU time of one of our commands on a lent NVIDIA GPU, through Nsight Compute (ncu, on the lent
# machines' image; nsys is not): every profiled kernel's gpu__time_duration, summed by kernel name, next to the
# command's own wall time. ncu serialises kernels, so the sum is the GPU's busy time without launch gaps; the
# difference to the unprofiled wall time is what the host's launches cost.
#
#   scripts/gpu_kernel_profile.sh OUT SKIP COUNT -- COMMAND...
# SKIP kernels are run unprofiled first (model load, warm-up), then COUNT are profiled. Writes OUT/kernels.csv
# (ncu's raw CSV) and OUT/summary.txt (kernel name, launches, total ms, share), and prints the summary.
# BY_GRID=1 keys the summary by kernel name and grid size (e.g. to tell apart one kernel's matrix shapes).
set -uo pipefail
OUT="$1"; SKIP="$2"; COUNT="$3"; shift 3; [ "$1" = "--" ] && shift
mkdir -p "$OUT"
NCU="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
"$NCU" --metrics gpu__time_duration.sum --csv --clock-control none --cache-control none \
  --launch-skip "$SKIP" --launch-count "$COUNT" --log-file "$OUT/kernels.csv" "$@" >"$OUT/command.out" 2>"$OUT/command.err"
echo "ncu rc=$?" >>"$OUT/command.err"
BY_GRID="${BY_GRID:-0}" python3 - "$OUT/kernels.csv" <<'PY' | tee "$OUT/summary.txt"
import csv, os, sys
from collections import defaultdict
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
head, rows = rows[0], rows[1:]
name, unit, value = head.index("Kernel Name"), head.index("Metric Unit"), head.index("Metric Value")
grid = head.index("Grid Size") if os.environ.get("BY_GRID") == "1" and "Grid Size" in head else None
scale = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0}
by = defaultdict(lambda: [0, 0.0])
for r in rows:
    if len(r) != len(head) or r[unit] not in scale:
        continue
    k = r[name][:90] + (f" grid {r[grid]}" if grid is not None else "")
    by[k][0] += 1
    by[k][1] += float(r[value].replace(",", "")) * scale[r[unit]]
total = sum(v[1] for v in by.values())
print(f"{len(rows)} kernels, {total:.2f} ms of GPU time")
for k, (n, ms) in sorted(by.items(), key=lambda kv: -kv[1][1])[:40]:
    print(f"{ms:9.3f} ms {100 * ms / total:5.1f}% {n:6d}x  {k}")
PY
