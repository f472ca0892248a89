"""Checks what vramhook captured on the GPU machine against what the programs say they did.
usage: check.py OUTDIR   (reads the *.jsonl dumps and *.out files written by validate.sh)"""
import json
import os
import sys

out = sys.argv[1]
results = {"checks": [], "numbers": {}}
failed = 0


def check(name, ok, detail=""):
    global failed
    results["checks"].append({"name": name, "ok": bool(ok), "detail": detail})
    if not ok:
        failed += 1
    print(("PASS " if ok else "FAIL ") + name + (": " + detail if detail else ""))


def load_jsonl(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(l) for l in f if l.startswith("{")]


def live_before_first_oom(events):
    """Live device bytes (plain + pool allocations + VMM physical) just before the first
    out-of-memory failure, replaying the capture."""
    sizes, handles, live = {}, {}, 0
    for e in events:
        if e["result"] == 2:
            return live
        if e["result"] != 0:
            continue
        k = e["kind"]
        if k == "alloc":
            sizes[e["addr"]] = e["size"]
            live += e["size"]
        elif k == "free":
            live -= sizes.pop(e["addr"], 0)
        elif k == "vmm_create":
            handles[e["aux"]] = e["size"]
            live += e["size"]
        elif k == "vmm_release":
            # Counted until released (mappings ignored: PyTorch unmaps before releasing).
            live -= handles.pop(e["aux"], 0)
    return None


GIB200 = 200 << 30
API_OF = {"cudaMalloc": "cuMemAlloc_v2", "cudaFree": "cuMemFree_v2", "cudaMallocAsync": "cuMemAllocAsync",
          "cudaFreeAsync": "cuMemFreeAsync", "cudaMallocPitch": "cuMemAllocPitch_v2"}

for variant in ("static", "shared"):
    probe = load_jsonl(f"{out}/probe_{variant}.out")
    events = load_jsonl(f"{out}/probe_{variant}.jsonl")
    check(f"nvcc {variant} cudart: probe ran", any(p.get("probe") for p in probe), f"{len(probe)} calls")
    check(f"nvcc {variant} cudart: events captured", len(events) > 0, f"{len(events)} events")
    missing = []
    for p in (p for p in probe if p.get("probe")):
        api = API_OF.get(p["api"], p["api"])
        want = [e for e in events if e["api"].startswith(api)
                and (p["addr"] == 0 or e["addr"] == p["addr"] or api in ("cuMemCreate", "cuMemRelease"))
                and (e["result"] == 0) == (p["result"] == 0)]
        if p["size"] and api not in ("cuMemFree_v2", "cuMemFreeAsync", "cuMemRelease"):
            want = [e for e in want if e["size"] == p["size"]]
        if not want:
            missing.append(p)
    check(f"nvcc {variant} cudart: every call the program made was captured with its address and size",
          not missing, json.dumps(missing[:3]))
    oom = [e for e in events if e["size"] == GIB200 and e["result"] == 2]
    check(f"nvcc {variant} cudart: 200 GiB request captured as CUDA_ERROR_OUT_OF_MEMORY", oom,
          oom[0]["api"] if oom else "")

for mode in ("default", "expandable", "async"):
    said = load_jsonl(f"{out}/torch_{mode}.out")
    events = load_jsonl(f"{out}/torch_{mode}.jsonl")
    alloc = next((s for s in said if s.get("phase") == "allocated"), None)
    oomline = next((s for s in said if s.get("phase") == "oom"), None)
    check(f"torch {mode}: ran", alloc is not None and oomline is not None)
    if not alloc:
        continue
    live = live_before_first_oom(events)
    apis = sorted({e["api"] for e in events})
    results["numbers"][f"torch_{mode}"] = {"reserved": alloc["reserved"], "captured_live_before_oom": live,
                                           "events": len(events), "apis": apis,
                                           "torch_oom_message": oomline and oomline["message"]}
    if mode == "default":
        check("torch default: live bytes at end of allocation == torch.cuda.memory_reserved() to the byte",
              live == alloc["reserved"], f"captured {live}, PyTorch {alloc['reserved']}")
    else:
        check(f"torch {mode}: live bytes before the OOM (report only)", live is not None,
              f"captured {live}, PyTorch reserved {alloc['reserved']}")
    failed_big = [e for e in events if e["result"] == 2]
    check(f"torch {mode}: the 200 GiB request shows as failed calls with CUDA_ERROR_OUT_OF_MEMORY",
          failed_big, f"{len(failed_big)} failed calls, first: {failed_big[0]['api'] if failed_big else '-'} "
                      f"size {failed_big[0]['size'] if failed_big else 0}")

bench = load_jsonl(f"{out}/bench.jsonl")
if bench:
    results["numbers"]["bench"] = bench
    print("bench:", json.dumps(bench))
json.dump(results, open(f"{out}/results.json", "w"), indent=1)
print(f"{len(results['checks']) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
