#!/usr/bin/env bash
# On the development machine: build the release binaries and copy what the GPU machine
# needs into .gpu/ (ignored by git; name it in the device tool's `carry`).
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p vramhook -p vramhook-interposer
mkdir -p .gpu
cp target/release/vramhook target/release/libvramhook.so .gpu/
ls -la .gpu
