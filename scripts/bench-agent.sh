#!/usr/bin/env bash
# Agent benchmarks: ingest events/s per core, agent CPU at a steady 100k events/s, RSS
# with 64 traced processes. Prints RESULT lines.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p vramhook-agent --example bench_agent
exec target/release/examples/bench_agent
