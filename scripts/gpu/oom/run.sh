#!/usr/bin/env bash
# Real OOMs on the GPU machine for the framework-verdict (#10) and log-parser (#16)
# fixtures: PyTorch in its three allocator modes (fragmented cache, true capacity,
# another process holding the GPU) and JAX's BFC allocator, each run traced by
# `vramhook run` with the program's own stderr kept verbatim as the log.
#   bash scripts/gpu/oom/run.sh OUTDIR     (release build in .gpu/: scripts/gpu/prepare.sh)
set -u
OUT="${1:-${OUT:-/tmp/vramhook-oom}}"
mkdir -p "$OUT"
# shellcheck source=scripts/gpu/common.sh
source scripts/gpu/common.sh
use_gpu_build
S=scripts/gpu/oom
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, jax; print("torch", torch.__version__, "jax", jax.__version__)' 2>/dev/null; } > "$OUT/env.txt"
cat "$OUT/env.txt"

traced() { # name conf -- command...
    local name=$1 conf=$2; shift 3
    local t0=$SECONDS
    PYTORCH_CUDA_ALLOC_CONF="$conf" timeout 300 "$BIN" run --record "$OUT/$name.vhc" --summary-json "$OUT/$name.summary.json" \
        -- sh -c 'exec "$@" > "$0.out" 2> "$0.log"' "$OUT/$name" "$@"
    echo "$name: exit $? in $((SECONDS - t0)) s"; tail -3 "$OUT/$name.log"
}

for mode in default expandable async; do
    conf=$(torch_alloc_conf $mode)
    traced "torch_${mode}_fragmented" "$conf" -- python3 $S/torch_oom.py fragmented "$OUT"
    traced "torch_${mode}_capacity" "$conf" -- python3 $S/torch_oom.py capacity "$OUT"
done
# Another process holds the GPU; the victim, in default mode, runs out.
rm -f "$OUT/holding" "$OUT/release"
python3 $S/torch_oom.py holder "$OUT" > "$OUT/holder.out" 2> "$OUT/holder.log" &
holder=$!
for _ in $(seq 600); do [ -e "$OUT/holding" ] && break; sleep 0.1; done
nvidia-smi --query-compute-apps=pid,used_memory --format=csv > "$OUT/other_process.nvidia-smi.txt" 2>&1
traced torch_default_other_process "" -- python3 $S/torch_oom.py victim "$OUT"
touch "$OUT/release"; wait $holder
traced jax_bfc_fragmented "" -- python3 $S/jax_oom.py
# The capture files are big only when a run is; keep what a fixture needs.
ls -la "$OUT"
