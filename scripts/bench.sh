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
cargo build --release --workspace >/dev/null
# The benchmarks live in each crate's benches/ (plain binaries, `harness = false`); cargo
# builds them under target/release/deps with a hash in the name: ask it for the path.
bench_bin() {
    cargo bench -p "$1" --bench "$2" --no-run 2>&1 | sed -n 's/^ *Executable .*(\(.*\))$/\1/p' | tail -n 1
}
for part in "${which[@]}"; do
    echo "=================== $part"
    case "$part" in
        interposer) VRAMHOOK_LIB=target/release/libvramhook.so bash scripts/bench-calls.sh ;;
        model) "$(bench_bin vramhook-model model)" ;;
        analyzer) "$(bench_bin vramhook-analyzer replay)" ;;
        agent) "$(bench_bin vramhook-agent agent)" ;;
        drain) bash scripts/bench-drain.sh ;;
        ebpf) bash scripts/bench-ebpf.sh ;;
        *) echo "unknown part $part" >&2; exit 2 ;;
    esac
done
