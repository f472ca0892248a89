#!/usr/bin/env bash
# Issue #29 on the GPU machine: each framework's OOM seen when it is raised, the lens's
# record in time with PyTorch's memory history on, PyTorch's async pool reserve live, a
# filled small pool, a memory fraction.
#   bash scripts/gpu/raise/run.sh OUTDIR   (release build in .gpu/: scripts/gpu/prepare.sh)
# Writes OUTDIR/raise-report.txt (PASS/FAIL per check) and every run's files.
set -u
# shellcheck source=scripts/gpu/common.sh
source scripts/gpu/common.sh
gpu_run_start raise "${1:-}" --lens
S=scripts/gpu/raise
traced() { # name -- command...   (PYTORCH_CUDA_ALLOC_CONF etc. from the caller)
    local name=$1; shift 2
    local t0=$SECONDS
    timeout 300 "$BIN" run --record "$OUT/$name.vhc" -- sh -c 'exec "$@" > "$0.out" 2> "$0.log"' "$OUT/$name" "$@"
    echo "$name: exit $? in $((SECONDS - t0)) s"
    "$BIN" analyze --json "$OUT/$name.vhc" > "$OUT/$name.report.json" 2> "$OUT/$name.analyze.err"
    "$BIN" analyze "$OUT/$name.vhc" > "$OUT/$name.report.txt" 2>&1
}
traced jax_frag -- python3 $S/programs.py jax_frag
traced cupy_recover -- python3 $S/programs.py cupy_recover
traced cupy_fatal -- python3 $S/programs.py cupy_fatal
traced torch_smallpool -- python3 $S/programs.py torch_smallpool
traced torch_fraction -- python3 $S/programs.py torch_fraction
"$BIN" analyze --json "$OUT/torch_fraction.log" > "$OUT/torch_fraction.log.json" 2> "$OUT/torch_fraction.log.err"
# The memory history on (the lens starts it): the lens's record against the driver's failure.
VRAMHOOK_LENS_STACKS=1 VRAMHOOK_LENS_STACKS_DIR="$OUT" traced torch_history -- python3 scripts/gpu/oom/torch_oom.py fragmented "$OUT"
"$BIN" dump "$OUT/torch_history.vhc" > "$OUT/torch_history.dump.jsonl" 2> "$OUT/torch_history.dump.err"
# The async backend's reserve, live: the agent's held bytes against memory_reserved().
rm -rf "$OUT/rings-async"
"$BIN" agent --ring-dir "$OUT/rings-async" --listen 127.0.0.1:9465 > "$OUT/async.agent.out" 2> "$OUT/async.agent.err" &
agent=$!
sleep 1
PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync PYTHONPATH="$VRAMHOOK_LENS_DIR" LD_PRELOAD="$VRAMHOOK_LIB" \
    VRAMHOOK_DIR="$OUT/rings-async" python3 $S/programs.py torch_async > "$OUT/torch_async.out" 2> "$OUT/torch_async.log" &
prog=$!
for _ in $(seq 60); do grep -q '"burst"' "$OUT/torch_async.out" 2>/dev/null && break; sleep 0.1; done
sleep 1.5
agent_state 9465 > "$OUT/torch_async.state.json"
wait $prog; kill -TERM $agent; wait $agent
python3 $S/check.py "$OUT" | tee "$OUT/raise-report.txt"
