#!/usr/bin/env bash
# Benchmarks on the GPU machine (16 real cores; run after scripts/gpu/prepare.sh here):
#   bash scripts/gpu/bench.sh [OUTDIR] [PART...]     (default: every part)
# - calls: hooked vs plain cost of the cheapest real calls on the H200, side by side in
#   BENCH_ROUNDS (12) interleaved rounds of BENCH_ITERS (10000), both pinned to CPU
#   BENCH_CPU (3): p50, p99 and p99.9 of each, "added" = hooked - plain at the same
#   percentile, the page faults of the timed loops, what the hooked runs left in their
#   ring (no drops: the recording path is what is measured), and what rdtsc,
#   cuCtxGetDevice and cuCtxGetCurrent cost there
# - sim: scripts/bench-calls.sh (the simulated driver) on this host's 16 cores; needs
#   tests/simcuda/build from the development machine (carried)
# - model, replay, agent: the crates' benchmarks (.gpu/bench_*)
# - misses: VRAMHOOK_DEBUG=1 on real programs, naming any entry point that could not be wrapped
# VRAMHOOK_LIB (default .gpu/libvramhook.so) is the library measured.
set -u
OUT="${1:-${OUT:-/tmp/vramhook-bench}}"
shift || true
PARTS="${*:-calls sim model replay agent misses}"
mkdir -p "$OUT"
export VRAMHOOK_LIB="${VRAMHOOK_LIB:-$PWD/.gpu/libvramhook.so}"
case "$VRAMHOOK_LIB" in /*) ;; *) VRAMHOOK_LIB="$PWD/$VRAMHOOK_LIB" ;; esac
ROUNDS="${BENCH_ROUNDS:-12}"
ITERS="${BENCH_ITERS:-10000}"
CPU="${BENCH_CPU:-3}"
has() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

calls() {
    echo "== real H200: cheapest calls, $ROUNDS interleaved rounds of $ITERS, both pinned to CPU $CPU"
    nvcc -O2 -o /tmp/bench_real scripts/gpu/bench_real.cu || return 1
    # Rings live in /dev/shm by default; a container's small /dev/shm would shrink the
    # ring (a ring takes at most 10% of the free space) and the run would measure drops.
    local base=/dev/shm free_kb
    free_kb=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 {print $4}')
    if [ -z "$free_kb" ] || [ "$free_kb" -lt $((1024 * 1024)) ]; then base=/tmp; fi
    local rings="$base/vh-bench.$$"
    echo "ring directory: $rings ($(stat -f -c %T "$base"), $(df -Ph "$base" | awk 'NR == 2 {print $4}') free)"
    : > "$OUT/bench_real.jsonl"
    for round in $(seq "$ROUNDS"); do
        taskset -c "$CPU" /tmp/bench_real "$ITERS" | sed "s/^{/{\"hooked\":false,\"round\":$round,/" >> "$OUT/bench_real.jsonl"
        rm -rf "$rings"
        local line stats
        line=$(VRAMHOOK_DIR="$rings" VRAMHOOK_RING_SLOTS=1048576 LD_PRELOAD="$VRAMHOOK_LIB" taskset -c "$CPU" /tmp/bench_real "$ITERS")
        stats=$(python3 scripts/gpu/bench_ring_stats.py "$rings")
        echo "$line" | sed "s/^{/{\"hooked\":true,\"round\":$round,${stats:1:${#stats}-2},/" >> "$OUT/bench_real.jsonl"
    done
    rm -rf "$rings"
    python3 - "$OUT/bench_real.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
plain = [r for r in rows if not r["hooked"]]
hooked = [r for r in rows if r["hooked"]]
med = statistics.median
print(f"{'call':22} | {'plain p50':>9} {'p99':>6} {'p99.9':>6} | {'hooked p50':>10} {'p99':>6} {'p99.9':>6} |"
      f" {'added p50':>9} {'p99':>6} {'p99.9':>6} {'p50 spread':>12}")
for k in ("cudaMallocAsync_1MiB", "cudaFreeAsync", "cudaMalloc_512B", "cudaFree_512B"):
    p = {q: med(r[f"{k}_{q}_ns"] for r in plain) for q in ("p50", "p99", "p999")}
    h = {q: med(r[f"{k}_{q}_ns"] for r in hooked) for q in ("p50", "p99", "p999")}
    spread = [b[f"{k}_p50_ns"] - a[f"{k}_p50_ns"] for a, b in zip(plain, hooked)]
    print(f"{k:22} | {p['p50']:>9.0f} {p['p99']:>6.0f} {p['p999']:>6.0f} | {h['p50']:>10.0f} {h['p99']:>6.0f} {h['p999']:>6.0f} |"
          f" {h['p50'] - p['p50']:>+9.0f} {h['p99'] - p['p99']:>+6.0f} {h['p999'] - p['p999']:>+6.0f} {min(spread):>+6.0f}..{max(spread):<+6.0f}")
for side, rs in (("plain", plain), ("hooked", hooked)):
    f = {k: sum(r[k] for r in rs) for k in ("async_loop_minflt", "async_loop_majflt", "malloc_loop_minflt", "malloc_loop_majflt")}
    print(f"page faults in the timed loops, {side} (all rounds): async minor/major {f['async_loop_minflt']}/{f['async_loop_majflt']},"
          f" malloc/free minor/major {f['malloc_loop_minflt']}/{f['malloc_loop_majflt']}")
print(f"hooked rounds' rings: {sum(r['ring_events'] for r in hooked)} events, {sum(r['ring_dropped'] for r in hooked)} dropped,"
      f" {hooked[0]['ring_lanes']} lanes of {hooked[0]['ring_slots_per_lane']} slots")
print(f"on this machine, per call (median over rounds): rdtsc {med(r['rdtsc_ns'] for r in plain):.1f} ns,"
      f" cuCtxGetDevice {med(r['cuCtxGetDevice_ns'] for r in plain):.1f} ns, cuCtxGetCurrent {med(r['cuCtxGetCurrent_ns'] for r in plain):.1f} ns")
PY
}

sim() {
    echo "== simulated driver on this host: scripts/bench-calls.sh (SIM_SKIP_BUILD=1)"
    : > "$OUT/bench_sim.jsonl"
    SIM_SKIP_BUILD=1 BENCH_JSONL="$OUT/bench_sim.jsonl" bash scripts/bench-calls.sh
}

{
has calls && calls
has sim && sim
if has model; then
    echo "== model benchmark (one core)"
    .gpu/bench_model
fi
if has replay; then
    echo "== analyzer replay benchmark (one core): raw read vs end to end"
    .gpu/bench_replay --dir /tmp
fi
if has agent; then
    echo "== agent benchmark"
    .gpu/bench_agent
fi
if has misses; then
    echo "== entry points that could not be wrapped (hook_miss events in the captures)"
    nvcc -O2 -o /tmp/probe_shared -cudart shared scripts/gpu/alloc_probe.cu -lcuda
    .gpu/vramhook run --record /tmp/miss1.vhc -- /tmp/probe_shared > /dev/null
    .gpu/vramhook dump /tmp/miss1.vhc | grep hook_miss
    .gpu/vramhook run --record /tmp/miss2.vhc -- python3 -c 'import torch; torch.empty(1, device="cuda")'
    .gpu/vramhook dump /tmp/miss2.vhc | grep hook_miss
fi
} 2>&1 | tee "$OUT/bench.txt"
