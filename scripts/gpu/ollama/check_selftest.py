#!/usr/bin/env python3
"""Does check.py fail on a real mismatch? A self-test on a made-up run directory (nothing here
is a result): one consistent run, shaped like run.sh's (a runner of each engine, the context
process, warm_probe, the holder, the failing case), must pass every check; each mutation (a
missed 2 MiB allocation, bytes counted that NVML does not hold, an NVML figure 2% off, the
holder not first, a discovery child with a ring) must make check.py exit 1 naming that check.
    python3 scripts/gpu/ollama/check_selftest.py
"""
import json
import os
import subprocess
import sys
import tempfile

M = 1 << 20
CHECK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check.py")
CUBLAS = 1024 + 131072 + 64 * M  # what cublasCreate allocated on the H200
COLD = 518 * M


def runner_cmd(new):
    return f"/tmp/vho/dist/bin/ollama runner {'--ollama-engine ' if new else ''}--model /tmp/vho/models/blobs/sha256-aaaa --port 1"


def write_mode(R, name, new, agent=True, mutate=None):
    mutate = mutate or {}
    D = f"{R}/{name}"
    os.makedirs(D, exist_ok=True)
    rp, wp, cp, hp = 669, 700, 701, 660
    open(f"{D}/serve-pids.txt", "w").write("main 553\n")
    if new:
        plain, vmm = 888 * M, 68 * M
        size_vram = plain + vmm - CUBLAS + 132 * M
    else:
        plain, vmm = 608 * M + 64 * M + 68 * M + CUBLAS, 70 * M
        size_vram = 824 * M
    plain += mutate.get("live_delta", 0)
    live = plain + vmm
    log = ['time=x level=INFO msg="starting runner" cmd="/tmp/vho/dist/bin/ollama runner --ollama-engine --port 3"\n',
           'time=x level=INFO source=types.go msg="inference compute" id=GPU library=CUDA\n',
           f'time=x level=INFO msg="starting runner" cmd="{runner_cmd(new)}"\n']
    gpu = (888 + 68 - 64.127) if new else 692.0
    if not new:
        log += ["load_tensors:        CUDA0 model buffer size =   608.00 MiB\n",
                "llama_kv_cache:      CUDA0 KV buffer size =    64.00 MiB\n",
                "llama_context:      CUDA0 compute buffer size =    68.00 MiB\n",
                "load_tensors: offloaded 5/5 layers to GPU\n"]
    else:
        log += ['time=x level=INFO msg="offloaded 5/5 layers to GPU"\n']
    log += [f'time=x level=INFO msg="model weights" device=CUDA0 size="{gpu - 132:.1f} MiB"\n',
            'time=x level=INFO msg="model weights" device=CPU size="128.0 MiB"\n',
            'time=x level=INFO msg="kv cache" device=CUDA0 size="64.0 MiB"\n',
            'time=x level=INFO msg="compute graph" device=CUDA0 size="68.0 MiB"\n',
            'time=x level=INFO msg="compute graph" device=CPU size="4.0 MiB"\n']
    open(f"{D}/serve-main.log", "w").writelines(log)
    open(f"{D}/serve-fail.log", "w").write(
        "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 912.00 MiB on device 0: cudaMalloc failed: out of memory\n")
    json.dump({"pid": cp}, open(f"{D}/context.out", "w"))
    json.dump({"pid": hp, "held": 138 << 30}, open(f"{D}/holder.out", "w"))
    with open(f"{D}/warm.jsonl", "w") as f:
        f.write(json.dumps({"device": "NVIDIA H200", "sms": 132, "max_threads_per_sm": 2048}) + "\n")
        for step, frame, nv in [("cold", 0, COLD)] + [(f"stack-{s}", s, COLD) for s in (16, 272, 1024)] + \
                [("stacks", 0, COLD), ("cublas-created", 0, COLD + 68 * M), ("cublas", 0, COLD + 68 * M)]:
            f.write(json.dumps({"step": step, "pid": wp, "nvml": nv, "free": (100 << 30) - (nv - COLD),
                                "stack_limit": 1024, "local_size_bytes": frame}) + "\n")
    warm_over = (20 if new else 74) * M
    rl = {"live": live, "alive": True, "command": runner_cmd(new), "ppid": 553, "by_class": {"plain": plain, "vmm": vmm}}
    ps = {"models": [{"name": "vh-a:latest", "size_vram": size_vram}]}
    arenas = [{"pid": rp, "kind": "VmmReservation", "size": 32 << 30, "occupied": vmm, "largest_free_span": (32 << 30) - vmm}]
    cks = []
    for ck, extra in (("s1-generating", -2 * M), ("s1-loaded", 0), ("s3-large-ctx", mutate.get("s3_nvml_delta", 0))):
        cks.append({"name": ck, "nvml": {str(rp): live - mutate.get("live_delta", 0) + COLD + warm_over + extra},
                    "live": ({str(rp): rl} if agent else {}), "ps": ps, "arenas": arenas, "incidents": []})
    cks.append({"name": "context-only", "nvml": {str(cp): COLD}, "live": {}, "ps": {}, "arenas": [], "incidents": []})
    for ck, nv, lv in (("warm-cold", COLD, 0), ("warm-stacks", COLD, 0), ("warm-cublas", COLD + 68 * M, CUBLAS)):
        cks.append({"name": ck, "nvml": {str(wp): nv}, "ps": {}, "arenas": [], "incidents": [],
                    "live": ({str(wp): {"live": lv, "alive": True, "command": "warm_probe", "by_class": {}}} if agent else {})})
    with open(f"{D}/checkpoints.jsonl", "w") as f:
        for c in cks:
            f.write(json.dumps(c) + "\n")
    with open(f"{D}/samples.jsonl", "w") as f:
        f.write(json.dumps({"t_ns": 1, "nvml": {str(rp): COLD}, "live": ({str(rp): dict(rl, live=0)} if agent else {})}) + "\n")
    procs = [{"pid": rp, "command": runner_cmd(new), "peak_bytes": live, "final_live_bytes": live},
             {"pid": wp, "command": "warm_probe", "peak_bytes": CUBLAS + 3 * 512 * 1024, "final_live_bytes": CUBLAS},
             {"pid": cp, "command": "python3 probe.py context", "peak_bytes": 0, "final_live_bytes": 0},
             {"pid": hp, "command": "python3 probe.py hold", "peak_bytes": 138 << 30, "final_live_bytes": 0}]
    if mutate.get("discovery_ring"):
        procs.append({"pid": 900, "command": "/tmp/vho/dist/bin/ollama runner --ollama-engine --port 3",
                      "peak_bytes": 0, "final_live_bytes": 0})
    top = [{"pid": hp, "command": "hold", "peak_bytes": 138 << 30, "final_live_bytes": 0},
           {"pid": rp, "command": "runner", "peak_bytes": live, "final_live_bytes": live}]
    if mutate.get("holder_second"):
        top.reverse()
    ooms = [{"pid": 999, "api": "cuMemAlloc_v2", "requested_bytes": 912 * M, "device_free_bytes": 755 * M,
             "verdict": "capacity", "explanation": "made up"}]
    json.dump({"processes": procs, "ooms": ooms, "top_holders": top}, open(f"{D}/analyze.json", "w"))
    open(f"{D}/analyze-fail.txt", "w").write(f"TOP HOLDERS (by peak)\n  1. pid {top[0]['pid']} x: peak 1 GiB, 0 B at exit/end\n")


