"""Checks of scripts/gpu/raise/run.sh's files: PASS/FAIL per line."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checking import Checks, norm  # noqa: E402

C = Checks(sys.argv[1])
load, lines, check = C.load, C.lines, C.check


def ooms(name):
    return load(name + ".report.json").get("ooms", [])


def show(name):
    for o in ooms(name):
        print("  %s: #%s %s %s req %s outcome %s fw_oom %s" % (name, o.get("id"), o.get("api"), o.get("verdict"),
              o.get("requested_bytes"), o.get("outcome"), json.dumps(o.get("framework_oom"))))


for n in ("jax_frag", "cupy_recover", "cupy_fatal", "torch_smallpool", "torch_fraction", "torch_history"):
    show(n)
# The fill's own RESOURCE_EXHAUSTED (a 1 GiB array into a full pool, caught by the program)
# is an incident of its own; the fatal request is the 2 GiB one.
j = [o for o in ooms("jax_frag") if (o.get("framework_oom") or {}).get("requested") == 2 << 30]
check(len(j) == 1 and norm(j[0]["verdict"]) == "frameworkfragmentation",
      "jax_frag: one incident for the fatal 2 GiB request, framework_fragmentation")
before = [l for l in lines("jax_frag.out") if l.get("phase") == "before"]
if j and before:
    fo = j[0]["framework_oom"]
    print("  XLA before: %s; lens at the raise: allocated %s largest %s" % (json.dumps(before[0]), fo.get("allocated"), fo.get("largest_free_block")))
rec = [o for o in ooms("cupy_recover") if o.get("requested_bytes", 0) >= 3 << 30]
check(bool(rec) and norm(rec[-1]["outcome"]) == "recovered", "cupy_recover: the 3 GiB request ends recovered")
fat = [o for o in ooms("cupy_fatal") if o.get("framework_oom") and o["framework_oom"].get("requested", 0) >= 3 << 30]
check(bool(fat) and norm(fat[-1]["outcome"]) == "failed", "cupy_fatal: the 3 GiB request ends failed, with CuPy's numbers")
sp = ooms("torch_smallpool")
check(bool(sp) and norm(sp[-1]["verdict"]) == "capacity", "torch_smallpool: the filled small pool is capacity")
fr = ooms("torch_fraction")
check(bool(fr) and norm(fr[-1]["verdict"]) == "capacity" and fr[-1].get("framework_limit"),
      "torch_fraction: capacity naming the limit in the capture (%s)" % (fr[-1].get("framework_limit") if fr else None))
li = load("torch_fraction.log.json").get("log_incidents", [])
lv = (li[0].get("verdict_name") or li[0].get("verdict")) if li else None
check(norm(lv) == "capacity" and "limit" in (li[0].get("explanation", "") if li else ""),
      "torch_fraction: capacity naming the limit from its log (%s)" % lv)
# History on: the lens's record within 50 ms of the driver's failure.
h = ooms("torch_history")
fatal = [o for o in h if o.get("framework_oom") and o["framework_oom"].get("requested") == 2 << 30]
check(len(fatal) == 1, "torch_history: the fatal 2 GiB failure is one incident with the lens's record (%d)" % len(fatal))
# From the capture's records: the last failed driver call before the lens's OOM record.
last_fail, lag = None, None
for e in lines("torch_history.dump.jsonl"):
    if e.get("result") == 2 and e.get("kind") in ("alloc", "vmm_create"):
        last_fail = e["ts_ns"]
    if e.get("kind") == "framework_oom" and e.get("addr") == 2 << 30 and last_fail is not None and lag is None:
        lag = e["ts_ns"] - last_fail
print("  torch_history: the lens's record %s ns after the driver's last failure" % lag)
check(lag is not None and lag <= 50_000_000, "torch_history: the lens's record within 50 ms of the driver's failure")
# torch_async: the agent's held bytes against memory_reserved().
st = load("torch_async.state.json")
burst = [l for l in lines("torch_async.out") if l.get("phase") == "burst"]
procs = [p for p in st.get("snapshot", {}).get("processes", []) if burst and p.get("pid") == burst[0]["pid"]]
held = procs[0].get("held_bytes") if procs else None
res = burst[0]["reserved"] if burst else None
print("  torch_async: memory_reserved() %s, agent held %s" % (res, held))
check(held is not None and held == res, "torch_async: held bytes equal memory_reserved() 1.5 s after the burst")
print("%d failed" % C.fails)
