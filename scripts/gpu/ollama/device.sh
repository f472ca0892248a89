#!/usr/bin/env bash
# The one device command for issue #12 (the `run` tool, timeout_s 600, from a checkout holding
# the prepared .gpu/ of scripts/gpu/ollama/prepare.sh):
#   bash scripts/gpu/ollama/device.sh
# runs `run.sh all` (build ~3.5 min, scenarios ~2 min) with a watchdog: if it is still running
# after DEADLINE_S seconds (default 540, inside the command's 10 minutes), what it gathered so far
# is packed into $OUT/raw.tar.gz, so that check.py can judge it here (`python3 check.py vho`).
set -u
OUT=${OUT:-/tmp/vramhook-ollama}
DEADLINE_S=${DEADLINE_S:-540}
mkdir -p "$OUT"
git log -1 --oneline 2>/dev/null | cut -c1-80
if [ ! -f scripts/gpu/ollama/warm_probe.cu ] || [ ! -x .gpu/vramhook ]; then
    echo "device.sh: this checkout lacks scripts/gpu/ollama/warm_probe.cu or .gpu/vramhook (run prepare.sh and send this tree)"
    exit 3
fi
(bash scripts/gpu/ollama/run.sh all "$OUT" > "$OUT/console.log" 2>&1; echo "run.sh rc=$?" >> "$OUT/console.log") &
job=$!
for _ in $(seq "$DEADLINE_S"); do kill -0 "$job" 2>/dev/null || break; sleep 1; done
if kill -0 "$job" 2>/dev/null; then
    echo "device.sh: run.sh still running after $DEADLINE_S s: packing what it gathered"
    tar -C /tmp --exclude='*.gguf' --exclude='vho/models/blobs' --exclude='vho/dist' --exclude='vho/warm_probe' \
        -czf "$OUT/raw.tar.gz" vho
fi
grep -E "built in|exit|after|warm_probe|passed|failed|FAIL" "$OUT/console.log" | cut -c1-300 | tail -80
grep -q "run.sh rc=0" "$OUT/console.log"
