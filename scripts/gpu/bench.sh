#!/usr/bin/env bash
# Benchmarks on the GPU machine (16 real cores; run after scripts/gpu/prepare.sh here):
#   bash scripts/gpu/bench.sh [OUTDIR] [PART...]     (default: every part)
# - calls: hooked vs plain cost of the cheapest real calls on the H200, side by side in
#   BENCH_ROUNDS (12) interleaved rounds of BENCH_ITERS (10000), both pinned to CPU
#   BENCH_CPU (3): p50, p99 and p99.9 of each, "added" = hooked - plain at the same
#   percentile, the page faults of the timed loops, what the hooked runs left in their
#   ring (no drops: the recording path is what is measured), and what rdtsc,
#   cuCtxGetDevice and cuCtxGetCurrent cost there
# - pair: the hook's cost inside one process (.gpu/bench_pair, built from
#   tests/simcuda/workloads/bench_pair.c): every iteration calls libcuda's own
#   cuMemAllocAsync/cuMemFreeAsync and the program's (vramhook's wrapper) side by side.
#   Configurations (BENCH_PAIR_CONFIGS, see pair below), interleaved over BENCH_ROUNDS
#   rounds: aa (no LD_PRELOAD: the method's own error), hooked, and with
#   .gpu/libvramhook-parts.so (cargo feature bench-parts) the hook with parts left out,
#   VRAMHOOK_DISABLE=1 (the wrapper alone) and VRAMHOOK_CLOCK=monotonic
# - simpair: scripts/bench/pair.sh (the simulated driver, inside one process) on this
#   host's cores, at 1 and 16 threads, configurations BENCH_SIMPAIR_CONFIGS (default "aa
#   hooked"; see that script); needs tests/simcuda/build (carried)
# pair and simpair end with issue #15's targets judged (scripts/bench/pair_summary.py --targets)
# - sim: scripts/bench/calls.sh (the simulated driver) on this host's 16 cores; needs
#   tests/simcuda/build from the development machine (carried)
# - model, replay, agent: the crates' benchmarks (.gpu/bench_*)
# - misses: VRAMHOOK_DEBUG=1 on real programs, naming any entry point that could not be wrapped
# VRAMHOOK_LIB (default .gpu/libvramhook.so) is the library measured.
set -u
OUT="${1:-${OUT:-/tmp/vramhook-bench}}"
shift || true
PARTS="${*:-pair calls simpair sim model replay agent misses}"
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

# pair_config NAME ROUND LIB [ENV...]: one bench_pair process, its JSON line tagged
pair_config() {
    local name=$1 round=$2 lib=$3 line stats='{}'
    shift 3
    local rings="$PAIR_RINGS/$name"
    rm -rf "$rings"
    if [ -n "$lib" ]; then
        line=$(env "$@" VRAMHOOK_DIR="$rings" VRAMHOOK_RING_SLOTS=1048576 LD_PRELOAD="$lib" \
            taskset -c "$CPU" .gpu/bench_pair --iters "$PAIR_ITERS")
        # No ring where nothing was written (VRAMHOOK_DISABLE=1, or the write left out).
        [ ! -d "$rings" ] || stats=$(python3 scripts/gpu/bench_ring_stats.py "$rings")
    else
        line=$(taskset -c "$CPU" .gpu/bench_pair --iters "$PAIR_ITERS")
    fi
    python3 -c 'import json, sys; d = {"config": sys.argv[1], "round": int(sys.argv[2])}; d.update(json.loads(sys.argv[3])); d.update(json.loads(sys.argv[4])); print(json.dumps(d))' \
        "$name" "$round" "$line" "$stats" >> "$OUT/bench_pair.jsonl"
}

