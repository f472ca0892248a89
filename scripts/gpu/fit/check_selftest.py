"""fit/check.py on made-up runs: a fragmenting run whose fit stays below 1 for 90 s before its
OOM, and a control that never goes below 1, pass; each mutation (a lead of 30 s, a fit that
came back above 1 just before the OOM, no OOM, a control crossing, a control incident) must
fail. Exit 1 if the checker is wrong."""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
GIB = 1 << 30
T0 = 1_000_000.0  # wall clock of each run's start


def fit(ratio):
    return {"device": 0, "demand_bytes": 2 * GIB, "demand_source": "lens_largest_allocation",
            "supply_bytes": int(ratio * 2 * GIB), "supply_rule": "framework_cache", "fit_ratio": ratio,
            "limited_by": "framework_fragmentation" if ratio < 1 else None}


def write_run(d, case, pid, oom_at, below_from, above_again=None, incident=True, warn_lead=90.0):
    end = oom_at if oom_at is not None else 200.0
    with open(os.path.join(d, case + ".out"), "w") as f:
        f.write(json.dumps({"kind": "start", "pid": pid, "t": 0.0, "wall": T0, "params": 1, "ballast": GIB,
                            "pool": 8 * GIB, "alloc_conf": ""}) + "\n")
        if oom_at is not None:
            f.write(json.dumps({"kind": "oom", "pid": pid, "t": oom_at, "wall": T0 + oom_at, "index": 300,
                                "large": True, "message": "CUDA out of memory"}) + "\n")
        else:
            f.write(json.dumps({"kind": "done", "pid": pid, "t": end, "wall": T0 + end, "requests": 500}) + "\n")
    with open(os.path.join(d, case + ".fits.jsonl"), "w") as f:
        for s in range(int(end)):
            below = below_from is not None and s >= below_from and not (above_again is not None and s >= above_again)
            procs = [{"pid": pid, "held": GIB, "fit": [fit(0.8 if below else 1.5)]}]
            f.write(json.dumps({"wall": T0 + s, "processes": procs, "incidents": []}) + "\n")
    ooms = [{"id": 1, "pid": pid, "api": "cuMemAlloc_v2", "verdict_name": "framework_fragmentation",
             "requested_bytes": 2 * GIB, "outcome": "failed"}] if incident else []
    warnings = []
    if below_from is not None and oom_at is not None:
        warnings = [{"pid": pid, "since_ts_ns": int((oom_at - warn_lead) * 1e9), "came_ts_ns": int(oom_at * 1e9),
                     "demand_bytes": 2 * GIB, "demand_source": "lens_largest_allocation", "supply_bytes": GIB,
                     "limited_by": "framework_fragmentation"}]
    with open(os.path.join(d, case + ".report.json"), "w") as f:
        json.dump({"ooms": ooms, "fit_warnings": warnings}, f)


def outcome(frag=None, control=None):
    with tempfile.TemporaryDirectory() as d:
        write_run(d, "frag", 11, **({"oom_at": 150.0, "below_from": 60} | (frag or {})))
        write_run(d, "control", 12, **({"oom_at": None, "below_from": None, "incident": False} | (control or {})))
        p = subprocess.run([sys.executable, os.path.join(HERE, "check.py"), d], capture_output=True, text=True)
        return p.returncode, p.stdout


cases = [
    ("a 90 s lead and a quiet control", {}, {}, 0),
    ("a lead of 30 s", {"below_from": 120, "warn_lead": 30.0}, {}, 1),
    ("the fit back above 1 before the OOM", {"above_again": 145}, {}, 1),
    ("no OOM", {"oom_at": None, "incident": False}, {}, 1),
    ("the control went below 1", {}, {"below_from": 100, "above_again": 110}, 1),
    ("the control had an incident", {}, {"incident": True}, 1),
]
bad = 0
for name, frag, control, want in cases:
    rc, text = outcome(frag, control)
    ok = (rc == 0) == (want == 0)
    bad += not ok
    print("%s %s (exit %d, want %s)" % ("ok  " if ok else "BAD ", name, rc, "pass" if want == 0 else "fail"))
    if not ok:
        print(text)
sys.exit(1 if bad else 0)
