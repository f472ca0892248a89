#!/usr/bin/env bash
# Stream-ordered pools on the GPU machine (issue #10, item 7): one PyTorch program
# (pools_probe.py) in each allocator mode under `vramhook run --record`; at one point it reads
# memory_reserved() and NVML's per-process used bytes; pools_check.py compares them with
# vramhook's bytes for the process there. The checker's self-test runs first.
#   bash scripts/gpu/pools/run.sh OUTDIR      (release build in .gpu/: scripts/gpu/prepare.sh)
# Writes OUTDIR/pools-report.txt (PASS/FAIL lines with the numbers) and each mode's files.
set -u
# shellcheck source=scripts/gpu/common.sh
source scripts/gpu/common.sh
gpu_run_start pools "${1:-}" --lens
# Samples at most every 200 ms; the program waits 1.5 s before its point, so its
# torch.cuda.mem_get_info() there always samples the device and the pools.
export VRAMHOOK_MEMINFO_MS=200
S=scripts/gpu/pools
{ gpu_versions torch
  python3 -c 'import pynvml; print("pynvml", pynvml.__file__)' 2>/dev/null || echo "no pynvml: NVML through ctypes"; } \
    > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
python3 $S/pools_check_selftest.py | tee "$OUT/pools-report.txt"
for mode in default expandable async; do
    conf=$(torch_alloc_conf $mode)
    t0=$SECONDS
    PYTORCH_CUDA_ALLOC_CONF="$conf" timeout 300 "$BIN" run --record "$OUT/$mode.vhc" \
        --summary-json "$OUT/$mode.summary.json" \
        -- sh -c 'exec "$@" > "$0.out" 2> "$0.log"' "$OUT/$mode" python3 $S/pools_probe.py $mode \
        2> "$OUT/$mode.run.txt"
    echo "$mode: exit $? in $((SECONDS - t0)) s" | tee -a "$OUT/pools-report.txt"
    "$BIN" dump "$OUT/$mode.vhc" | grep '"kind":"pool_sample"' > "$OUT/$mode.pool_samples.jsonl"
    "$BIN" analyze --json "$OUT/$mode.vhc" > "$OUT/$mode.report.json" 2> "$OUT/$mode.analyze.err"
done
python3 $S/pools_check.py "$OUT" | tee -a "$OUT/pools-report.txt"
