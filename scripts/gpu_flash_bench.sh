#!/usr/bin/env bash
# The fused attention kernels alone on a lent GPU, builds side by side (scripts/flash_kernel_bench.cu):
#   scripts/gpu_flash_bench.sh OUT BEFORE AFTER [MORE...]   (flash_kernel_bench binaries built here)
# Both shapes of the 1B table (1 x 4096 and 4 x 1024; SHAPES="B T,B T,..." for others), two rounds alternating, then
# the largest difference between each later build's outputs and the first's (bf16 outputs; lse in f32). HEAD_DIM=128
# in the environment times Llama-3.1-8B's heads instead of Llama-3.2-1B's. Writes OUT/bench.txt.
set -u
OUT="$1"; shift; mkdir -p "$OUT" /tmp/flash-dumps
IFS=, read -r -a shapes <<<"${SHAPES:-1 4096,4 1024}"
for s in "${shapes[@]}"; do for r in 1 2; do for b in "$@"; do
  echo "## $(basename "$b") $s"; "$b" $s 20 "/tmp/flash-dumps/$(basename "$b")-${s// /x}"
done; done; done >"$OUT/bench.txt" 2>&1
python3 - "${SHAPES:-1 4096,4 1024}" "$@" >>"$OUT/bench.txt" <<'PY'
import os, sys
import numpy as np
shapes = [s.strip().replace(" ", "x") for s in sys.argv[1].split(",")]
names = [os.path.basename(b) for b in sys.argv[2:]]
for other in names[1:]:
    for shape in shapes:
        for name in ["out", "lse", "dq", "dk", "dv"]:
            dt = np.float32 if name == "lse" else np.uint16
            a = np.fromfile(f"/tmp/flash-dumps/{names[0]}-{shape}-{name}.bin", dt)
            b = np.fromfile(f"/tmp/flash-dumps/{other}-{shape}-{name}.bin", dt)
            if dt == np.uint16:  # bf16 bits to f32
                a = (a.astype(np.uint32) << 16).view(np.float32)
                b = (b.astype(np.uint32) << 16).view(np.float32)
            print(other, "vs", names[0], shape, name, "max |diff|", float(np.max(np.abs(a - b))),
                  "max |first|", float(np.max(np.abs(a))), "(identical)" if np.array_equal(a, b) else "")
PY
cat "$OUT/bench.txt"
