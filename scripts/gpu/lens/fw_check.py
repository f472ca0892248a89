"""Checks frameworks.sh's runs; PASS/FAIL lines. Exit 1 on a FAIL."""
import json
import os
import subprocess
import sys

import checks
from checks import check, lines

R, BIN = sys.argv[1], sys.argv[2]


for fw, code in (("cupy", "cupy"), ("jax", "jax")):
    name = "fw_" + fw
    out = lines(os.path.join(R, name + ".out"))
    before = [l for l in out if l.get("phase") == "before"]
    oom = [l for l in out if l.get("phase") == "oom"]
    print("%s: program said %s" % (fw, [{k: v for k, v in l.items() if k != "error"} for l in out]))
    check(len(before) == 1 and len(oom) == 1, "%s: the program filled, fragmented and got its OOM" % fw)
    dump = subprocess.run([BIN, "dump", os.path.join(R, name + ".vhc")], capture_output=True, text=True).stdout
    recs = [json.loads(l) for l in dump.splitlines() if l.startswith("{")]
    samples = [r for r in recs if r.get("kind") == "framework_sample" and r.get("framework") == code]
    check(len(samples) > 0, "%s: the lens wrote framework_sample records (%d)" % (fw, len(samples)))
    if before and samples:
        b = before[0]
        match = [s for s in samples if s["addr"] == b["reserved"] and s["size"] == b["allocated"]]
        check(len(match) > 0, "%s: a sample's reserved/allocated equal the framework's own (%d/%d; last sample %d/%d)" % (
            fw, b["reserved"], b["allocated"], samples[-1]["addr"], samples[-1]["size"]))
        if b.get("largest") is not None and match:
            check(match[-1]["aux"] == b["largest"], "%s: its largest free block equals largest_free_block_bytes (%d vs %d)" % (fw, match[-1]["aux"], b["largest"]))
    try:
        rep = json.load(open(os.path.join(R, name + ".report.json")))
    except (OSError, ValueError):
        rep = {"ooms": []}
    ooms = rep.get("ooms", [])
    print("  incidents: %s" % [(o["requested_bytes"], o["verdict"], o["outcome"]) for o in ooms])
    if ooms and before:
        o = ooms[-1]
        cached = before[0]["reserved"] - before[0]["allocated"]
        covered = cached + (o.get("device_free_bytes") or 0) >= o["requested_bytes"]
        print("  last incident: asked %d, device free %s, cached free %d; %s" % (o["requested_bytes"], o.get("device_free_bytes"), cached, o["explanation"]))
        check(not covered or o["verdict"] != "capacity", "%s: cached bytes would have covered it -> not capacity (%s)" % (fw, o["verdict"]))
        check(o.get("framework") == code, "%s: the incident names the framework (%s)" % (fw, o.get("framework")))
    else:
        check(False, "%s: an OOM incident in the report" % fw)
    bench = lines(os.path.join(R, "fw_bench_%s.json" % fw))
    if bench:
        us = bench[0]["sample_us"]
        check(us / 1e4 <= 1.0, "%s: one lens sample costs %.1f us (%.4f%% of a core at 1 s)" % (fw, us, us / 1e4))
    else:
        check(False, "%s: the bench ran" % fw)
sys.exit(1 if checks.fails else 0)
