#!/usr/bin/env bash
# Issue #26 on the GPU machine: "is it me, or is it them?" with real PyTorch processes.
#   bash scripts/gpu/holders/run.sh OUTDIR   (release build in .gpu/: scripts/gpu/prepare.sh)
# A holder keeps 60 GiB in PyTorch's cache (reserved, 0 allocated); an asker wants 100 GiB.
#   lens:    both under LD_PRELOAD with the agent, the lens on PYTHONPATH in both
#   nolens:  the same without the lens
#   run:     the holder untraced, the asker alone under `vramhook run` (NVML names the holder)
# then the driver's reserve (a full device's last failing cudaMalloc). Writes
# OUTDIR/holders-report.txt (PASS/FAIL per check) and every run's files.
set -u
# shellcheck source=scripts/gpu/common.sh
source scripts/gpu/common.sh
gpu_run_start holders "${1:-}" --lens
S=scripts/gpu/holders
gpu_versions torch > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

pair() { # case lens|nolens
    local c=$1 pp=""
    [ "$2" = lens ] && pp="$VRAMHOOK_LENS_DIR"
    rm -rf "$OUT/rings-$c" "$OUT/cap-$c"; mkdir -p "$OUT/cap-$c"
    "$BIN" agent --ring-dir "$OUT/rings-$c" --capture-dir "$OUT/cap-$c" --listen 127.0.0.1:9464 \
        > "$OUT/$c.agent.out" 2> "$OUT/$c.agent.err" &
    local agent=$!
    sleep 1
    PYTHONPATH="$pp" LD_PRELOAD="$VRAMHOOK_LIB" VRAMHOOK_DIR="$OUT/rings-$c" \
        python3 $S/holders.py hold 60 "$OUT/$c.ready" "$OUT/$c.stop" > "$OUT/$c.holder.json" 2> "$OUT/$c.holder.err" &
    local holder=$!
    for _ in $(seq 600); do [ -f "$OUT/$c.ready" ] && break; sleep 0.1; done
    sleep 3 # a few lens samples, drained
    PYTHONPATH="$pp" LD_PRELOAD="$VRAMHOOK_LIB" VRAMHOOK_DIR="$OUT/rings-$c" \
        python3 $S/holders.py ask 100 > "$OUT/$c.asker.json" 2> "$OUT/$c.asker.log"
    echo "$c: asker exit $?"
    sleep 3 # the failure drained, NVML read after it
    agent_state 9464 > "$OUT/$c.state.json"
    touch "$OUT/$c.stop"; wait $holder
    kill -TERM $agent; wait $agent
    "$BIN" analyze --json "$OUT"/cap-$c/*.vrhk > "$OUT/$c.capture.json" 2> "$OUT/$c.capture.err"
    "$BIN" analyze "$OUT"/cap-$c/*.vrhk > "$OUT/$c.capture.txt" 2>&1
    "$BIN" analyze --json "$OUT/$c.asker.log" > "$OUT/$c.log.json" 2> "$OUT/$c.log.err"
}
pair lens lens
pair nolens nolens

# The holder untraced; the asker alone under vramhook run.
python3 $S/holders.py hold 60 "$OUT/run.ready" "$OUT/run.stop" > "$OUT/run.holder.json" 2> "$OUT/run.holder.err" &
holder=$!
for _ in $(seq 600); do [ -f "$OUT/run.ready" ] && break; sleep 0.1; done
"$BIN" run --record "$OUT/run.vhc" -- python3 $S/holders.py ask 100 > "$OUT/run.asker.json" 2> "$OUT/run.asker.log"
echo "run: asker exit $?"
touch "$OUT/run.stop"; wait $holder
"$BIN" analyze --json "$OUT/run.vhc" > "$OUT/run.capture.json" 2> "$OUT/run.capture.err"
"$BIN" analyze "$OUT/run.vhc" > "$OUT/run.capture.txt" 2>&1

python3 $S/holders.py reserve > "$OUT/reserve.json" 2> "$OUT/reserve.err"
python3 $S/check.py "$OUT" | tee "$OUT/holders-report.txt"
