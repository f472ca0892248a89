#!/usr/bin/env bash
# Hook overhead per driver call, on the simulated driver (no GPU needed).
# Builds tests/simcuda, runs bench_calls for 1 and 16 threads, plain and with
# LD_PRELOAD=$VRAMHOOK_LIB (default target/release/libvramhook.so), and prints the
# median added ns per call (hooked - plain) and the ratio hooked/plain.
# Env: VRAMHOOK_LIB, BENCH_ITERS (default 20000), BENCH_THREADS (default "1 16").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LIB="${VRAMHOOK_LIB:-target/release/libvramhook.so}"
case "$LIB" in /*) ;; *) LIB="$ROOT/$LIB" ;; esac
ITERS="${BENCH_ITERS:-20000}"
THREADS="${BENCH_THREADS:-1 16}"

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

printf '%-8s %-6s %12s %12s %12s %12s %10s %10s\n' threads call plain_med hooked_med plain_p99 hooked_p99 added_ns ratio
for t in $THREADS; do
    plain=$(run_one "$t")
    hooked=$(run_one "$t" "$LIB")
    python3 - "$t" "$plain" "$hooked" <<'PY'
import json, sys
t, p, h = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
for call in ("alloc", "free"):
    pm, hm = p[f"{call}_median_ns"], h[f"{call}_median_ns"]
    pp, hp = p[f"{call}_p99_ns"], h[f"{call}_p99_ns"]
    ratio = hm / pm if pm else float("inf")
    print(f"{t:<8} {call:<6} {pm:>12} {hm:>12} {pp:>12} {hp:>12} {hm - pm:>10} {ratio:>10.2f}")
if p.get("errors") or h.get("errors"):
    print(f"warning: errors plain={p.get('errors')} hooked={h.get('errors')}", file=sys.stderr)
PY
done
echo "(ns per call, median over all threads' calls; VRAMHOOK_SIM_FAST=1; $ITERS iterations per thread)"
