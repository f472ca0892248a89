"""PyTorch's caching allocator in one of its three modes, as cuda-facts.md measured it:
twenty tensors of 7..140 MiB, every other one freed, then a 200 GiB request that must
fail. Prints JSON lines with PyTorch's own numbers for the checker.

usage: torch_modes.py MODE [SNAPSHOT.pickle]
MODE is only a label; the allocator mode comes from PYTORCH_CUDA_ALLOC_CONF."""
import json
import sys

import torch
from torch_patterns import twenty_every_other_freed

mode = sys.argv[1]
snapshot = sys.argv[2] if len(sys.argv) > 2 else None
if snapshot:
    torch.cuda.memory._record_memory_history(max_entries=100000)

tensors = twenty_every_other_freed()
print(json.dumps({"phase": "allocated", "mode": mode, "reserved": torch.cuda.memory_reserved(),
                  "allocated": torch.cuda.memory_allocated()}), flush=True)
message = None
try:
    big = torch.empty(200 << 30, dtype=torch.uint8, device="cuda")
except torch.OutOfMemoryError as e:
    message = str(e)
print(json.dumps({"phase": "oom", "mode": mode, "message": message, "reserved": torch.cuda.memory_reserved(),
                  "allocated": torch.cuda.memory_allocated()}), flush=True)
if snapshot:
    torch.cuda.memory._dump_snapshot(snapshot)
    torch.cuda.memory._record_memory_history(enabled=None)
