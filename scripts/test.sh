#!/usr/bin/env bash
# Runs all the tests: formatting and lints, the simulated driver's self-test, and the
# workspace's tests (unit, property, corruption, end to end through the simulated CUDA
# driver, real Jaeger and Prometheus on loopback, headless Chromium). Run
# scripts/setup.sh once first (it installs chromium, tmux and the Go-built backends).
set -euo pipefail
cd "$(dirname "$0")/.."
make -s -C tests/simcuda
cargo fmt --all -- --check
cargo build --workspace --all-targets
cargo clippy --workspace --all-targets -- -D warnings
bash tests/simcuda/selftest.sh
cargo test --workspace --no-fail-fast
