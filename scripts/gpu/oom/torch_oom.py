"""Real PyTorch OOMs on the GPU machine, for the verdict and log-parser fixtures.

usage: torch_oom.py SCENARIO OUTDIR
  fragmented  fill the GPU with 1 GiB tensors, free them, keep 600 MiB in each cached
              segment, then ask for 2 GiB (reserved-but-unallocated large, split below
              the request); dumps PyTorch's snapshot at the OOM
  capacity    ask for more than the whole GPU with an empty cache
  victim      ask for 24 GiB while another process (`holder`) holds most of the GPU
  holder      take all but about 16 GiB of the GPU and hold it until OUTDIR/release exists

The allocator mode comes from PYTORCH_CUDA_ALLOC_CONF. Prints JSON lines with PyTorch's
own numbers (reserved, allocated, memory_stats at the OOM); PyTorch's message goes to
stderr as an uncaught exception would, so the log is the real thing."""
import json
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from torch_patterns import whole_gib_segments_cached  # noqa: E402

scenario, outdir = sys.argv[1], sys.argv[2]
GiB = 1 << 30
MiB = 1 << 20


def numbers(phase, **extra):
    stats = torch.cuda.memory_stats()
    free, total = torch.cuda.mem_get_info()
    line = {"phase": phase, "scenario": scenario, "pid": os.getpid(),
            "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
            "reserved": torch.cuda.memory_reserved(), "allocated": torch.cuda.memory_allocated(),
            "inactive_split": stats.get("inactive_split_bytes.all.current", 0),
            "segments": stats.get("segment.all.current", 0), "device_free": free, "device_total": total}
    line.update(extra)
    print(json.dumps(line), flush=True)


def oom(request, snapshot=None):
    """Asks for `request` bytes; on OOM prints PyTorch's numbers, dumps the snapshot and
    re-raises so the traceback lands in the log exactly as a service's would."""
    try:
        return torch.empty(request, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError:
        numbers("oom", request=request)
        if snapshot:
            torch.cuda.memory._dump_snapshot(snapshot)
        raise


default_mode = not os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
if scenario == "fragmented":
    if default_mode:  # cudaMallocAsync cannot record history; the snapshot is the default mode's
        torch.cuda.memory._record_memory_history(max_entries=200000)
    n = whole_gib_segments_cached()
    keep = [torch.empty(600 * MiB, dtype=torch.uint8, device="cuda") for _ in range(n)]
    torch.cuda.synchronize()
    numbers("filled", segments_made=n)
    snap = os.path.join(outdir, "torch_fragmented_snapshot.pickle") if default_mode else None
    x = oom(2 * GiB, snap)
    numbers("no_oom")  # expandable segments: the request fits
    sys.exit(0)
elif scenario == "capacity":
    free, total = torch.cuda.mem_get_info()
    oom(total + 8 * GiB)
elif scenario == "holder":
    free, total = torch.cuda.mem_get_info()
    hold = torch.empty(free - 16 * GiB, dtype=torch.uint8, device="cuda")
    numbers("holding")
    open(os.path.join(outdir, "holding"), "w").close()
    while not os.path.exists(os.path.join(outdir, "release")):
        time.sleep(0.05)
elif scenario == "victim":
    keep = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")
    oom(24 * GiB)
