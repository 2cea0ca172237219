"""Holds a GPU's memory but for CAP MiB, so that a process started after it meets a GPU of about CAP MiB free:
the longest-context bisection of scripts/gpu_context_limit.sh runs ours and Unsloth on a smaller card this way.

    python3 scripts/gpu_ballast.py CAP_MIB READY_FILE     (CUDA_VISIBLE_DEVICES picks the GPU)

Allocates with torch in blocks of 1 GiB, then 256, 64 and 16 MiB, while the driver's free memory stays above CAP;
writes "free_MiB total_MiB" to READY_FILE once done, then sleeps until killed. What it holds is never touched again:
the process that runs next sees CAP to CAP + 16 MiB free, its own CUDA context included (as on a card of that size).
"""
import sys
import time

import torch

cap = int(sys.argv[1]) * 2**20
held = []
for size in (1 << 30, 256 << 20, 64 << 20, 16 << 20):
    while torch.cuda.mem_get_info()[0] - size >= cap:
        held.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
free, total = torch.cuda.mem_get_info()
with open(sys.argv[2], "w") as ready:
    ready.write(f"{free // 2**20} {total // 2**20}\n")
while True:
    time.sleep(3600)
