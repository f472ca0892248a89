"""Checks scripts/gpu/ebpf.sh's results: ebpf_check.py OUTDIR (prints, exits 1 on a mismatch)."""
import json
import sys

out = sys.argv[1]


def last_json(name, key):
    rows = [json.loads(l) for l in open(f"{out}/{name}.out") if l.startswith("{")]
    return next((r for r in reversed(rows) if key in r), None)


state = json.load(open(f"{out}/state.json"))
attached = json.load(open(f"{out}/state_attached.json"))
procs = {p["pid"]: p for p in state["snapshot"]["processes"] if p["alive"]}
ok = True
res = {}
late, early, pre = last_json("late", "done"), last_json("early", "done"), last_json("preload", "done")
early_ready = last_json("early", "ready")
for name, w in (("late", late), ("early", early), ("preload", pre)):
    p = procs.get(w["pid"]) if w else None
    res[name] = {
        "pid": w and w["pid"],
        "torch_reserved": w and w["reserved"],
        "live_bytes": p and p["live_bytes"],
        "traced_since_ns": p and p.get("traced_since_ns"),
        "allocations": p and p["allocations"],
        "streams": p and p.get("streams"),
    }
    print(f"{name:8} pid {res[name]['pid']}: torch memory_reserved {res[name]['torch_reserved']}, "
          f"agent live_bytes {res[name]['live_bytes']}, attached late: {res[name]['traced_since_ns'] is not None}")


def check(cond, what):
    global ok
    print(("ok   " if cond else "FAIL ") + what)
    ok &= bool(cond)


check(res["late"]["live_bytes"] == late["reserved"], "late (eBPF): live bytes == torch.cuda.memory_reserved()")
check(res["preload"]["live_bytes"] == pre["reserved"], "preload (ring): live bytes == torch.cuda.memory_reserved()")
check(res["late"]["live_bytes"] == res["preload"]["live_bytes"], "eBPF live bytes == LD_PRELOAD live bytes")
check(res["late"]["streams"] == 128, f"late (eBPF): PyTorch's 128 pooled streams counted ({res['late']['streams']})")
check(res["preload"]["streams"] == 128, f"preload (ring): PyTorch's 128 pooled streams counted ({res['preload']['streams']})")
check(res["late"]["traced_since_ns"] is not None, "late: attached late (it was running before the agent)")
check(res["early"]["traced_since_ns"] is not None, "early: attached late; earlier allocations unknown")
check(res["early"]["live_bytes"] == 0, "early: nothing allocated after attach")
check(res["preload"]["traced_since_ns"] is None, "preload: its ring has it from its start")
devs = state["snapshot"]["devices"]
print("devices:", json.dumps(devs))
untraced = sum(d.get("untraced_bytes") or 0 for d in devs)
check(untraced >= early_ready["reserved"], f"device untraced bytes {untraced} >= early's reserved before attach {early_ready['reserved']}")
a = state["agent"]
print("agent:", {k: a.get(k) for k in ("ebpf_events", "ebpf_ring_won", "ebpf_lost", "ebpf_malformed", "ebpf_links", "ebpf_processes")})
check(a.get("ebpf_ring_won", 0) > 0, "preload's probe events dropped (ring wins)")
check(a.get("ebpf_lost", 0) == 0 and a.get("ebpf_malformed", 0) == 0, "no eBPF event lost or malformed")
log = open(f"{out}/agent.log").read()
check("eBPF probes detached" in log, "SIGTERM: probes detached")
json.dump({"processes": res, "devices": devs, "agent": a, "ok": ok}, open(f"{out}/results.json", "w"), indent=1)
sys.exit(0 if ok else 1)
