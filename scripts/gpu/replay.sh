#!/usr/bin/env bash
# Replay speed on the GPU machine (run scripts/gpu/prepare.sh here first):
#   bash scripts/gpu/replay.sh [OUTDIR]
# - the analyzer's replay benchmark (20 M events, 1.28 GB, 5 interleaved rounds) pinned to
#   one core, as `scripts/bench/run.sh analyzer` runs it on the development machine;
# - the model's own benchmark;
# - `vramhook analyze` (text, JSON, HTML) of a real capture made here, as a smoke test of
#   the mapped reader on this kernel.
set -u
OUT="${1:-${OUT:-/tmp/vramhook-replay}}"
mkdir -p "$OUT"
[ -x .gpu/bench_replay ] || { echo "MISSING .gpu/bench_replay: run scripts/gpu/prepare.sh here first" >&2; exit 1; }
{
echo "== $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo)"
echo "== analyzer replay benchmark, pinned to CPU 3"
taskset -c 3 .gpu/bench_replay --dir /tmp --rounds 5
echo "== model benchmark, pinned to CPU 3"
taskset -c 3 .gpu/bench_model
echo "== analyze a real capture"
nvcc -O2 -o /tmp/probe_shared -cudart shared scripts/gpu/alloc_probe.cu -lcuda
.gpu/vramhook run --record /tmp/replay-probe.vhc -- /tmp/probe_shared > /dev/null
.gpu/vramhook analyze /tmp/replay-probe.vhc | head -30
.gpu/vramhook analyze --json /tmp/replay-probe.vhc > "$OUT/probe-report.json" && echo "json: $(wc -c < "$OUT/probe-report.json") bytes"
.gpu/vramhook analyze --html "$OUT/probe-report.html" /tmp/replay-probe.vhc && echo "html: $(wc -c < "$OUT/probe-report.html") bytes"
} 2>&1 | tee "$OUT/replay.txt"