pair() {
    PAIR_ITERS="${BENCH_PAIR_ITERS:-20000}"
    echo "== real H200: hook cost inside one process (bench_pair), $ROUNDS interleaved rounds of $PAIR_ITERS pairs, pinned to CPU $CPU"
    echo "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null);" \
        "tsc flags: $(grep -o -w 'constant_tsc\|nonstop_tsc\|tsc_known_freq\|rdtscp' /proc/cpuinfo | sort -u | tr '\n' ' ')"
    local parts_lib="$PWD/.gpu/libvramhook-parts.so"
    PAIR_RINGS=$(mktemp -d /dev/shm/vh-pair.XXXXXX)
    : > "$OUT/bench_pair.jsonl"
    # BENCH_PAIR_CONFIGS picks configurations: aa, hooked, baseline (an older build,
    # BENCH_BASELINE_LIB, beside this one in the same rounds), lib-NAME (another build,
    # .gpu/libvramhook-NAME.so), wrapper-only
    # (VRAMHOOK_DISABLE=1), monotonic (VRAMHOOK_CLOCK=monotonic), and skipN: the parts build
    # with VRAMHOOK_BENCH_SKIP=N (bits: 1 no clock, 2 no ring write, 4 no device lookup,
    # 8 no look at the slot's stamp, 16 the next slot asked for before the driver runs, 32 the
    # floor: a time stamp and one 64-byte store to a line of the thread's own, no record,
    # 64 no work on a thread's every 256th allocation: device check, look at the clock, 128 the
    # ring writer's page-ahead prefetch of the builds before, once per page, 256 and 512 the
    # stamp from a process-wide counter or from CLOCK_MONOTONIC_COARSE instead of the TSC:
    # timed, not usable, as neither keeps the ring's order; 1024 the allocations stamped
    # before their driver call, as the releases are: timed only).
    local configs="${BENCH_PAIR_CONFIGS:-aa hooked baseline skip0 skip1 skip2 skip4 skip8 skip16 wrapper-only monotonic}"
    for round in $(seq "$ROUNDS"); do
        for config in $configs; do
            case "$config" in
                aa) pair_config aa "$round" "" ;;
                hooked) pair_config hooked "$round" "$VRAMHOOK_LIB" ;;
                baseline) [ -z "${BENCH_BASELINE_LIB:-}" ] || pair_config baseline "$round" "$PWD/$BENCH_BASELINE_LIB" ;;
                lib-*) pair_config "$config" "$round" "$PWD/.gpu/libvramhook-${config#lib-}.so" ;;
                wrapper-only) pair_config wrapper-only "$round" "$parts_lib" VRAMHOOK_DISABLE=1 ;;
                monotonic) pair_config monotonic "$round" "$VRAMHOOK_LIB" VRAMHOOK_CLOCK=monotonic ;;
                skip*) pair_config "$config" "$round" "$parts_lib" VRAMHOOK_BENCH_SKIP="${config#skip}" ;;
                *) echo "bench.sh: unknown configuration $config" >&2 ;;
            esac
        done
    done
    rm -rf "$PAIR_RINGS"
    python3 scripts/bench/pair_summary.py "$OUT/bench_pair.jsonl" --targets h200
}

simpair() {
    echo "== simulated driver on this host, inside one process: scripts/bench/pair.sh (SIM_SKIP_BUILD=1)"
    SIM_SKIP_BUILD=1 BENCH_ROUNDS="$ROUNDS" BENCH_JSONL="$OUT/bench_simpair.jsonl" \
        BENCH_PAIR_CONFIGS="${BENCH_SIMPAIR_CONFIGS:-aa hooked}" BENCH_PARTS_LIB="$PWD/.gpu/libvramhook-parts.so" \
        bash scripts/bench/pair.sh
}

sim() {
    echo "== simulated driver on this host: scripts/bench/calls.sh (SIM_SKIP_BUILD=1)"
    : > "$OUT/bench_sim.jsonl"
    SIM_SKIP_BUILD=1 BENCH_JSONL="$OUT/bench_sim.jsonl" bash scripts/bench/calls.sh
}

{
has pair && pair
has calls && calls
has simpair && simpair
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
