"""Checks the lens runs of run.sh; prints PASS/FAIL lines and the numbers. Exit 1 on a FAIL."""
import json
import os
import statistics
import sys

import checks
from checks import check

R = sys.argv[1]


def lines(name):
    return checks.lines(os.path.join(R, name))


def report(name):
    try:
        return json.load(open(os.path.join(R, name + ".report.json")))
    except (OSError, ValueError) as e:
        print("  no report for %s: %s" % (name, e))
        return {"ooms": []}


GiB = 1 << 30
# 1. Default allocator, fragmented cache: the fatal 2 GiB request.
torch_oom = [l for l in lines("lens_default_fragmented.out") if l.get("phase") == "oom"]
rep = report("lens_default_fragmented")
fatal = [o for o in rep["ooms"] if o.get("framework_oom") and o["framework_oom"]["requested"] == 2 * GiB]
log = open(os.path.join(R, "lens_default_fragmented.log")).read() if os.path.exists(os.path.join(R, "lens_default_fragmented.log")) else ""
msg = [l for l in log.splitlines() if "reserved by PyTorch but unallocated" in l]
print("PyTorch's message:", msg[-1].strip() if msg else None)
check(len(torch_oom) == 1 and len(fatal) == 1, "default mode: one OOM that PyTorch raised, one incident for its 2 GiB request (%d, %d)" % (len(torch_oom), len(fatal)))
if torch_oom and fatal:
    t, o = torch_oom[0], fatal[0]
    l = o["framework_oom"]
    unalloc = t["reserved"] - t["allocated"]
    print("  PyTorch: reserved %d allocated %d reserved-unallocated %d (%.1f%% of reserved)" % (t["reserved"], t["allocated"], unalloc, 100.0 * unalloc / t["reserved"]))
    print("  vramhook: verdict %s; lens reserved %d allocated %d largest free block %s, %d pieces over %d segments; cache fragmentation %s" % (
        o["verdict"], l["reserved"], l["allocated"], l["largest_free_block"], l["free_pieces"], l["segments_listed"], o.get("cache_fragmentation")))
    print("  explanation:", o["explanation"])
    check(unalloc >= 0.4 * t["reserved"], "the cache was at least 40%% reserved-but-unallocated at the OOM (%.1f%%)" % (100.0 * unalloc / t["reserved"]))
    check(o["verdict"] == "framework_fragmentation", "verdict framework_fragmentation (%s)" % o["verdict"])
    check(l["allocated"] == t["allocated"], "allocated equals PyTorch's memory_allocated() to the byte (%d vs %d)" % (l["allocated"], t["allocated"]))
    check(l["reserved"] - l["allocated"] == unalloc, "reserved-but-unallocated equals PyTorch's to the byte (%d vs %d)" % (l["reserved"] - l["allocated"], unalloc))
    check(o["outcome"] == "failed", "the incident ends as failed (%s)" % o["outcome"])
# 2. Expandable segments: the same program does not fail.
exp = lines("lens_expandable_fragmented.out")
check(any(l.get("phase") == "no_oom" for l in exp), "expandable_segments:True: the 2 GiB request fitted")
rep = report("lens_expandable_fragmented")
check(not any(o["verdict"] == "framework_fragmentation" for o in rep["ooms"]), "expandable: no framework_fragmentation verdict (%s)" % [o["verdict"] for o in rep["ooms"]])
# 3. A true capacity shortage.
rep = report("lens_default_capacity")
check(len(rep["ooms"]) >= 1 and all(o["verdict"] == "capacity" for o in rep["ooms"]), "capacity stays capacity (%s)" % [o["verdict"] for o in rep["ooms"]])
# 4. The lens's cost.
calls = lines("lens_calls.json")
if calls:
    c = calls[0]
    per_s = c["memory_stats_us"] / 1.0 + c["snapshot_scan_us"] / 30.0  # defaults: every 1 s, snapshot every 30 s
    print("  lens calls: memory_stats %.1f us, snapshot + scan %.0f us (%d segments, %d blocks): %.4f%% of one core at the default rates" % (
        c["memory_stats_us"], c["snapshot_scan_us"], c["segments"], c["blocks"], per_s / 1e6 * 100))
    check(per_s / 1e6 <= 0.01, "the lens's own cost at its rate is at most 1% of one core")
loop = lines("lens_loop.jsonl")
pre = [l["median_step_s"] for l in loop if l["mode"] == "preload"]
lens = [l["median_step_s"] for l in loop if l["mode"] == "lens"]
if pre and lens:
    mp, ml = statistics.median(pre), statistics.median(lens)
    rate = statistics.median([l["allocs_per_s"] for l in loop])
    print("  loop: %d rounds each; median step %.1f us (LD_PRELOAD) vs %.1f us (with the lens): ratio %.4f; %.0f allocations/s" % (
        len(pre), mp * 1e6, ml * 1e6, ml / mp, rate))
    check(all(l["lens"] for l in loop if l["mode"] == "lens") and not any(l["lens"] for l in loop if l["mode"] == "preload"), "the lens ran exactly in the lens rounds")
    check(rate >= 10000, "the loop makes at least 10,000 allocations a second")
    check(len(pre) >= 10 and ml / mp <= 1.01, "median step time with the lens within 1% of LD_PRELOAD alone")
print("%d check(s) failed" % checks.fails if checks.fails else "all checks passed")
sys.exit(1 if checks.fails else 0)
