#!/usr/bin/env bash
# Benchmarks on the GPU machine (16 real cores; run after scripts/gpu/prepare.sh here):
#   bash scripts/gpu/bench.sh [OUTDIR]
# - hooked vs plain cost of the cheapest real calls on the H200, 10 interleaved rounds
# - the model's replay benchmark
# - VRAMHOOK_DEBUG=1 on real programs, naming any entry point that could not be wrapped
set -u
OUT="${1:-${OUT:-/tmp/vramhook-bench}}"
mkdir -p "$OUT"
export VRAMHOOK_LIB="$PWD/.gpu/libvramhook.so"
{
echo "== real H200: cheapest calls, 10 interleaved rounds of 2000, both pinned to CPU 3"
nvcc -O2 -o /tmp/bench_real scripts/gpu/bench_real.cu
nvcc -O2 -o /tmp/probe_shared -cudart shared scripts/gpu/alloc_probe.cu -lcuda
for round in 1 2 3 4 5 6 7 8 9 10; do
    taskset -c 3 /tmp/bench_real 2000 | sed 's/^{/{"hooked":false,/'
    rm -rf /tmp/vh-bench
    VRAMHOOK_DIR=/tmp/vh-bench VRAMHOOK_RING_SLOTS=1048576 LD_PRELOAD="$VRAMHOOK_LIB" taskset -c 3 /tmp/bench_real 2000 | sed 's/^{/{"hooked":true,/'
done | tee "$OUT/bench_real.jsonl"
python3 - "$OUT/bench_real.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for k in ("cudaMallocAsync_1MiB_ns", "cudaFreeAsync_ns", "cudaMalloc_512B_ns", "cudaFree_512B_ns"):
    p = statistics.median(r[k] for r in rows if not r["hooked"])
    h = statistics.median(r[k] for r in rows if r["hooked"])
    print(f"{k:26} plain {p:8.0f}  hooked {h:8.0f}  added {h - p:6.0f} ns  ratio {h / p:5.2f}")
PY
echo "== model benchmark (one core)"
.gpu/bench_model
echo "== analyzer replay benchmark (one core): raw read vs end to end"
.gpu/bench_replay --dir /tmp
echo "== agent benchmark"
.gpu/bench_agent
echo "== entry points that could not be wrapped (hook_miss events in the captures)"
.gpu/vramhook run --record /tmp/miss1.vhc -- /tmp/probe_shared > /dev/null
.gpu/vramhook dump /tmp/miss1.vhc | grep hook_miss
.gpu/vramhook run --record /tmp/miss2.vhc -- python3 -c 'import torch; torch.empty(1, device="cuda")'
.gpu/vramhook dump /tmp/miss2.vhc | grep hook_miss
} 2>&1 | tee "$OUT/bench.txt"
