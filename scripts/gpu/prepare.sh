#!/usr/bin/env bash
# On the development machine: build the release binaries and copy what the GPU machine
# needs into .gpu/ (ignored by git; name it in the device tool's `carry`).
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p vramhook -p vramhook-interposer
# Separately: target flags such as --example apply to every -p package.
cargo build --release -p vramhook-model --example bench_model
mkdir -p .gpu
cp target/release/vramhook target/release/libvramhook.so target/release/examples/bench_model .gpu/
ls -la .gpu
