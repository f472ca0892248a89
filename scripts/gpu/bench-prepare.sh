#!/usr/bin/env bash
# On the development machine: what `scripts/gpu/bench.sh OUT calls sim` needs on the GPU
# machine, in .gpu-bench/ (ignored by git): the release libvramhook.so, stripped, and
# the simulated driver's build (tests/simcuda/build, also ignored). Copy both folders to the
# GPU machine beside the working tree (both are git-ignored), then run there:
#   VRAMHOOK_LIB=.gpu-bench/libvramhook.so bash scripts/gpu/bench.sh "$OUT" calls sim
# VRAMHOOK_GPU_OUT names another folder than .gpu-bench (scripts/test.sh runs this twice
# from an empty one).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${VRAMHOOK_GPU_OUT:-.gpu-bench}
cargo build --release -p vramhook-interposer
make -s -C tests/simcuda -j2 all
mkdir -p "$out"
cp target/release/libvramhook.so "$out"/
strip --strip-debug "$out"/libvramhook.so
ls -la "$out" tests/simcuda/build
