#!/usr/bin/env bash
# Per-call cost, side by side in one run: no tracing, LD_PRELOAD (the interposer), eBPF
# uprobes (`vramhook agent --ebpf`, attached to the same libcuda), on the simulated driver.
# Runs alternate (plain, preload, ebpf) BENCH_REPEAT times; the table gives the median of
# the runs' medians, the added ns per call and the ratio to no tracing.
# Needs root (or CAP_BPF + CAP_PERFMON) for the eBPF column; without it that column says why.
# Env: VRAMHOOK_BIN (default target/release/vramhook), VRAMHOOK_LIB (default
# target/release/libvramhook.so), BENCH_ITERS (default 20000), BENCH_THREADS (default "1 16"),
# BENCH_REPEAT (default 5), SIM_SKIP_BUILD=1 (use an existing tests/simcuda build).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="${VRAMHOOK_BIN:-$ROOT/target/release/vramhook}"
LIB="${VRAMHOOK_LIB:-$ROOT/target/release/libvramhook.so}"
ITERS="${BENCH_ITERS:-20000}"
THREADS="${BENCH_THREADS:-1 16}"
REPEAT="${BENCH_REPEAT:-5}"
for f in "$BIN" "$LIB"; do
    [ -f "$f" ] || { echo "bench-ebpf: $f NOT FOUND (cargo build --release)" >&2; exit 1; }
done
[ "${SIM_SKIP_BUILD:-0}" = 1 ] || make -s -C "$ROOT/tests/simcuda" -j2 all
SIM="$ROOT/tests/simcuda/build"
BENCH="$SIM/workloads/bench_calls"
TMP="$(mktemp -d /tmp/bench-ebpf.XXXXXX)"
AGENT_PID=""
cleanup() {
    [ -n "$AGENT_PID" ] && kill -TERM "$AGENT_PID" 2>/dev/null && wait "$AGENT_PID" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT

# The agent with its probes on the simulated libcuda, for the whole run (tracing every
# process that maps it; no HTTP, no capture: the cost measured is the probes' and the
# ring buffer's, the agent drains on its own cores).
ebpf_ok=0
"$BIN" agent --ebpf --ebpf-libcuda "$SIM/libcuda.so.1" --no-http --no-recover --ring-dir "$TMP/agent-rings" \
    2> "$TMP/agent.log" &
AGENT_PID=$!
for _ in $(seq 100); do
    if grep -q "eBPF probes attached" "$TMP/agent.log"; then ebpf_ok=1; break; fi
    kill -0 "$AGENT_PID" 2>/dev/null || break
    sleep 0.1
done
if [ "$ebpf_ok" = 0 ]; then
    echo "eBPF column not run: $(grep -m1 error "$TMP/agent.log" || echo 'agent did not attach')"
    AGENT_PID=""
fi

# run_one MODE THREADS -> JSON line. Uprobes are set on a file (an inode) for every process
# that maps it, so the plain and preload runs use a private copy of the library (another
# inode, no probes): the same code, untraced by the agent.
cp "$SIM/libcuda.so.1" "$TMP/libcuda.so.1"
run_one() {
    local mode=$1 threads=$2 out
    case $mode in
        plain) out=$(env LD_LIBRARY_PATH="$TMP" VRAMHOOK_SIM_FAST=1 "$BENCH" --threads "$threads" --iters "$ITERS") ;;
        preload)
            rm -rf "$TMP/rings"
            out=$(env LD_LIBRARY_PATH="$TMP" VRAMHOOK_SIM_FAST=1 VRAMHOOK_DIR="$TMP/rings" VRAMHOOK_RING_SLOTS=2097152 \
                LD_PRELOAD="$LIB" "$BENCH" --threads "$threads" --iters "$ITERS") ;;
        ebpf) out=$(env VRAMHOOK_SIM_FAST=1 "$BENCH" --threads "$threads" --iters "$ITERS") ;;
    esac
    echo "$out" | grep '^{' | sed "s/^{/{\"mode\":\"$mode\",/"
}

printf '%-8s %-6s %10s %10s %10s %12s %12s %10s %10s\n' threads call plain preload ebpf preload_added ebpf_added preload_x ebpf_x
for t in $THREADS; do
    rows=()
    for _ in $(seq "$REPEAT"); do
        rows+=("$(run_one plain "$t")" "$(run_one preload "$t")")
        [ "$ebpf_ok" = 1 ] && rows+=("$(run_one ebpf "$t")")
    done
    printf '%s\n' "${rows[@]}" > "$TMP/rows.jsonl"
    python3 - "$t" "$TMP/rows.jsonl" <<'PY'
import json, statistics, sys
t, rows = sys.argv[1], [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
by = {m: [r for r in rows if r["mode"] == m] for m in ("plain", "preload", "ebpf")}
for call in ("alloc", "free"):
    med = {m: (statistics.median(r[f"{call}_median_ns"] for r in v) if v else None) for m, v in by.items()}
    p, l, e = med["plain"], med["preload"], med["ebpf"]
    f = lambda x: "-" if x is None else f"{x:.0f}"
    r = lambda x: "-" if x is None else f"{x / p:.1f}"
    print(f"{t:<8} {call:<6} {f(p):>10} {f(l):>10} {f(e):>10} {f(l - p):>12} {f(None if e is None else e - p):>12} {r(l):>10} {r(e):>10}")
if any(r.get("errors") for r in rows):
    print("warning: calls returned errors", file=sys.stderr)
PY
done
echo "(ns per call: median over all threads' calls, then the median over $REPEAT alternating runs; VRAMHOOK_SIM_FAST=1; $ITERS iterations per thread)"
if [ -n "$AGENT_PID" ]; then
    kill -TERM "$AGENT_PID"; wait "$AGENT_PID" 2>/dev/null || true; AGENT_PID=""
    grep -E "eBPF" "$TMP/agent.log" | grep -v "attached at" | tail -3
fi
