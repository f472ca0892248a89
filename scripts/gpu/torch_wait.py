"""A PyTorch process for the eBPF-mode check (scripts/gpu/ebpf.sh).

    python3 torch_wait.py late|early

Both initialise CUDA (libcuda is mapped), then:
- late: allocates nothing until SIGUSR1; then twenty tensors of 7..140 MiB, every other
  one freed, and a side stream (torch.cuda.Stream(): PyTorch makes its pool of 128 streams),
  and prints one JSON line with memory_reserved() and memory_allocated();
- early: allocates five 200 MiB tensors first (before any tracer attaches), keeps them,
  and after SIGUSR1 only asks for the device's free/total (torch.cuda.mem_get_info, one
  cuMemGetInfo_v2 call: the device sample a probe can see).
Both print "ready ..." when they wait, and wait for SIGTERM at the end.
"""
import json
import os
import signal
import sys

import torch

role = sys.argv[1]
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGTERM})
torch.cuda.init()
torch.cuda.synchronize()
keep = []
if role == "early":
    keep = [torch.empty(200 << 20, dtype=torch.uint8, device="cuda") for _ in range(5)]
    torch.cuda.synchronize()
print(json.dumps({"ready": role, "pid": os.getpid(), "reserved": torch.cuda.memory_reserved()}), flush=True)
signal.sigwait({signal.SIGUSR1})
if role != "early":
    ts = []
    for i in range(20):
        ts.append(torch.empty((7 + 7 * i) << 20, dtype=torch.uint8, device="cuda"))
    for i in range(0, 20, 2):
        ts[i] = None
    keep = [t for t in ts if t is not None]
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
free, total = torch.cuda.mem_get_info()
print(
    json.dumps(
        {
            "done": role,
            "pid": os.getpid(),
            "reserved": torch.cuda.memory_reserved(),
            "allocated": torch.cuda.memory_allocated(),
            "free": free,
            "total": total,
        }
    ),
    flush=True,
)
signal.sigwait({signal.SIGTERM})
