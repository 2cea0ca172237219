#!/usr/bin/env bash
# The fused attention kernels alone on a lent GPU, two builds side by side (scripts/flash_kernel_bench.cu):
#   scripts/gpu_flash_bench.sh OUT BEFORE AFTER     (BEFORE, AFTER: flash_kernel_bench binaries built here)
# Both shapes of the 1B table (1 x 4096 and 4 x 1024), two rounds alternating, then the largest difference
# between the two builds' outputs (bf16 outputs; lse in f32). Writes OUT/bench.txt.
set -u
OUT="$1"; A="$2"; B="$3"; mkdir -p "$OUT" /tmp/flash-dumps
for s in "1 4096" "4 1024"; do for r in 1 2; do for b in "$A" "$B"; do
  echo "## $(basename "$b") $s"; "$b" $s 20 "/tmp/flash-dumps/$(basename "$b")-${s// /x}"
done; done; done >"$OUT/bench.txt" 2>&1
python3 - "$(basename "$A")" "$(basename "$B")" >>"$OUT/bench.txt" <<'PY'
import sys
import numpy as np
a_name, b_name = sys.argv[1:]
for shape in ["1x4096", "4x1024"]:
    for name in ["out", "lse", "dq", "dk", "dv"]:
        dt = np.float32 if name == "lse" else np.uint16
        a = np.fromfile(f"/tmp/flash-dumps/{a_name}-{shape}-{name}.bin", dt)
        b = np.fromfile(f"/tmp/flash-dumps/{b_name}-{shape}-{name}.bin", dt)
        if dt == np.uint16:  # bf16 bits to f32
            a = (a.astype(np.uint32) << 16).view(np.float32)
            b = (b.astype(np.uint32) << 16).view(np.float32)
        print(shape, name, "max |diff|", float(np.max(np.abs(a - b))), "max |before|", float(np.max(np.abs(a))),
              "(identical)" if np.array_equal(a, b) else "")
PY
cat "$OUT/bench.txt"
