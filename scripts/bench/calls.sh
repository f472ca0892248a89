#!/usr/bin/env bash
# Hook cost per driver call, on the simulated driver (no GPU needed).
# Builds tests/simcuda, then for 1 and 16 threads runs bench_calls plain and with
# LD_PRELOAD=$VRAMHOOK_LIB (default target/release/libvramhook.so) in interleaved rounds,
# pinned with taskset, and prints side by side the p50, p99 and p99.9 of plain and hooked
# calls; "added" is hooked - plain at the same percentile (each percentile the median over
# the rounds), with the spread of the p50 added over the rounds, and the page faults the
# timed loops took (getrusage, summed over rounds). Then the instructions the hook adds per
# call (callgrind, exact) split into what they are for (scripts/bench/calls_split.py).
# Env: VRAMHOOK_LIB, BENCH_ITERS (default 20000), BENCH_THREADS (default "1 16"),
# BENCH_ROUNDS (default 10; BENCH_REPEAT is the older name), BENCH_CPU (the CPU a 1-thread
# run is pinned to, default the last one; more threads are pinned to all CPUs),
# BENCH_RING_DIR (default a fresh directory in /dev/shm, where rings live by default),
# BENCH_JSONL (a file to append every run's JSON line to).
set -euo pipefail
BENCH_NAME=bench-calls
# shellcheck source=scripts/bench/sim-env.sh
source "$(dirname "${BASH_SOURCE[0]}")/sim-env.sh"
ROUNDS="${BENCH_ROUNDS:-${BENCH_REPEAT:-10}}"
TMP="$(mktemp -d /tmp/bench-calls.XXXXXX)"
if [ -n "${BENCH_RING_DIR:-}" ]; then
    RINGS="$BENCH_RING_DIR/bench-calls.$$"
elif [ -d /dev/shm ] && [ -w /dev/shm ]; then
    RINGS="$(mktemp -d /dev/shm/vramhook-bench.XXXXXX)"
else
    RINGS="$TMP/rings"
fi
trap 'rm -rf "$TMP" "$RINGS"' EXIT

# run_one THREADS [preload] -> the run's JSON line on stdout
run_one() {
    local threads=$1 preload=${2:-} pin out
    if [ "$threads" = 1 ]; then pin="$CPU"; else pin="0-$((NCPU - 1))"; fi
    if [ -n "$preload" ]; then
        # A private ring big enough for every event: this measures the recording path,
        # not the (cheaper) path that drops events when a ring is full.
        rm -rf "$RINGS"
        out=$(env VRAMHOOK_SIM_FAST=1 VRAMHOOK_DIR="$RINGS" VRAMHOOK_RING_SLOTS=2097152 \
              LD_PRELOAD="$preload" taskset -c "$pin" "$BENCH" --threads "$threads" --iters "$ITERS")
    else
        out=$(env VRAMHOOK_SIM_FAST=1 taskset -c "$pin" "$BENCH" --threads "$threads" --iters "$ITERS")
    fi
    local line
    line=$(echo "$out" | grep '^{' | sed "s/^{/{\"hooked\":$([ -n "$preload" ] && echo true || echo false),/")
    [ -z "${BENCH_JSONL:-}" ] || echo "$line" >> "$BENCH_JSONL"
    echo "$line"
}

for t in $THREADS; do
    runs=()
    for _ in $(seq "$ROUNDS"); do
        runs+=("$(run_one "$t")" "$(run_one "$t" "$LIB")")
    done
    printf '%s\n' "${runs[@]}" > "$TMP/runs.$t"
done

python3 - "$TMP" "$ROUNDS" $THREADS <<'PY'
import json, statistics, sys
tmp, rounds, threads = sys.argv[1], sys.argv[2], sys.argv[3:]
med = statistics.median
print(f"{'threads':>7} {'call':5} | {'plain p50':>9} {'p99':>6} {'p99.9':>6} | {'hooked p50':>10} {'p99':>6} {'p99.9':>6} |"
      f" {'added p50':>9} {'p99':>6} {'p99.9':>6} {'p50 spread':>11} | faults in timed loops (minor/major)")
added_p50 = {}
for t in threads:
    rows = [json.loads(l) for l in open(f"{tmp}/runs.{t}")]
    plain = [r for r in rows if not r["hooked"]]
    hooked = [r for r in rows if r["hooked"]]
    for call in ("alloc", "free"):
        p = {q: med(r[f"{call}_{q}_ns"] for r in plain) for q in ("p50", "p99", "p999")}
        h = {q: med(r[f"{call}_{q}_ns"] for r in hooked) for q in ("p50", "p99", "p999")}
        spread = [b[f"{call}_p50_ns"] - a[f"{call}_p50_ns"] for a, b in zip(plain, hooked)]
        added_p50[(t, call)] = h["p50"] - p["p50"]
        faults = (f"plain {sum(r['minflt'] for r in plain)}/{sum(r['majflt'] for r in plain)}, "
                  f"hooked {sum(r['minflt'] for r in hooked)}/{sum(r['majflt'] for r in hooked)}")
        print(f"{t:>7} {call:5} | {p['p50']:>9.0f} {p['p99']:>6.0f} {p['p999']:>6.0f} | {h['p50']:>10.0f} {h['p99']:>6.0f}"
              f" {h['p999']:>6.0f} | {h['p50'] - p['p50']:>+9.0f} {h['p99'] - p['p99']:>+6.0f} {h['p999'] - p['p999']:>+6.0f}"
              f" {min(spread):>+5}..{max(spread):<+5} | {faults}")
    if any(r.get("errors") for r in rows):
        print("warning: calls returned errors", file=sys.stderr)
if "1" in threads:
    for t in threads:
        if t != "1":
            for call in ("alloc", "free"):
                one = added_p50[("1", call)]
                ratio = added_p50[(t, call)] / one if one > 0 else float("nan")
                print(f"added p50 at {t} threads / at 1 thread, {call}: {ratio:.2f}")
PY
echo "(ns per call, clock_gettime around each; each percentile over all threads' calls of a run, then the median over $ROUNDS interleaved plain/hooked rounds; VRAMHOOK_SIM_FAST=1; $ITERS iterations per thread after 64 untimed; 1 thread pinned to CPU $CPU, more to CPUs 0-$((NCPU - 1)); rings in $(dirname "$RINGS"))"

# Instructions are counted exactly (callgrind), whatever else the machine is doing: the
# added instructions per call are the stable measure of the hook's cost.
if command -v valgrind >/dev/null; then
    count() {
        rm -rf "$RINGS"
        env VRAMHOOK_SIM_FAST=1 VRAMHOOK_DIR="$RINGS" VRAMHOOK_RING_SLOTS=2097152 ${2:+LD_PRELOAD="$2"} \
            valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file="$TMP/cg.$1" \
            "$BENCH" --threads 1 --iters 20000 >/dev/null 2>&1
    }
    count plain
    count hooked "$LIB"
    # 64 warm-up pairs and 20000 timed pairs: 40128 calls.
    python3 "$ROOT/scripts/bench/calls_split.py" "$TMP/cg.hooked" "$TMP/cg.plain" "$LIB" 40128
else
    echo "(valgrind not installed: instruction counts skipped)"
fi
