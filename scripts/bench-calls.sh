#!/usr/bin/env bash
# Hook overhead per driver call, on the simulated driver (no GPU needed).
# Builds tests/simcuda, runs bench_calls for 1 and 16 threads, plain and with
# LD_PRELOAD=$VRAMHOOK_LIB (default target/release/libvramhook.so), and prints the
# median added ns per call (hooked - plain) and the ratio hooked/plain.
# Env: VRAMHOOK_LIB, BENCH_ITERS (default 20000), BENCH_THREADS (default "1 16"),
# BENCH_REPEAT (default 5): plain and hooked runs alternate that many times and the table
# gives the median of the runs' medians, with the spread of the added cost.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LIB="${VRAMHOOK_LIB:-target/release/libvramhook.so}"
case "$LIB" in /*) ;; *) LIB="$ROOT/$LIB" ;; esac
ITERS="${BENCH_ITERS:-20000}"
THREADS="${BENCH_THREADS:-1 16}"
REPEAT="${BENCH_REPEAT:-5}"

if [ ! -f "$LIB" ]; then
    echo "############################################################" >&2
    echo "## bench-calls: interposer library NOT FOUND: $LIB" >&2
    echo "## build it (cargo build --release) or set VRAMHOOK_LIB" >&2
    echo "############################################################" >&2
    exit 1
fi

# SIM_SKIP_BUILD=1 uses an existing build (the GPU machine has no make).
[ "${SIM_SKIP_BUILD:-0}" = 1 ] || make -s -C "$ROOT/tests/simcuda" -j2 all
BENCH="$ROOT/tests/simcuda/build/workloads/bench_calls"
TMP="$(mktemp -d /tmp/bench-calls.XXXXXX)"
trap 'rm -rf "$TMP"' EXIT

# run_one LABEL THREADS [preload] -> JSON line on stdout
run_one() {
    local threads=$1 preload=${2:-}
    local out
    if [ -n "$preload" ]; then
        # A private ring big enough for every event: this measures the recording path,
        # not the (cheaper) path that drops events when a ring is full.
        rm -rf "$TMP/rings"
        out=$(env VRAMHOOK_SIM_FAST=1 VRAMHOOK_DIR="$TMP/rings" VRAMHOOK_RING_SLOTS=2097152 \
              LD_PRELOAD="$preload" "$BENCH" --threads "$threads" --iters "$ITERS")
    else
        out=$(env VRAMHOOK_SIM_FAST=1 "$BENCH" --threads "$threads" --iters "$ITERS")
    fi
    echo "$out" | grep '^{'
}

printf '%-8s %-6s %12s %12s %12s %10s %16s %8s\n' threads call plain_med hooked_med hooked_p99 added_ns added_min..max ratio
for t in $THREADS; do
    runs=()
    for _ in $(seq "$REPEAT"); do
        runs+=("$(run_one "$t")" "$(run_one "$t" "$LIB")")
    done
    python3 - "$t" "${runs[@]}" <<'PY'
import json, statistics, sys
t, rows = sys.argv[1], [json.loads(r) for r in sys.argv[2:]]
plain, hooked = rows[0::2], rows[1::2]
for call in ("alloc", "free"):
    pm = [r[f"{call}_median_ns"] for r in plain]
    hm = [r[f"{call}_median_ns"] for r in hooked]
    added = [h - p for p, h in zip(pm, hm)]
    p, h = statistics.median(pm), statistics.median(hm)
    hp99 = statistics.median(r[f"{call}_p99_ns"] for r in hooked)
    print(f"{t:<8} {call:<6} {p:>12.0f} {h:>12.0f} {hp99:>12.0f} {h - p:>10.0f} {min(added):>7}..{max(added):<8} {h / p:>8.2f}")
if any(r.get("errors") for r in rows):
    print("warning: calls returned errors", file=sys.stderr)
PY
done
echo "(ns per call: median over all threads' calls, then the median over $REPEAT alternating runs; VRAMHOOK_SIM_FAST=1; $ITERS iterations per thread)"

# Instructions are counted exactly (callgrind), whatever else the machine is doing: the
# added instructions per call are the stable measure of the hook's cost.
if command -v valgrind >/dev/null; then
    count() {
        local out="$TMP/cg.$1"
        rm -rf "$TMP/rings"
        env VRAMHOOK_SIM_FAST=1 VRAMHOOK_DIR="$TMP/rings" VRAMHOOK_RING_SLOTS=65536 ${2:+LD_PRELOAD="$2"} \
            valgrind --tool=callgrind --callgrind-out-file="$out" "$BENCH" --threads 1 --iters 20000 >/dev/null 2>&1
        callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'
    }
    plain_ir=$(count plain)
    hooked_ir=$(count hooked "$LIB")
    echo "instructions added per call (callgrind, 1 thread, 40000 calls): $(( (hooked_ir - plain_ir) / 40000 ))"
else
    echo "(valgrind not installed: instruction counts skipped)"
fi
