"""The PyTorch lens's cost on a real GPU.

lens_bench.py calls            µs per memory_stats() and per memory._snapshot() (the lens's
                               sample and its largest-free-block pass), with the cache of a
                               training-like loop
lens_bench.py loop MODE ROUND  median step time of a loop of allocations served by the cache
                               (at least 10,000 a second), as a JSON line"""
import json
import statistics
import sys
import time

import torch

MiB = 1 << 20


def make_cache():
    keep = [torch.empty((i % 64 + 1) * MiB, dtype=torch.uint8, device="cuda") for i in range(2000)]
    for i in range(0, len(keep), 3):
        keep[i] = None
    torch.cuda.synchronize()
    return keep


if sys.argv[1] == "calls":
    keep = make_cache()
    torch.cuda.memory_stats()
    n = 200
    t = time.perf_counter()
    for _ in range(n):
        torch.cuda.memory_stats(0)
    stats_us = (time.perf_counter() - t) / n * 1e6
    t = time.perf_counter()
    m = 10
    for _ in range(m):
        snap = torch.cuda.memory._snapshot()
        free = [b["size"] for s in snap["segments"] for b in s["blocks"] if not b["state"].startswith("active")]
        max(free, default=0)
    snapshot_us = (time.perf_counter() - t) / m * 1e6
    segs = len(snap["segments"])
    blocks = sum(len(s["blocks"]) for s in snap["segments"])
    print(json.dumps({"memory_stats_us": stats_us, "snapshot_scan_us": snapshot_us, "segments": segs, "blocks": blocks}))
else:
    mode, rnd = sys.argv[2], int(sys.argv[3])
    keep = make_cache()
    steps, per_step = 400, 100
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        for j in range(per_step):
            x = torch.empty((j % 32 + 1) * MiB, dtype=torch.uint8, device="cuda")
            del x
        times.append(time.perf_counter() - t)
    med = statistics.median(times)
    print(json.dumps({"mode": mode, "round": rnd, "median_step_s": med, "allocs_per_s": per_step / med,
                      "steps": steps, "lens": "vramhook_lens" in sys.modules}), flush=True)
