#!/usr/bin/env bash
# All benchmarks, each measured side by side in one run (never as timed tests):
#   1. interposer: hooked versus plain cost per driver call, 1 and 16 threads (simulated driver)
#   2. model: events/s, bytes per live allocation, largest_free_span cost, versus a brute-force model
#   3. analyzer: end-to-end replay versus a raw read of the same capture
#   4. agent: ingestion rate, CPU at a steady event rate, memory with many processes
#   5. drain: `vramhook run` versus the agent draining the same 64 x 16-thread load
#      (scripts/bench-drain.sh: interleaved rounds, kept % of each and their ratio)
#   6. ebpf: per-call cost of no tracing, LD_PRELOAD and eBPF uprobes, side by side
#      (scripts/bench-ebpf.sh; the eBPF column needs root or CAP_BPF + CAP_PERFMON)
# Usage: scripts/bench.sh [interposer|model|analyzer|agent|drain|ebpf]...   (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."
which=("$@")
((${#which[@]})) || which=(interposer model analyzer agent drain ebpf)
cargo build --release --workspace --examples >/dev/null
for part in "${which[@]}"; do
    echo "=================== $part"
    case "$part" in
        interposer) VRAMHOOK_LIB=target/release/libvramhook.so bash scripts/bench-calls.sh ;;
        model) target/release/examples/bench_model ;;
        analyzer) target/release/examples/bench_replay ;;
        agent) target/release/examples/bench_agent ;;
        drain) bash scripts/bench-drain.sh ;;
        ebpf) bash scripts/bench-ebpf.sh ;;
        *) echo "unknown part $part" >&2; exit 2 ;;
    esac
done
