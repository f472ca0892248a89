"""Issue #26 on the GPU machine: one process holds memory, another asks for more than is free.

  python3 holders.py hold GIB READY STOP   reserve GIB 1 GiB tensors in PyTorch's cache, free
                                           them all (memory_reserved() stays, allocated 0),
                                           write READY, wait for STOP (at most 300 s)
  python3 holders.py ask GIB               ask PyTorch for one GIB tensor; its OOM message goes
                                           to stderr (the crash log), exit 1 when it fails
  python3 holders.py reserve               the driver's reserve: fill the device with 1 GiB,
                                           then 2 MiB cudaMalloc calls (CuPy's runtime) until
                                           they fail; the free bytes the driver reported then
Each prints one JSON line on stdout with the framework's own numbers.
"""
import json
import os
import sys
import time


def hold(gib, ready, stop):
    import torch
    ts = [torch.empty(1 << 30, dtype=torch.uint8, device="cuda") for _ in range(gib)]
    del ts
    torch.cuda.synchronize()
    print(json.dumps({"pid": os.getpid(), "reserved": torch.cuda.memory_reserved(),
                      "allocated": torch.cuda.memory_allocated()}), flush=True)
    open(ready, "w").close()
    deadline = time.time() + 300
    while not os.path.exists(stop) and time.time() < deadline:
        time.sleep(0.1)


def ask(gib):
    import torch
    free, total = torch.cuda.mem_get_info()
    try:
        x = torch.empty(gib << 30, dtype=torch.uint8, device="cuda")
        del x
        print(json.dumps({"pid": os.getpid(), "fitted": True, "free": free}), flush=True)
        return 0
    except torch.cuda.OutOfMemoryError as e:
        sys.stderr.write("torch.OutOfMemoryError: %s\n" % (e,))
        print(json.dumps({"pid": os.getpid(), "fitted": False, "free": free, "total": total}), flush=True)
        return 1


def reserve():
    import cupy
    rt = cupy.cuda.runtime
    held, last = [], None
    for chunk in (1 << 30, 2 << 20):
        while True:
            try:
                held.append(rt.malloc(chunk))
            except cupy.cuda.runtime.CUDARuntimeError:
                last = (chunk, rt.memGetInfo()[0])
                break
    print(json.dumps({"last_failed_request": last[0], "free_at_failure": last[1], "allocations": len(held)}))
    for p in held:
        rt.free(p)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "hold":
        hold(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    elif mode == "ask":
        sys.exit(ask(int(sys.argv[2])))
    elif mode == "reserve":
        reserve()
