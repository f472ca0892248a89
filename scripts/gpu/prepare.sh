#!/usr/bin/env bash
# On the development machine: build the release binaries and copy what the GPU machine
# needs into .gpu/ (ignored by git, so copy it to the GPU machine beside the working tree:
# the GPU machine has no network and builds nothing). VRAMHOOK_GPU_OUT names another folder
# (scripts/test.sh runs this twice from an empty one).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${VRAMHOOK_GPU_OUT:-.gpu}
cargo build --release -p vramhook -p vramhook-interposer
mkdir -p "$out"
cp target/release/vramhook target/release/libvramhook.so "$out"/
# The hook with parts that can be left out (scripts/gpu/bench.sh pair), built aside so the
# library above stays the one users get.
cargo build --release -p vramhook-interposer --features bench-parts --target-dir target/bench-parts
cp target/bench-parts/release/libvramhook.so "$out"/libvramhook-parts.so
# The in-process benchmark (it needs no CUDA headers: it dlopens libcuda.so.1).
make -s -C tests/simcuda build/workloads/bench_pair
cp tests/simcuda/build/workloads/bench_pair "$out"/
# Debug info off the copies: the device tool carries at most 64 MiB.
strip --strip-debug "$out"/vramhook "$out"/libvramhook.so "$out"/libvramhook-parts.so
# The benchmarks (each crate's benches/), under the names the GPU scripts use.
bench_bin() {
    cargo bench -p "$1" --bench "$2" --no-run 2>&1 | sed -n 's/^ *Executable .*(\(.*\))$/\1/p' | tail -n 1
}
cp "$(bench_bin vramhook-model model)" "$out"/bench_model
cp "$(bench_bin vramhook-analyzer replay)" "$out"/bench_replay
cp "$(bench_bin vramhook-agent agent)" "$out"/bench_agent
ls -la "$out"
