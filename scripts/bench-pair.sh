#!/usr/bin/env bash
# Hook cost per call on the simulated driver, measured inside one process: bench_pair
# (tests/simcuda/workloads/bench_pair.c) calls libcuda's own cuMemAlloc_v2/cuMemFree_v2 and
# the program's (vramhook's wrapper under LD_PRELOAD) side by side in every iteration, each
# call timed alone with the TSC (VRAMHOOK_SIM_FAST=1: the simulated calls take no lock).
# For each thread count: BENCH_ROUNDS (default 10) interleaved rounds of an "aa" process (no
# LD_PRELOAD: the method's own error) and a "hooked" one; the table is
# scripts/bench_pair_summary.py's. A 1-thread run is pinned to BENCH_CPU (default the last
# CPU), more threads to every CPU.
# Env: VRAMHOOK_LIB (default target/release/libvramhook.so), BENCH_ITERS (20000),
# BENCH_THREADS ("1 16"), BENCH_ROUNDS, BENCH_CPU, BENCH_JSONL (keep the runs' lines there),
# SIM_SKIP_BUILD=1 (use tests/simcuda/build as it is).
set -euo pipefail
BENCH_NAME=bench-pair
# shellcheck source=scripts/bench-sim-env.sh
source "$(dirname "${BASH_SOURCE[0]}")/bench-sim-env.sh"
ROUNDS="${BENCH_ROUNDS:-10}"
BENCH="$ROOT/tests/simcuda/build/workloads/bench_pair"
RINGS="$(mktemp -d /dev/shm/vramhook-pair.XXXXXX 2>/dev/null || mktemp -d)"
JSONL="${BENCH_JSONL:-$RINGS.jsonl}"
trap 'rm -rf "$RINGS"; [ -n "${BENCH_JSONL:-}" ] || rm -f "$JSONL"' EXIT
: > "$JSONL"
for threads in $THREADS; do
    if [ "$threads" = 1 ]; then pin="$CPU"; else pin="0-$((NCPU - 1))"; fi
    for round in $(seq "$ROUNDS"); do
        for config in aa hooked; do
            rm -rf "$RINGS/r"
            if [ "$config" = hooked ]; then
                line=$(env VRAMHOOK_SIM_FAST=1 VRAMHOOK_DIR="$RINGS/r" VRAMHOOK_RING_SLOTS=2097152 LD_PRELOAD="$LIB" \
                    taskset -c "$pin" "$BENCH" --sync --threads "$threads" --iters "$ITERS")
            else
                line=$(env VRAMHOOK_SIM_FAST=1 taskset -c "$pin" "$BENCH" --sync --threads "$threads" --iters "$ITERS")
            fi
            python3 -c 'import json, sys; d = {"config": sys.argv[1], "round": int(sys.argv[2])}; d.update(json.loads(sys.argv[3])); print(json.dumps(d))' \
                "$config" "$round" "$line" >> "$JSONL"
        done
    done
done
python3 "$ROOT/scripts/bench_pair_summary.py" "$JSONL"
echo "(ns per call; simulated driver, cuMemAlloc_v2/cuMemFree_v2 with VRAMHOOK_SIM_FAST=1; $ITERS iterations per thread after 256 untimed; 1 thread pinned to CPU $CPU, more to CPUs 0-$((NCPU - 1)); $(nproc) CPUs)"
