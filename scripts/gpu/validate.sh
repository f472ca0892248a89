#!/usr/bin/env bash
# Real-GPU validation of the interposer (issue 2). Runs on the GPU machine from the repo
# root, with the release build copied into .gpu/ (scripts/gpu/prepare.sh does that):
#   bash scripts/gpu/validate.sh [OUTDIR]
# Traces nvcc programs (static and shared cudart, plus direct driver VMM calls) and
# PyTorch in its three allocator modes, checks the captures against what the programs
# report (scripts/gpu/check.py), measures hooked versus plain cost of the cheapest real
# calls, and saves a PyTorch memory snapshot for the analyzer's fixture.
set -u
OUT="${1:-${OUT:-/tmp/vramhook-gpu}}"
R=/tmp/vramhook-gpu-raw
rm -rf "$R"; mkdir -p "$OUT" "$R"
BIN="$PWD/.gpu/vramhook"
export VRAMHOOK_LIB="$PWD/.gpu/libvramhook.so"
export PYTHONUNBUFFERED=1
[ -x "$BIN" ] && [ -f "$VRAMHOOK_LIB" ] || { echo "MISSING .gpu/vramhook or .gpu/libvramhook.so: run scripts/gpu/prepare.sh here first" >&2; exit 1; }

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nvcc --version | tail -2;
  python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'; uname -r; ldd --version | head -1; } > "$R/env.txt" 2>&1
cat "$R/env.txt"

nvcc -O2 -o /tmp/probe_static scripts/gpu/alloc_probe.cu -lcuda
nvcc -O2 -cudart shared -o /tmp/probe_shared scripts/gpu/alloc_probe.cu -lcuda
nvcc -O2 -o /tmp/bench_real scripts/gpu/bench_real.cu
for v in static shared; do
    "$BIN" run --record "$R/probe_$v.vhc" --summary-json "$R/probe_$v.summary.json" -- /tmp/probe_$v > "$R/probe_$v.out" 2> "$R/probe_$v.err"
    echo "probe $v exit $?"; cat "$R/probe_$v.err"
    "$BIN" dump "$R/probe_$v.vhc" > "$R/probe_$v.jsonl"
done

# shellcheck source=scripts/gpu/common.sh
source scripts/gpu/common.sh
for mode in default expandable async; do
    conf=$(torch_alloc_conf $mode)
    snap=""
    [ "$mode" = default ] && snap="$OUT/torch_snapshot_h200.pickle"
    PYTORCH_CUDA_ALLOC_CONF="$conf" "$BIN" run --record "$R/torch_$mode.vhc" --summary-json "$R/torch_$mode.summary.json" \
        -- python3 scripts/gpu/torch_modes.py "$mode" $snap > "$R/torch_$mode.out" 2> "$R/torch_$mode.err"
    echo "torch $mode exit $?"; tail -12 "$R/torch_$mode.err"
    "$BIN" dump "$R/torch_$mode.vhc" > "$R/torch_$mode.jsonl"
done
grep -h '"phase"' "$R/torch_default.out" > "$OUT/torch_snapshot_h200.txt"

# Hooked versus plain, alternating, three rounds each, in one run.
rm -f "$R/bench.jsonl"
for round in 1 2 3; do
    /tmp/bench_real 2000 | sed 's/^{/{"hooked":false,/' >> "$R/bench.jsonl"
    rm -rf /tmp/vh-bench
    VRAMHOOK_DIR=/tmp/vh-bench VRAMHOOK_RING_SLOTS=1048576 LD_PRELOAD="$VRAMHOOK_LIB" /tmp/bench_real 2000 \
        | sed 's/^{/{"hooked":true,/' >> "$R/bench.jsonl"
done
cat "$R/bench.jsonl"

python3 scripts/gpu/check.py "$R" | tee "$OUT/results.txt"
status=${PIPESTATUS[0]}
cp "$R/results.json" "$OUT/results.json" 2>/dev/null
tar -C "$(dirname "$R")" -czf "$OUT/raw.tar.gz" "$(basename "$R")"
exit $status
