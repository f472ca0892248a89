#!/usr/bin/env bash
# Hook cost per call on the simulated driver, measured inside one process: bench_pair
# (tests/simcuda/workloads/bench_pair.c) calls libcuda's own cuMemAlloc_v2/cuMemFree_v2 and
# the program's (vramhook's wrapper under LD_PRELOAD) side by side in every iteration, each
# call timed alone with the TSC (VRAMHOOK_SIM_FAST=1: the simulated calls take no lock).
# For each thread count: BENCH_ROUNDS (default 10) interleaved rounds of an "aa" process (no
# LD_PRELOAD: the method's own error) and a "hooked" one; the table is
# scripts/bench/pair_summary.py's. A 1-thread run is pinned to BENCH_CPU (default the last
# CPU), more threads to every CPU.
# Env: VRAMHOOK_LIB (default target/release/libvramhook.so), BENCH_ITERS (20000),
# BENCH_THREADS ("1 16"), BENCH_ROUNDS, BENCH_CPU, BENCH_JSONL (keep the runs' lines there),
# SIM_SKIP_BUILD=1 (use tests/simcuda/build as it is), BENCH_PAIR_CONFIGS (default "aa
# hooked"; also lanes16: the hook with a lane per thread, VRAMHOOK_RING_LANES=16; and, at 1
# thread only, from the bench-parts build (BENCH_PARTS_LIB, default
# target/bench-parts/release/libvramhook.so: cargo build --release -p vramhook-interposer
# --features bench-parts --target-dir target/bench-parts): floor, the floor #15 sets the goal
# against (a TSC read and one 64-byte store), and noclock, the hook without its clock read;
# at every thread count, counter and coarse: the hook stamping with a process-wide counter
# (a locked add) or the kernel's coarse clock instead of the TSC, timed only: neither keeps
# the ring's order; and before: allocations stamped before their driver call, as releases are).
# The summary ends with #15's targets judged (pair_summary.py --targets sim).
set -euo pipefail
BENCH_NAME=bench-pair
# shellcheck source=scripts/bench/sim-env.sh
source "$(dirname "${BASH_SOURCE[0]}")/sim-env.sh"
ROUNDS="${BENCH_ROUNDS:-10}"
RINGS="$(mktemp -d /dev/shm/vramhook-pair.XXXXXX 2>/dev/null || mktemp -d)"
JSONL="${BENCH_JSONL:-$RINGS.jsonl}"
trap 'rm -rf "$RINGS"; [ -n "${BENCH_JSONL:-}" ] || rm -f "$JSONL"' EXIT
: > "$JSONL"
CONFIGS="${BENCH_PAIR_CONFIGS:-aa hooked}"
PARTS_LIB="${BENCH_PARTS_LIB:-$ROOT/target/bench-parts/release/libvramhook.so}"
for config in $CONFIGS; do
    case "$config" in
        aa | hooked | lanes16) ;;
        floor | noclock | counter | coarse | before)
            if [ ! -f "$PARTS_LIB" ]; then
                echo "## $BENCH_NAME: configuration $config needs the bench-parts build, NOT FOUND: $PARTS_LIB" >&2
                exit 1
            fi ;;
        *) echo "## $BENCH_NAME: unknown configuration $config" >&2; exit 1 ;;
    esac
done
for threads in $THREADS; do
    if [ "$threads" = 1 ]; then pin="$CPU"; else pin="0-$((NCPU - 1))"; fi
    for round in $(seq "$ROUNDS"); do
        for config in $CONFIGS; do
            rm -rf "$RINGS/r"
            hook=(env VRAMHOOK_SIM_FAST=1 VRAMHOOK_DIR="$RINGS/r" VRAMHOOK_RING_SLOTS=2097152)
            case "$config" in
                aa) run=(env VRAMHOOK_SIM_FAST=1) ;;
                hooked) run=("${hook[@]}" LD_PRELOAD="$LIB") ;;
                lanes16) run=("${hook[@]}" VRAMHOOK_RING_LANES=16 LD_PRELOAD="$LIB") ;;
                # The floor writes one line shared by all threads: a 1-thread measurement.
                floor) [ "$threads" = 1 ] || continue; run=("${hook[@]}" VRAMHOOK_BENCH_SKIP=32 LD_PRELOAD="$PARTS_LIB") ;;
                noclock) [ "$threads" = 1 ] || continue; run=("${hook[@]}" VRAMHOOK_BENCH_SKIP=1 LD_PRELOAD="$PARTS_LIB") ;;
                counter) run=("${hook[@]}" VRAMHOOK_BENCH_SKIP=256 LD_PRELOAD="$PARTS_LIB") ;;
                coarse) run=("${hook[@]}" VRAMHOOK_BENCH_SKIP=512 LD_PRELOAD="$PARTS_LIB") ;;
                before) run=("${hook[@]}" VRAMHOOK_BENCH_SKIP=1024 LD_PRELOAD="$PARTS_LIB") ;;
            esac
            line=$("${run[@]}" taskset -c "$pin" "$BENCH" --sync --threads "$threads" --iters "$ITERS")
            python3 -c 'import json, sys; d = {"config": sys.argv[1], "round": int(sys.argv[2])}; d.update(json.loads(sys.argv[3])); print(json.dumps(d))' \
                "$config" "$round" "$line" >> "$JSONL"
        done
    done
done
python3 "$ROOT/scripts/bench/pair_summary.py" "$JSONL" --targets sim
echo "(ns per call; simulated driver, cuMemAlloc_v2/cuMemFree_v2 with VRAMHOOK_SIM_FAST=1; $ITERS iterations per thread after 256 untimed; 1 thread pinned to CPU $CPU, more to CPUs 0-$((NCPU - 1)); $(nproc) CPUs)"