def make(R, mutate=None, new_mutate=None):
    os.makedirs(f"{R}/models/manifests/registry.ollama.ai/library/vh-a", exist_ok=True)
    json.dump({"layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:aaaa"}]},
              open(f"{R}/models/manifests/registry.ollama.ai/library/vh-a/latest", "w"))
    open(f"{R}/stack-sizes.txt", "w").write("  9 STACK:0\n  1 STACK:272\n")
    write_mode(R, "agent", False, mutate=mutate)
    write_mode(R, "run", False, agent=False, mutate=mutate)
    write_mode(R, "agent-new", True, mutate=new_mutate)


def run(mutate=None, new_mutate=None):
    with tempfile.TemporaryDirectory() as R:
        make(R, mutate, new_mutate)
        p = subprocess.run([sys.executable, CHECK, R], capture_output=True, text=True)
        return p.returncode, [l for l in p.stdout.splitlines() if l.startswith("  FAIL ")], p.stdout


def main():
    bad = 0
    rc, failed, text = run()
    ok = rc == 0 and not failed
    print(f"{'ok  ' if ok else 'BAD '} a consistent run passes every check (rc {rc}, {len(failed)} failed)")
    if not ok:
        print("\n".join(failed) or text[-2000:])
        bad += 1
    cases = [
        ("a missed 2 MiB allocation (default engine)", {"live_delta": -2 * M}, None, "live "),
        ("a missed 2 MiB allocation (new engine)", None, {"live_delta": -2 * M}, "size_vram"),
        ("bytes counted that NVML does not hold", {"s3_nvml_delta": -80 * M}, None, "<= NVML - cold context"),
        ("an NVML figure 2% off the warm context", {"s3_nvml_delta": 30 * M}, None, "(allowed 1%)"),
        ("the holder not first among top holders", {"holder_second": True}, None, "top holder"),
        ("a discovery child with a ring", {"discovery_ring": True}, None, "GPU-discovery children"),
    ]
    for what, m, nm, needle in cases:
        rc, failed, _ = run(m, nm)
        ok = rc == 1 and any(needle in l for l in failed)
        print(f"{'ok  ' if ok else 'BAD '} {what}: rc {rc}, failing {[l[7:90] for l in failed][:3]}")
        bad += not ok
    print(f"{7 - bad} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
