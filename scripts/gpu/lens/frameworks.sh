#!/usr/bin/env bash
# The CuPy and JAX lenses on the GPU machine (issue #10 item 8): real CuPy and JAX, traced
# by `vramhook run` (which loads the lenses), a fragmented cache and an OOM each, then the
# cost of one lens sample.
#   bash scripts/gpu/lens/frameworks.sh OUTDIR     (release build in .gpu/: scripts/gpu/prepare.sh)
# Writes OUTDIR/frameworks-report.txt (PASS/FAIL lines) and the runs' files.
set -u
# shellcheck source=scripts/gpu/common.sh
source scripts/gpu/common.sh
gpu_run_start frameworks "${1:-}" --lens
export VRAMHOOK_LENS_INTERVAL_S=0.5
S=scripts/gpu/lens
gpu_versions cupy jax > "$OUT/fw-env.txt" 2>&1
cat "$OUT/fw-env.txt"
export XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_MEM_FRACTION=1.0
for fw in cupy jax; do
    t0=$SECONDS
    timeout 300 "$BIN" run --record "$OUT/fw_$fw.vhc" \
        -- sh -c 'exec "$@" > "$0.out" 2> "$0.log"' "$OUT/fw_$fw" python3 $S/fw_oom.py $fw "$OUT"
    echo "fw_$fw: exit $? in $((SECONDS - t0)) s"
    "$BIN" analyze --json "$OUT/fw_$fw.vhc" > "$OUT/fw_$fw.report.json" 2> "$OUT/fw_$fw.analyze.err"
    "$BIN" analyze "$OUT/fw_$fw.vhc" > "$OUT/fw_$fw.report.txt" 2>&1
    # The cost of one sample, with the ring there (LD_PRELOAD), over a cache of 2,000 buffers.
    LD_PRELOAD="$VRAMHOOK_LIB" VRAMHOOK_DIR="$OUT/rings-bench" timeout 300 \
        python3 $S/fw_oom.py bench $fw > "$OUT/fw_bench_$fw.json" 2> "$OUT/fw_bench_$fw.err"
done
rm -rf "$OUT/rings-bench"
python3 $S/fw_check.py "$OUT" "$BIN" | tee "$OUT/frameworks-report.txt"
