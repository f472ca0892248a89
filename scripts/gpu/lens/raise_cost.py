"""What the lens's raise watcher (lens/vramhook_lens/raise_watch.py) costs a program that
raises and catches exceptions of other types: CPU time of a loop that raises and catches
ValueError as fast as it can, the watcher's sys.monitoring RAISE callback on against off,
in interleaved rounds (on, off, on, off, ...), at two depths (raised in the loop's frame;
raised three calls down, where RAISE fires in each of the four frames it unwinds).
Needs Python 3.12+ (sys.monitoring); no GPU, no vramhook library (the watcher is installed
directly, with a handler for a type never raised here).

    python3 scripts/gpu/lens/raise_cost.py [--rounds 21] [--raises 200000] [--out FILE.json]

Prints one JSON object: per depth the median ns per raise with the watcher on and off,
their difference, and "pass" (difference <= 1000 ns, issue #29: 10,000 raises a second
then cost at most 1% of a core). Exit 0 when every depth passes, 1 when one does not, 2
when this Python has no sys.monitoring or no tool id is free.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "lens"))

from vramhook_lens import raise_watch  # noqa: E402

LIMIT_NS = 1000.0


class NeverRaised(MemoryError):
    pass


def _raise_here(n):
    for _ in range(n):
        try:
            raise ValueError("x")
        except ValueError:
            pass


def _c():
    raise ValueError("x")


def _b():
    _c()


def _a():
    _b()


def _raise_deep(n):
    for _ in range(n):
        try:
            _a()
        except ValueError:
            pass


def _tool():
    mon = sys.monitoring
    for tool in raise_watch.TOOL_IDS:
        if mon.get_tool(tool) == raise_watch.TOOL_NAME:
            return tool
    return None


def _round(loop, n, on, tool):
    mon = sys.monitoring
    mon.set_events(tool, mon.events.RAISE if on else 0)
    t0 = time.process_time_ns()
    loop(n)
    dt = time.process_time_ns() - t0
    mon.set_events(tool, 0)
    return dt / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--raises", type=int, default=200000)
    ap.add_argument("--out")
    args = ap.parse_args()
    if not hasattr(sys, "monitoring"):
        print(json.dumps({"python": platform.python_version(), "error": "no sys.monitoring (Python < 3.12)"}))
        return 2
    if raise_watch.watch([NeverRaised], "bench", lambda exc, at_raise: None) != "monitoring":
        print(json.dumps({"python": platform.python_version(), "error": "no sys.monitoring tool id free"}))
        return 2
    tool = _tool()
    result = {"python": platform.python_version(), "tool_id": tool, "rounds": args.rounds, "raises": args.raises}
    ok = True
    for name, loop, frames in (("raised_in_loop", _raise_here, 1), ("raised_3_calls_down", _raise_deep, 4)):
        loop(args.raises // 10)  # warm up
        on, off = [], []
        for r in range(args.rounds):
            # Interleaved, starting side alternating, so drift hits both alike.
            first = r % 2 == 0
            for side in (first, not first):
                (on if side else off).append(_round(loop, args.raises, side, tool))
        m_on, m_off = statistics.median(on), statistics.median(off)
        diffs = sorted(a - b for a, b in zip(on, off))
        d = m_on - m_off
        result[name] = {
            "frames_unwound": frames,
            "ns_per_raise_on": round(m_on, 1),
            "ns_per_raise_off": round(m_off, 1),
            "ns_added_per_raise": round(d, 1),
            "ns_added_per_raise_paired_median": round(statistics.median(diffs), 1),
            "ns_added_per_raise_paired_range": [round(diffs[0], 1), round(diffs[-1], 1)],
            "pass": d <= LIMIT_NS,
        }
        ok = ok and d <= LIMIT_NS
    result["limit_ns"] = LIMIT_NS
    result["pass"] = ok
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
