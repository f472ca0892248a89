"""Reads an agent's /api/v1/state every second until STOPFILE exists: one JSON line a read,
with the wall time and, per live process, its fit (demand, supply, ratio, what limits it)
and its incidents so far. Also the agent's /metrics at the first read where a fit is below 1
(the series an alert rule sees).

    python3 poll.py URL STOPFILE > fits.jsonl
"""
import json
import os
import sys
import time
import urllib.request

url, stop = sys.argv[1], sys.argv[2]
metrics_saved = False
while not os.path.exists(stop):
    t = time.time()
    try:
        st = json.loads(urllib.request.urlopen(url + "/api/v1/state", timeout=2).read())
    except Exception as e:  # the agent not up yet, or gone
        print(json.dumps({"wall": t, "error": repr(e)}), flush=True)
        time.sleep(1)
        continue
    snap = st.get("snapshot", {})
    procs = [{"pid": p.get("pid"), "held": p.get("held_bytes"), "fit": p.get("fit", [])}
             for p in snap.get("processes", []) if p.get("fit")]
    incidents = [{"pid": i.get("pid"), "ts_ns": i.get("ts_ns"), "verdict": i.get("verdict"),
                  "requested": i.get("requested_bytes")} for i in snap.get("incidents", [])]
    print(json.dumps({"wall": t, "processes": procs, "incidents": incidents}), flush=True)
    if not metrics_saved and any(f.get("fit_ratio", 1) < 1 for p in procs for f in p["fit"]):
        try:
            text = urllib.request.urlopen(url + "/metrics", timeout=2).read().decode()
            with open(stop + ".metrics.txt", "w") as f:
                f.write("\n".join(l for l in text.splitlines() if "fit" in l or "demand" in l or "supply" in l))
            metrics_saved = True
        except Exception:
            pass
    time.sleep(max(0.0, 1.0 - (time.time() - t)))
