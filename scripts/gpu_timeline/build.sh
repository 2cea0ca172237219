#!/usr/bin/env bash
# Build the CUPTI timeline injection library (timeline.c) here, for a lent NVIDIA machine: fetches CUPTI 13.0
# from PyPI (nvidia-cuda-cupti, headers and libcupti.so.13) and compiles against the CUDA 13 headers of
# ../shared/cuda's toolkit. Writes DEST/libtimeline.so and DEST/libcupti.so.13 (found next to it at run time).
#   bash scripts/gpu_timeline/build.sh DEST
set -euo pipefail
DEST=${1:?destination folder}
HERE=$(cd "$(dirname "$0")" && pwd)
CUDA_HOME=${CUDA_HOME:-$HOME/.cache/cuda13-toolkit/cuda13}
WORK=$(mktemp -d)
python3 -m pip download -q --no-deps -d "$WORK" "nvidia-cuda-cupti==13.0.85"
python3 -m zipfile -e "$WORK"/nvidia_cuda_cupti-*.whl "$WORK/x"
CUPTI="$WORK/x/nvidia/cu13"
mkdir -p "$DEST"
cp "$CUPTI/lib/libcupti.so.13" "$DEST/"
gcc -O2 -shared -fPIC -I"$CUPTI/include" -I"$CUDA_HOME/include" "$HERE/timeline.c" -o "$DEST/libtimeline.so" \
  "$DEST/libcupti.so.13" -Wl,-rpath,'$ORIGIN'
rm -rf "$WORK"
ls -la "$DEST"
