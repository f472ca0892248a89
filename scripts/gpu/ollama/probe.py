#!/usr/bin/env python3
"""NVML per-process usage, vramhook's live bytes and ollama's /api/ps, read together (issue #12).

    probe.py sample OUT.jsonl STOPFILE     every 100 ms until STOPFILE exists: NVML per process
                                           and, when an agent answers, its live bytes per process
    probe.py checkpoint NAME OUT.jsonl     one reading of all three, plus the agent's processes,
                                           arenas and incidents in full
    probe.py hold LEAVE_MIB READYFILE RELEASEFILE   hold all but LEAVE_MIB of the GPU (PyTorch)
    probe.py context READYFILE RELEASEFILE          a process that holds only its CUDA context
"""
import json
import os
import sys
import time
import urllib.request

AGENT = "http://127.0.0.1:9464/api/v1/state"
OLLAMA = "http://127.0.0.1:11434/api/ps"


def get(url, timeout=2.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return json.loads(r.read())
    except Exception as e:  # noqa: BLE001 - a reading that failed is recorded as such
        return {"error": str(e)}


def nvml_procs():
    import pynvml
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    out = {}
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
        out[str(p.pid)] = p.usedGpuMemory
    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
    return out, {"total": mem.total, "used": mem.used, "free": mem.free}


def agent_live(state):
    snap = state.get("snapshot") or {}
    return {
        str(p["pid"]): {"live": p["live_bytes"], "alive": p["alive"], "command": p["command"][:200],
                        "ppid": p.get("ppid"), "by_class": p["live_by_class"]}
        for p in snap.get("processes", [])
    }


def reading(full):
    t = time.monotonic_ns()
    nv, dev = nvml_procs()
    st = get(AGENT)
    r = {"t_ns": t, "wall": time.time(), "nvml": nv, "nvml_device": dev, "live": agent_live(st)}
    if full:
        r["ps"] = get(OLLAMA)
        snap = st.get("snapshot") or {}
        r["arenas"] = snap.get("arenas", [])
        r["incidents"] = [{k: v for k, v in i.items() if k != "lead_up"} for i in snap.get("incidents", [])]
        r["devices"] = snap.get("devices", [])
        r["agent_error"] = st.get("error")
    return r


def main():
    cmd = sys.argv[1]
    if cmd in ("sample", "checkpoint"):
        import pynvml
        pynvml.nvmlInit()
    if cmd == "sample":
        out, stop = sys.argv[2], sys.argv[3]
        with open(out, "a") as f:
            while not os.path.exists(stop):
                f.write(json.dumps(reading(False)) + "\n")
                f.flush()
                time.sleep(0.1)
    elif cmd == "checkpoint":
        name, out = sys.argv[2], sys.argv[3]
        r = reading(True)
        r["name"] = name
        with open(out, "a") as f:
            f.write(json.dumps(r) + "\n")
        ps = r["ps"].get("models", []) if isinstance(r["ps"], dict) else []
        print(f"checkpoint {name}: ps {[(m['name'], m['size_vram']) for m in ps]} nvml {r['nvml']} "
              f"live { {k: v['live'] for k, v in r['live'].items() if v['alive']} }", flush=True)
    elif cmd == "hold":
        import torch
        leave = int(sys.argv[2]) << 20
        free, total = torch.cuda.mem_get_info()
        x = torch.empty(free - leave, dtype=torch.uint8, device="cuda")
        free2, _ = torch.cuda.mem_get_info()
        print(json.dumps({"pid": os.getpid(), "held": x.numel(), "free_before": free, "free_after": free2,
                          "total": total}), flush=True)
        open(sys.argv[3], "w").close()
        while not os.path.exists(sys.argv[4]):
            time.sleep(0.1)
    elif cmd == "context":
        import ctypes
        import glob
        lib = (glob.glob("/usr/local/cuda/lib64/libcudart.so.13*") + glob.glob("/usr/local/cuda*/targets/x86_64-linux/lib/libcudart.so.13*"))[0]
        rt = ctypes.CDLL(lib)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        assert rt.cudaFree(None) == 0
        assert rt.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)) == 0
        print(json.dumps({"pid": os.getpid(), "cudart": lib, "free": free.value}), flush=True)
        open(sys.argv[2], "w").close()
        while not os.path.exists(sys.argv[3]):
            time.sleep(0.1)


if __name__ == "__main__":
    main()
