"""Checks scripts/gpu/pools/run.sh's results (issue #10, item 7). For each of PyTorch's three
allocator modes: vramhook's bytes for the process at the program's point (`final_held_bytes`
of `vramhook run --summary-json`: live bytes plus the idle reserve of its stream-ordered pools,
the driver's figure as sampled there) equal torch.cuda.memory_reserved(); and NVML's
per-process used bytes minus vramhook's bytes (the context, modules and library workspaces)
agree across the modes within 1 %. vramhook's bytes there are the held bytes plus the driver's
memory for the streams the process made (`final_stream_bytes`: PyTorch's async mode makes its
128-stream pool when it starts on a device, the other two modes only when the program asks
for a stream, and no memory call shows the 70 MiB they take). Prints PASS/FAIL lines with the
numbers; exit 1 on a FAIL.

usage: pools_check.py RESULTS_DIR"""
import json
import os
import sys

MODES = ("default", "expandable", "async")
TOLERANCE = 0.01


def load(d, mode):
    """(the program's JSON line at its point, vramhook's summary for that process, last pool sample) or a reason."""
    try:
        point = [json.loads(l) for l in open(os.path.join(d, mode + ".out")) if l.strip().startswith("{")]
        point = [p for p in point if p.get("phase") == "point"]
        summary = json.load(open(os.path.join(d, mode + ".summary.json")))
    except (OSError, ValueError) as e:
        return None, None, None, "missing or unreadable results: %s" % e
    if len(point) != 1:
        return None, None, None, "the program printed %d point lines" % len(point)
    procs = [p for p in summary.get("processes", []) if "pools_probe.py" in p.get("command", "")]
    if len(procs) != 1:
        return point[0], None, None, "%d traced processes ran pools_probe.py" % len(procs)
    samples = []
    try:
        samples = [json.loads(l) for l in open(os.path.join(d, mode + ".pool_samples.jsonl")) if l.strip()]
    except (OSError, ValueError):
        pass
    return point[0], procs[0], (samples[-1] if samples else None), None


def check(d):
    fails = []

    def verdict(ok, text):
        print(("PASS " if ok else "FAIL ") + text)
        if not ok:
            fails.append(text)

    overhead = {}
    for mode in MODES:
        point, proc, sample, why = load(d, mode)
        if why:
            verdict(False, "%s: %s" % (mode, why))
            continue
        held, live, reserved = proc.get("final_held_bytes"), proc.get("final_live_bytes"), point["reserved"]
        extra = ""
        if sample:
            extra = "; last pool_sample reserved %s used %s" % (sample.get("reserved"), sample.get("used"))
        verdict(held == reserved and proc.get("exit_status") == 0 and proc.get("dropped_events") == 0,
                "%s: vramhook's bytes %s == memory_reserved() %s (live %s, allocated %s, exit %s, dropped %s%s)"
                % (mode, held, reserved, live, point["allocated"], proc.get("exit_status"),
                   proc.get("dropped_events"), extra))
        if held != reserved and sample and sample.get("reserved") == reserved:
            print("     the driver's pool sample equals memory_reserved(): the difference is vramhook's, not rounding")
        if point.get("nvml_used") is None:
            verdict(False, "%s: NVML listed no usage for the program (%s)" % (mode, point.get("nvml_processes")))
            continue
        streams, stream_bytes = proc.get("final_streams", 0), proc.get("final_stream_bytes", 0)
        overhead[mode] = point["nvml_used"] - held - stream_bytes
        print("     %s: NVML %s (%s, %s) − vramhook %s (held %s + %s streams %s) = %s; without the streams %s"
              % (mode, point["nvml_used"], point.get("nvml_source"), point.get("nvml_match"), held + stream_bytes,
                 held, streams, stream_bytes, overhead[mode], point["nvml_used"] - held))
    if len(overhead) == len(MODES):
        lo, hi = min(overhead.values()), max(overhead.values())
        mean = sum(overhead.values()) / len(overhead)
        spread = (hi - lo) / mean if mean > 0 else float("inf")
        verdict(mean > 0 and spread <= TOLERANCE,
                "NVML − vramhook agrees across the modes within 1 %%: %s (spread %s bytes, %.3f %% of the mean %.0f)"
                % (", ".join("%s %s" % (m, overhead[m]) for m in MODES), hi - lo, 100 * spread, mean))
    else:
        verdict(False, "NVML − vramhook: not measured in every mode (%s)" % sorted(overhead))
    print("%d FAIL" % len(fails) if fails else "all checks PASS")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(check(sys.argv[1]))
