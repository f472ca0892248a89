#!/usr/bin/env bash
# On the development machine: build the release binaries and copy what the GPU machine
# needs into .gpu/ (ignored by git; name it in the device tool's `carry`).
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p vramhook -p vramhook-interposer
# Separately: target flags such as --example apply to every -p package.
cargo build --release -p vramhook-model --example bench_model
cargo build --release -p vramhook-analyzer --example bench_replay
cargo build --release -p vramhook-agent --example bench_agent
mkdir -p .gpu
cp target/release/vramhook target/release/libvramhook.so .gpu/
# Debug info off the copies: the device tool carries at most 64 MiB.
strip --strip-debug .gpu/vramhook .gpu/libvramhook.so
cp target/release/examples/{bench_model,bench_replay,bench_agent} .gpu/
ls -la .gpu
