#!/usr/bin/env bash
# On the development machine: what `scripts/gpu/bench.sh OUT calls sim` needs on the GPU
# machine, in .gpu-bench/ (ignored by git): the release libvramhook.so, stripped, and
# the simulated driver's build (tests/simcuda/build, also ignored). Copy both folders to the
# GPU machine beside the working tree (both are git-ignored), then run there:
#   VRAMHOOK_LIB=.gpu-bench/libvramhook.so bash scripts/gpu/bench.sh "$OUT" calls sim
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p vramhook-interposer
make -s -C tests/simcuda -j2 all
mkdir -p .gpu-bench
cp target/release/libvramhook.so .gpu-bench/
strip --strip-debug .gpu-bench/libvramhook.so
ls -la .gpu-bench tests/simcuda/build
