#!/usr/bin/env python3
"""pair_summary.py RUNS.jsonl [--targets h200|sim]: the table of what bench_pair
measured (tests/simcuda/workloads/bench_pair.c), one row per configuration and call; with
--targets, issue #15's targets judged against it (see targets() below).

Each line of RUNS.jsonl is one bench_pair process, with "config" (its name) and "round"
added by the script that ran it. Within a process every iteration calls libcuda's own
function and the one the program resolves side by side, so:
- "added" at a percentile is hooked minus plain at that percentile of the same process
  (the issue's definition), then the median over the rounds;
- "paired p50" is the median over the rounds of the median of per-iteration differences;
- "paired mean" the median over the rounds of the mean of the middle 98% of those
  differences (a VM's TSC can tick in 10 ns steps: the mean resolves less than a step);
- "spread" the smallest and largest per-round added p50.
An "aa" configuration (no LD_PRELOAD: both sides are libcuda's) shows the method's own
error. Exit status 0 (a target not met is a line of the output, not a failure)."""
import json
import statistics
import sys

# Issue #15: added median (ns) on the real driver / the simulated one at 1 thread, added p99,
# and the simulated driver's 16-thread median against its 1-thread one.
H200_P50, SIM_P50, P99, THREAD_RATIO = 30, 15, 100, 1.2
# Configurations whose row is the hook as users get it (the others take parts out or add).
HOOKED = ("hooked", "lanes16")
# The floor the issue sets the goal against: a TSC read and one 64-byte store.
FLOOR = ("floor", "skip32")


def added_at(rs, call, q):
    """Hooked minus plain at percentile q of each process, median over the rounds."""
    return statistics.median(r[f"hooked_{call}_{q}_ns"] - r[f"plain_{call}_{q}_ns"] for r in rs)


def paired_mean(rs, call):
    return statistics.median(r[f"paired_{call}_mean_ns"] for r in rs)


def verdict(ok):
    return "met" if ok else "NOT MET"


def targets(rows, driver):
    """Lines judging #15's targets: for h200 the added p50 <= 30 ns and p99 <= 100 ns at 1
    thread; for sim the added p50 <= 15 ns at 1 thread, at most 1.2x that at every larger
    thread count (also shown as the ratio of the paired means, finer than a VM's 10 ns TSC
    steps), and p99 <= 100 ns at every thread count. The floor's figures (a configuration
    named floor or skip32) are shown beside, when the run has one."""
    lines = []
    p50_max = H200_P50 if driver == "h200" else SIM_P50
    floor = [r for r in rows if r["config"] in FLOOR and r["threads"] == 1]
    floor_note = ""
    if floor:
        floor_note = (f" (the floor, same rounds: {added_at(floor, 'alloc', 'p50'):+.0f} / {added_at(floor, 'free', 'p50'):+.0f},"
                      f" mean {paired_mean(floor, 'alloc'):+.1f} / {paired_mean(floor, 'free'):+.1f})")
    for config in [c for c in dict.fromkeys(r["config"] for r in rows) if c in HOOKED]:
        by_threads = {t: [r for r in rows if r["config"] == config and r["threads"] == t]
                      for t in sorted({r["threads"] for r in rows if r["config"] == config})}
        lines.append(f"#15 targets ({driver}), {config}:")
        one = by_threads.get(1)
        if one:
            a, f = added_at(one, "alloc", "p50"), added_at(one, "free", "p50")
            lines.append(f"  1 thread, added p50 <= {p50_max} ns: alloc {a:+.0f}, free {f:+.0f}"
                         f" (mean {paired_mean(one, 'alloc'):+.1f} / {paired_mean(one, 'free'):+.1f}): {verdict(max(a, f) <= p50_max)}{floor_note}")
        else:
            lines.append("  1 thread: NOT MEASURED (the median targets are judged at 1 thread)")
        for t, rs in by_threads.items():
            if driver == "sim" and t > 1 and one:
                ok = all(added_at(rs, c, "p50") <= THREAD_RATIO * max(added_at(one, c, "p50"), 1) for c in ("alloc", "free"))
                ratios = " / ".join(f"{paired_mean(rs, c) / max(paired_mean(one, c), 1):.2f}x" for c in ("alloc", "free"))
                lines.append(f"  {t} threads, added p50 <= {THREAD_RATIO}x that at 1 thread: alloc {added_at(rs, 'alloc', 'p50'):+.0f},"
                             f" free {added_at(rs, 'free', 'p50'):+.0f} (ratio of the means {ratios}): {verdict(ok)}")
            a, f = added_at(rs, "alloc", "p99"), added_at(rs, "free", "p99")
            if driver == "sim" or t == 1:
                lines.append(f"  {t} thread{'s' if t > 1 else ''}, added p99 <= {P99} ns: alloc {a:+.0f}, free {f:+.0f}:"
                             f" {verdict(max(a, f) <= P99)}")
    return lines


