"""The lens's stacks on the GPU machine (issue #10): fragments PyTorch's cache as
torch_oom.py does (1 GiB tensors until full, freed, 600 MiB kept in each cached segment from
one line, `KEEP`), then asks for 2 GiB from another (`ASK`). Run under `vramhook run` with
VRAMHOOK_LENS_STACKS=1: the lens records PyTorch's memory history and dumps its snapshot at
the OOM. Prints a JSON line with the lines, the numbers and the file names.
    stacks_oom.py                  the OOM case
    stacks_oom.py bench            the cost of memory history: µs per allocation and free of a
                                   cache-served 1 MiB tensor, history off, then on (python stacks)"""
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from torch_patterns import whole_gib_segments_cached  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30


def bench():
    def loop(n=20000):
        x = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        del x
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            x = torch.empty(MiB, dtype=torch.uint8, device="cuda")
            del x
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / n * 1e6

    rounds = []
    for _ in range(5):
        torch.cuda.memory._record_memory_history(enabled=None)
        off = loop()
        torch.cuda.memory._record_memory_history(stacks="python", max_entries=100000)
        on = loop()
        rounds.append((off, on))
    torch.cuda.memory._record_memory_history(enabled=None)
    offs, ons = sorted(r[0] for r in rounds), sorted(r[1] for r in rounds)
    print(json.dumps({"bench": "memory_history", "us_per_alloc_free_off": offs[2], "us_per_alloc_free_on": ons[2],
                      "rounds": rounds}), flush=True)


if len(sys.argv) > 1 and sys.argv[1] == "bench":
    bench()
    sys.exit(0)

n = whole_gib_segments_cached()
KEEP = sys._getframe().f_lineno + 1
keep = [torch.empty(600 * MiB, dtype=torch.uint8, device="cuda") for _ in range(n)]
torch.cuda.synchronize()
print(json.dumps({"phase": "filled", "segments": n, "keep_line": KEEP, "ask_line": KEEP + 4, "file": __file__,
                  "allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved()}), flush=True)
x = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")  # ASK: fails (fragmented cache)
