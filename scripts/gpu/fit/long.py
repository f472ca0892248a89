"""What one control of scripts/gpu/fit/run.sh did when left to run (FIT_CASE=expandable or
fifo): whether and when it failed, and what the fit and its forecast said before. A record,
not a pass/fail check: the question is what happens.

    python3 long.py OUTDIR CASE
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checking import Checks  # noqa: E402
from loop import gib, print_progress  # noqa: E402

C = Checks(sys.argv[1])
case = sys.argv[2]


out = C.lines(case + ".out")
start = next((l for l in out if l["kind"] == "start"), {})
pid = start.get("pid")
end = next((l for l in out if l["kind"] in ("oom", "done")), None)
print("%s: pid %s, alloc conf %r, release %s, pool %s" % (case, pid, start.get("alloc_conf"), start.get("release"),
                                                          gib(start.get("pool"))))
print_progress(out)
if end is None:
    print("  outcome: no end line (killed?)")
elif end["kind"] == "oom":
    print("  outcome: OOM at +%.1f s, request #%s (%s): %s" % (end["t"], end.get("index"),
                                                             "large" if end.get("large") else "chat", end["message"]))
else:
    print("  outcome: no OOM in %.1f s (%s requests)" % (end["t"], end.get("requests")))

# Live: the agent's state each second.
rows = []
for r in C.lines(case + ".fits.jsonl"):
    for p in r.get("processes", []):
        if p.get("pid") == pid:
            rows += [(r["wall"], f) for f in p.get("fit", []) if f.get("device") == 0]
t = lambda wall: wall - start.get("wall", 0) + start.get("t", 0)  # noqa: E731
if rows:
    low = min(rows, key=lambda r: r[1]["fit_ratio"])
    big = max(rows, key=lambda r: r[1]["demand_bytes"])
    print("  live: %d reads; lowest fit %.3f at +%.1f s (demand %s, supply %s); largest demand %s (%s)" % (
        len(rows), low[1]["fit_ratio"], t(low[0]), gib(low[1]["demand_bytes"]), gib(low[1]["supply_bytes"]),
        gib(big[1]["demand_bytes"]), big[1]["demand_source"]))
    below, runs = None, []
    for wall, f in rows:
        if f["fit_ratio"] < 1 and below is None:
            below = wall
        elif f["fit_ratio"] >= 1 and below is not None:
            runs.append((below, wall))
            below = None
    if below is not None:
        runs.append((below, None))
    for a, b in runs:
        print("  live: fit below 1 from +%.1f s %s" % (t(a), "to +%.1f s" % t(b) if b else "to the end"))
    if end and end["kind"] == "oom" and runs and runs[-1][1] is None:
        print("  live: lead of the last run below 1: %.1f s" % (end["wall"] - runs[-1][0]))
    if not runs:
        print("  live: the fit never went below 1")
else:
    print("  live: no fit read")

# Offline: the agent's capture, with the forecast (--fit-trend 60s,5min,10s).
rep = C.load(case + ".forecast.json")
first = rep.get("time", {}).get("first_ts_ns", 0)
for o in rep.get("ooms", []):
    print("  analyze: incident #%s %s %s requested %s, outcome %s" % (o.get("id"), o.get("api"), o.get("verdict"),
                                                                  gib(o.get("requested_bytes")), o.get("outcome")))
for w in rep.get("fit_warnings", []):
    print("  analyze: fit below 1 from +%.1f s, demand %s (%s), limited by %s, came %s" % (
        (w["since_ts_ns"] - first) / 1e9, gib(w["demand_bytes"]), w["demand_source"], w.get("limited_by"),
        "+%.1f s" % ((w["came_ts_ns"] - first) / 1e9) if w.get("came_ts_ns") else "never"))
for w in rep.get("fit_trend_warnings", []):
    then = ("came +%.1f s" % ((w["came_ts_ns"] - first) / 1e9) if w.get("came_ts_ns") else
            "cleared +%.1f s" % ((w["cleared_ts_ns"] - first) / 1e9) if w.get("cleared_ts_ns") else "held to the end")
    print("  forecast: fired +%.1f s, demand %s, supply %s falling %.1f MiB/s, %s" % (
        (w["fired_ts_ns"] - first) / 1e9, gib(w["demand_bytes"]), gib(w["supply_bytes"]),
        -w["slope_bytes_per_s"] / (1 << 20), then))
if not rep.get("fit_trend_warnings"):
    print("  forecast: none")
