"""Reads overhead_probe's and pools_probe's step lines (JSON, one per line, any order of
scenarios) and prints, per scenario and step, the device bytes used since the first step
(cuMemGetInfo), NVML's bytes for the process, the pool's reserve, and "outside": the device
bytes used since the first step that no pool reserve and no live cuMemAlloc of the probe
account for (PyTorch's lines: memory_reserved() as the reserve). A step whose "outside" jumps is where the driver took memory of its own.

usage: overhead_summary.py FILE.jsonl..."""
import json
import sys

MIB = 1 << 20


def rows(paths):
    by_scenario = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                r = json.loads(line)
                if "scenario" in r:
                    key = r["scenario"]
                elif r.get("phase") == "step":
                    key = "torch " + r["mode"]
                    r["pool_reserved"] = r.get("reserved")
                else:
                    continue
                by_scenario.setdefault(key, []).append(r)
    return by_scenario


def mib(v):
    return "-" if v is None or v < 0 else f"{v / MIB:9.1f}"


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    for scenario, steps in rows(sys.argv[1:]).items():
        base = steps[0]["device_free"]
        print(f"== {scenario} (MiB)")
        print(f"  {'step':40} {'used':>9} {'nvml':>9} {'reserve':>9} {'outside':>9}")
        for r in steps:
            used = base - r["device_free"]
            reserve = max(r.get("pool_reserved") or 0, 0)
            # The probe's live cuMemAlloc bytes (PyTorch's reserve has its segments in it).
            outside = used - reserve - r.get("malloc_live", 0)
            per = ""
            if r["step"].startswith("streams made: "):
                # The stream the probe made first is in its "stream" step, the base here.
                n = int(r["step"].split(": ")[1])
                per = f"  {outside / n / 1024:7.0f} KiB per stream"
            print(f"  {r['step']:40} {mib(used)} {mib(r.get('nvml_used'))} {mib(reserve)} {mib(outside)}{per}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