args = sys.argv[1:]
driver = None
if "--targets" in args:
    at = args.index("--targets")
    driver = args[at + 1] if at + 1 < len(args) else None
    if driver not in ("h200", "sim"):
        sys.exit("pair_summary.py: --targets takes h200 or sim")
    del args[at:at + 2]
rows = [json.loads(line) for line in open(args[0]) if line.startswith("{")]
configs = list(dict.fromkeys(r["config"] for r in rows))
med = statistics.median
print(f"{'config':18} {'thr':>3} {'call':5} | {'plain p50':>9} {'p99':>6} {'p99.9':>6} | {'hooked p50':>10} {'p99':>6}"
      f" {'p99.9':>6} | {'added p50':>9} {'p99':>6} {'p99.9':>6} | {'paired p50':>10} {'mean':>6} | {'p50 spread':>13}")
for config in configs:
    for threads in sorted({r["threads"] for r in rows if r["config"] == config}):
        rs = [r for r in rows if r["config"] == config and r["threads"] == threads]
        for call in ("alloc", "free"):
            p = {q: med(r[f"plain_{call}_{q}_ns"] for r in rs) for q in ("p50", "p99", "p999")}
            h = {q: med(r[f"hooked_{call}_{q}_ns"] for r in rs) for q in ("p50", "p99", "p999")}
            added = {q: added_at(rs, call, q) for q in ("p50", "p99", "p999")}
            spread = [r[f"hooked_{call}_p50_ns"] - r[f"plain_{call}_p50_ns"] for r in rs]
            paired = med(r[f"paired_{call}_p50_ns"] for r in rs)
            mean = paired_mean(rs, call)
            print(f"{config:18} {threads:>3} {call:5} | {p['p50']:>9.0f} {p['p99']:>6.0f} {p['p999']:>6.0f} |"
                  f" {h['p50']:>10.0f} {h['p99']:>6.0f} {h['p999']:>6.0f} | {added['p50']:>+9.0f} {added['p99']:>+6.0f}"
                  f" {added['p999']:>+6.0f} | {paired:>+10.1f} {mean:>+6.1f} | {min(spread):>+6.0f}..{max(spread):<+6.0f}")
# Periodic work of the hook (a new ring page every 64 events, a check every 256th
# allocation) costs a few positions of the loop much more than the others: that is what a
# p99 is made of when it comes more often than once in 100 calls. Per configuration and
# call, the median over rounds at each position (i % 256), against the median position.
periodic = []
for config in configs:
    for threads in sorted({r["threads"] for r in rows if r["config"] == config}):
        rs = [r for r in rows if r["config"] == config and r["threads"] == threads and "phase_alloc_p50_ns" in r]
        for call in ("alloc", "free") if rs else ():
            n = min(len(r[f"phase_{call}_p50_ns"]) for r in rs)
            phases = [med(r[f"phase_{call}_p50_ns"][k] for r in rs) for k in range(n)]
            base = med(phases)
            spikes = sorted(((v - base, k) for k, v in enumerate(phases) if v - base >= 10), reverse=True)
            excess = sum(max(0.0, v - base) for v in phases) / n
            shown = " ".join(f"{k}:{d:+.0f}" for d, k in spikes[:6]) or "none"
            periodic.append(f"{config:18} {threads:>3} {call:5} | median position {base:+6.1f} | mean excess {excess:+5.1f}"
                            f" | {len(spikes)} of {n} positions >= 10 ns above it: {shown}")
if periodic:
    print("by position in the loop (paired p50 at each position i % 256 of a thread's iterations):")
    print("\n".join(periodic))
faults = {c: (sum(r["minflt"] for r in rows if r["config"] == c), sum(r["majflt"] for r in rows if r["config"] == c))
          for c in configs}
print("page faults in the timed loops (minor/major, all rounds): "
      + ", ".join(f"{c} {mi}/{ma}" for c, (mi, ma) in faults.items()))
errors = sum(r["errors"] for r in rows)
if errors:
    print(f"WARNING: {errors} calls returned errors")
drops = [(r["config"], r["ring_dropped"]) for r in rows if r.get("ring_dropped")]
if drops:
    print(f"WARNING: hooked runs dropped events (the cheaper drop path was measured): {drops}")
clocks = sorted({r["ring_clock"] for r in rows if r.get("ring_clock")})
if clocks:
    print(f"ring clock: {', '.join(clocks)}; rounds: {len({r['round'] for r in rows})}")
if driver:
    print("\n".join(targets(rows, driver)))
