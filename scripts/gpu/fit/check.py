"""Checks of scripts/gpu/fit/run.sh's files: PASS/FAIL per line, then the figures.

Live, from the agent's state read each second (CASE.fits.jsonl): the first sustained
crossing is the first read below 1 after which every read stayed below 1 until the OOM;
the lead time is from it to the OOM (serve.py's wall clock, the same machine's). Offline,
from `analyze --json` of the agent's capture: its fit warning and the OOM incident.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checking import Checks, norm  # noqa: E402
from loop import gib, print_progress  # noqa: E402

LEAD_TARGET_S = 60.0
C = Checks(sys.argv[1])
load, lines, check = C.load, C.lines, C.check


def fits_of(case, pid):
    """(wall, ProcessFit of device 0) per read that had one for `pid`."""
    rows = []
    for r in lines(case + ".fits.jsonl"):
        for p in r.get("processes", []):
            if p.get("pid") == pid:
                f = [f for f in p.get("fit", []) if f.get("device") == 0]
                if f:
                    rows.append((r["wall"], f[0]))
    return rows


def crossings_below(rows):
    """Times the fit went below 1 (from >= 1, or at the first read)."""
    out, above = [], True
    for wall, f in rows:
        below = f["fit_ratio"] < 1
        if below and above:
            out.append(wall)
        above = not below
    return out


# The fragmenting run.
frag = lines("frag.out")
start = next((l for l in frag if l["kind"] == "start"), {})
oom = next((l for l in frag if l["kind"] == "oom"), None)
pid = start.get("pid")
print("frag: pid %s, %s parameters, ballast %s, pool %s" % (pid, start.get("params"), gib(start.get("ballast")),
                                                          gib(start.get("pool"))))
print_progress(frag)
check(oom is not None, "frag: the serving loop ran out of memory (%s)" % (oom or {}).get("message", "no OOM"))
rows = fits_of("frag", pid)
print("  %d reads of its fit live" % len(rows))
lead = None
if oom and rows:
    before = [(w, f) for w, f in rows if w <= oom["wall"]]
    sustained = None
    for w, f in before:
        if f["fit_ratio"] < 1:
            sustained = sustained if sustained is not None else (w, f)
        else:
            sustained = None
    if sustained:
        w, f = sustained
        lead = oom["wall"] - w
        print("  live: below 1 from +%.1f s (demand %s from %s, supply %s by %s, limited by %s); OOM at +%.1f s" % (
            w - start["wall"] + start["t"], gib(f["demand_bytes"]), f.get("demand_source"), gib(f["supply_bytes"]),
            f.get("supply_rule"), f.get("limited_by"), oom["t"]))
    print("  live: crossings below 1 before the OOM: %d" % len(crossings_below(before)))
check(lead is not None and lead >= LEAD_TARGET_S,
      "frag: the live fit stayed below 1 for at least %.0f s before the OOM (lead %s s)" % (
          LEAD_TARGET_S, None if lead is None else round(lead, 1)))
rep = load("frag.report.json")
incidents = [o for o in rep.get("ooms", []) if o.get("pid") == pid]
for o in incidents:
    print("  incident #%s %s %s req %s outcome %s" % (o.get("id"), o.get("api"), o.get("verdict_name") or o.get("verdict"),
                                                    o.get("requested_bytes"), o.get("outcome")))
check(bool(incidents), "frag: the agent's capture holds the OOM incident")
warn = [w for w in rep.get("fit_warnings", []) if w.get("pid") == pid]
for w in warn:
    print("  analyze: fit warning since %s, demand %s (%s), supply %s, limited by %s, came %s" % (
        w["since_ts_ns"], gib(w["demand_bytes"]), w["demand_source"], gib(w["supply_bytes"]), w.get("limited_by"),
        w.get("came_ts_ns")))
came = [w for w in warn if w.get("came_ts_ns")]
off_lead = (came[0]["came_ts_ns"] - came[0]["since_ts_ns"]) / 1e9 if came else None
check(off_lead is not None and off_lead >= LEAD_TARGET_S,
      "frag: analyze of the capture warns at least %.0f s before the failing request came (%s s)" % (
          LEAD_TARGET_S, None if off_lead is None else round(off_lead, 1)))

# The control.
ctl = lines("control.out")
cstart = next((l for l in ctl if l["kind"] == "start"), {})
cpid = cstart.get("pid")
done = next((l for l in ctl if l["kind"] == "done"), None)
print("control: pid %s, alloc conf %r, %s" % (cpid, cstart.get("alloc_conf"), json.dumps(done)))
check(done is not None and not any(l["kind"] == "oom" for l in ctl),
      "control: the same requests with expandable segments never ran out of memory")
crows = fits_of("control", cpid)
false = crossings_below(crows)
low = min((f["fit_ratio"] for _, f in crows), default=None)
print("  %d reads of its fit live, lowest %s" % (len(crows), low))
for w in false:
    f = next(f for ww, f in crows if ww == w)
    print("  false crossing at +%.1f s: %s" % (w - cstart["wall"] + cstart["t"], json.dumps(f)))
check(bool(crows) and not false, "control: the live fit never went below 1 (%d crossings)" % len(false))
crep = load("control.report.json")
check(not [w for w in crep.get("fit_warnings", []) if w.get("pid") == cpid] and
      not [o for o in crep.get("ooms", []) if o.get("pid") == cpid],
      "control: analyze of its capture gives no fit warning and no incident")
print("%d failed" % C.fails)
sys.exit(1 if C.fails else 0)
