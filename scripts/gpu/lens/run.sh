#!/usr/bin/env bash
# The PyTorch lens on the GPU machine (issue #10): real PyTorch, traced by `vramhook run`
# (which loads the lens), in the cases the issue names, then the lens's cost.
#   bash scripts/gpu/lens/run.sh OUTDIR      (release build in .gpu/: scripts/gpu/prepare.sh)
# Writes OUTDIR/lens-report.txt (the checks, PASS/FAIL each) and the runs' files.
set -u
OUT="${1:-${OUT:-/tmp/vramhook-lens}}"
mkdir -p "$OUT"
# shellcheck source=scripts/gpu/common.sh
source scripts/gpu/common.sh
use_gpu_build --lens
S=scripts/gpu
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__)'; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

traced() { # name conf -- command...
    local name=$1 conf=$2; shift 3
    local t0=$SECONDS
    PYTORCH_CUDA_ALLOC_CONF="$conf" timeout 300 "$BIN" run --record "$OUT/$name.vhc" \
        -- sh -c 'exec "$@" > "$0.out" 2> "$0.log"' "$OUT/$name" "$@"
    echo "$name: exit $? in $((SECONDS - t0)) s"
    "$BIN" analyze --json "$OUT/$name.vhc" > "$OUT/$name.report.json" 2> "$OUT/$name.analyze.err"
    "$BIN" analyze "$OUT/$name.vhc" > "$OUT/$name.report.txt" 2>&1
}
traced lens_default_fragmented "" -- python3 $S/oom/torch_oom.py fragmented "$OUT"
traced lens_expandable_fragmented "expandable_segments:True" -- python3 $S/oom/torch_oom.py fragmented "$OUT"
traced lens_default_capacity "" -- python3 $S/oom/torch_oom.py capacity "$OUT"
# The lens's cost: one call of each thing it does, and a loop of >= 10,000 allocations a
# second, LD_PRELOAD alone against LD_PRELOAD with the lens, 12 interleaved rounds.
python3 $S/lens/lens_bench.py calls > "$OUT/lens_calls.json" 2> "$OUT/lens_calls.err"
for round in $(seq 12); do
    for mode in preload lens; do
        if [ $mode = lens ]; then pp="$VRAMHOOK_LENS_DIR"; else pp=""; fi
        PYTHONPATH="$pp" LD_PRELOAD="$VRAMHOOK_LIB" VRAMHOOK_DIR="$OUT/rings-bench" taskset -c 2 \
            python3 $S/lens/lens_bench.py loop "$mode" "$round" >> "$OUT/lens_loop.jsonl" 2>> "$OUT/lens_loop.err"
    done
done
rm -rf "$OUT/rings-bench"
python3 $S/lens/lens_check.py "$OUT" | tee "$OUT/lens-report.txt"
