"""One program, run under `vramhook run` in each of PyTorch's three allocator modes (the mode
comes from PYTORCH_CUDA_ALLOC_CONF; MODE is only a label): twenty tensors of 7..140 MiB, every
other one freed, a synchronize (cuda-facts.md's pattern). Then, at one point: a quiet wait
longer than VRAMHOOK_MEMINFO_MS and one torch.cuda.mem_get_info(), where the interposer
samples the device and the pools; there the program reads memory_reserved() and NVML's
per-process used bytes, prints them as one JSON line, and leaves at once (os._exit: nothing
happens after the point, so vramhook's numbers at the end are its numbers at the point).

With POOLS_PROBE_STEPS=1 it also prints a "step" line (the device's free bytes, NVML's bytes
for this process, memory_reserved()) after CUDA is initialised, after the first 2 MiB tensor,
after a torch.cuda.Stream() (PyTorch's stream pool) and after the twenty: where, in each mode, the bytes beyond the allocator's reserve appear.

usage: pools_probe.py MODE [WAIT_S]"""
import ctypes
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from torch_patterns import twenty_every_other_freed  # noqa: E402

mode = sys.argv[1]
wait_s = float(sys.argv[2]) if len(sys.argv) > 2 else 1.5


def nvml_processes():
    """[(pid, used bytes)] of the compute processes on GPU 0, by pynvml or else ctypes."""
    try:
        import pynvml  # noqa: PLC0415

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        return "pynvml", [(p.pid, p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
    except Exception as e:  # noqa: BLE001 (no pynvml: fall back to the library)
        first_error = repr(e)

    class Info(ctypes.Structure):  # nvmlProcessInfo_v2_t / v3: pid, used, gpu instance, compute instance
        _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                    ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]

    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    if nvml.nvmlInit_v2() != 0:
        raise RuntimeError("nvmlInit_v2 failed (pynvml: %s)" % first_error)
    dev = ctypes.c_void_p()
    if nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) != 0:
        raise RuntimeError("nvmlDeviceGetHandleByIndex_v2 failed")
    for name in ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"):
        fn = getattr(nvml, name, None)
        if fn is None:
            continue
        count = ctypes.c_uint(64)
        infos = (Info * 64)()
        if fn(dev, ctypes.byref(count), infos) == 0:
            return "ctypes:" + name, [(infos[i].pid, infos[i].usedGpuMemory) for i in range(count.value)]
    raise RuntimeError("nvmlDeviceGetComputeRunningProcesses failed")


def my_nvml_bytes():
    source, procs = nvml_processes()
    mine = [used for pid, used in procs if pid == os.getpid()]
    if not mine and len(procs) == 1:
        mine = [procs[0][1]]
    return mine[0] if mine else None


STEPS = os.environ.get("POOLS_PROBE_STEPS") == "1"


def step(name):
    if not STEPS:
        return
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    print(json.dumps({"phase": "step", "step": name, "mode": mode, "device_free": free, "device_total": total,
                      "nvml_used": my_nvml_bytes(), "reserved": torch.cuda.memory_reserved()}), flush=True)


torch.cuda.init()
step("initialised")
# Only with the steps: the program under vramhook stays the one measured before.
first = torch.empty(2 << 20, dtype=torch.uint8, device="cuda") if STEPS else None
step("first 2 MiB tensor")
# A stream from PyTorch's stream pool: the async backend takes one when it starts on a
# device, which makes the pool's streams; in the other modes this step makes them.
side = torch.cuda.Stream() if STEPS else None
step("torch.cuda.Stream()")
tensors = twenty_every_other_freed()
step("twenty tensors, every other one freed")
# The point: quiet, then one cuMemGetInfo (the interposer samples the device and pools there).
time.sleep(wait_s)
free, total = torch.cuda.mem_get_info()
reserved, allocated = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
source, procs = nvml_processes()
mine = [used for pid, used in procs if pid == os.getpid()]
note = "by pid"
if not mine and len(procs) == 1:
    mine, note = [procs[0][1]], "the only compute process (pid namespaces differ)"
print(json.dumps({"phase": "point", "mode": mode, "pid": os.getpid(), "reserved": reserved, "allocated": allocated,
                  "device_free": free, "device_total": total, "nvml_used": mine[0] if mine else None,
                  "nvml_source": source, "nvml_match": note, "nvml_processes": procs,
                  "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}), flush=True)
os._exit(0)
