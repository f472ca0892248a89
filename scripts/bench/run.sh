#!/usr/bin/env bash
# All benchmarks, each measured side by side in one run (never as timed tests):
#   1. interposer: hooked versus plain cost per driver call, 1 and 16 threads (simulated driver)
#   2. model: events/s, bytes per live allocation, largest_free_span cost, versus a brute-force model
#   3. analyzer: end-to-end replay versus a raw read of the same capture
#   4. agent: ingestion rate, CPU at a steady event rate, memory with many processes
#   5. drain: `vramhook run` versus the agent draining the same 64 x 16-thread load
#      (scripts/bench/drain.sh: interleaved rounds, kept % of each and their ratio)
#   6. ebpf: per-call cost of no tracing, LD_PRELOAD and eBPF uprobes, side by side
#      (scripts/bench/ebpf.sh; the eBPF column needs root or CAP_BPF + CAP_PERFMON)
# Usage: scripts/bench/run.sh [interposer|model|analyzer|agent|drain|ebpf]...   (default: all)
# BENCH_BASELINE_DIR=/path/to/an/older/checkout (say `git worktree add ../base REV`): the
# model and analyzer parts then run that checkout's benchmark and this one's side by side,
# BENCH_ROUNDS (5) interleaved rounds, and print medians and their ratio
# (scripts/bench/ab.sh). The baseline is built in its own target directory; a checkout
# from before benches/ (examples/bench_model, examples/bench_replay) works too.
set -euo pipefail
cd "$(dirname "$0")/../.."
which=("$@")
((${#which[@]})) || which=(interposer model analyzer agent drain ebpf)
# The interposer, drain and ebpf parts run the release binaries; the others build only their
# bench (below).
case " ${which[*]} " in
    *" interposer "* | *" drain "* | *" ebpf "*) cargo build --release --workspace >/dev/null ;;
esac
# The benchmarks live in each crate's benches/ (plain binaries, `harness = false`); cargo
# builds them under target/release/deps with a hash in the name: ask it for the path.
bench_bin() {
    cargo bench -p "$1" --bench "$2" --no-run 2>&1 | sed -n 's/^ *Executable .*(\(.*\))$/\1/p' | tail -n 1
}
# The baseline checkout's bench binary: crate $1, bench $2, or the example $3 of a checkout
# from before benches/.
baseline_bin() {
    local dir=$BENCH_BASELINE_DIR
    if [ -f "$dir/${1#vramhook-}/benches/$2.rs" ]; then
        (cd "$dir" && echo "$PWD/$(bench_bin "$1" "$2")")
    else
        (cd "$dir" && cargo build --release -p "$1" --example "$3" >/dev/null && echo "$PWD/target/release/examples/$3")
    fi
}
# Part $1 alone, or side by side with the baseline's: crate $2, bench $3, old example $4.
this_or_both() {
    if [ -n "${BENCH_BASELINE_DIR:-}" ]; then
        bash scripts/bench/ab.sh "$1" "$(bench_bin "$2" "$3")" "$(baseline_bin "$2" "$3" "$4")"
    else
        "$(bench_bin "$2" "$3")"
    fi
}
for part in "${which[@]}"; do
    echo "=================== $part"
    case "$part" in
        interposer) VRAMHOOK_LIB=target/release/libvramhook.so bash scripts/bench/calls.sh ;;
        model) this_or_both model vramhook-model model bench_model ;;
        analyzer) this_or_both analyzer vramhook-analyzer replay bench_replay ;;
        agent) "$(bench_bin vramhook-agent agent)" ;;
        drain) bash scripts/bench/drain.sh ;;
        ebpf) bash scripts/bench/ebpf.sh ;;
        *) echo "unknown part $part" >&2; exit 2 ;;
    esac
done
