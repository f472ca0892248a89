#!/usr/bin/env bash
# Where the 70 MiB that PyTorch's backend:cudaMallocAsync mode used beyond its pool's reserve
# on the H200 come from (issue #10; docs/measurements/gpu/h200-pools.txt): with nothing traced, the bare
# driver-API probe (overhead_probe.c: malloc, default pool, default pool with PyTorch's
# release threshold, a created pool, malloc then the default pool, 64 streams) and PyTorch in its
# three modes, each sampled step by step (pools_probe.py with POOLS_PROBE_STEPS=1).
#   bash scripts/gpu/pools/overhead.sh OUTDIR        (needs gcc, libcuda; PyTorch for its part)
# Writes OUTDIR/overhead.jsonl (every step) and OUTDIR/overhead-report.txt (the summary:
# per step, the device bytes used since the first step and those outside every pool reserve).
set -u
OUT="${1:-${OUT:-/tmp/vramhook-overhead}}"
mkdir -p "$OUT"
S=scripts/gpu/pools
# shellcheck source=scripts/gpu/common.sh
source scripts/gpu/common.sh
gcc -O2 -Wall -o "$OUT/overhead_probe" $S/overhead_probe.c -ldl || { echo "FAIL overhead_probe.c does not build"; exit 1; }
: > "$OUT/overhead.jsonl"
for scenario in malloc async async-threshold pool malloc-then-async streams priority-streams; do
    "$OUT/overhead_probe" $scenario >> "$OUT/overhead.jsonl" 2>> "$OUT/overhead.err" \
        || echo "FAIL overhead_probe $scenario: exit $?" | tee -a "$OUT/overhead.err"
done
for mode in default expandable async; do
    PYTORCH_CUDA_ALLOC_CONF="$(torch_alloc_conf $mode)" POOLS_PROBE_STEPS=1 timeout 120 python3 $S/pools_probe.py $mode 0 \
        >> "$OUT/overhead.jsonl" 2>> "$OUT/overhead.err" || echo "FAIL pools_probe $mode: exit $?" | tee -a "$OUT/overhead.err"
done
python3 $S/overhead_summary.py "$OUT/overhead.jsonl" | tee "$OUT/overhead-report.txt"
