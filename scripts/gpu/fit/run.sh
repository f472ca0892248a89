#!/usr/bin/env bash
# Issue #30 on the GPU machine: the fit of the next large request, warned before the OOM, in
# a real PyTorch inference loop (scripts/gpu/fit/serve.py: a Llama-style model from
# LlamaConfig with random weights) run with the agent and the lens until it fails, then its
# control: the same requests with expandable_segments:True.
#   bash scripts/gpu/fit/run.sh OUTDIR [POOL_GIB [SECONDS]]   (release build in .gpu/: scripts/gpu/prepare.sh)
# POOL_GIB (default 7): the device's memory left to the loop; SECONDS (default 225): how long
# the fragmenting run may serve (the control serves as many requests as it did).
# The lens takes a snapshot every 5 s (VRAMHOOK_LENS_SNAPSHOT_S; default 30 s) because the
# run is minutes, not hours. Writes OUTDIR/fit-report.txt (PASS/FAIL per check, the lead
# time) and every run's files: the agent's state each second (CASE.fits.jsonl), its capture,
# `analyze` of it as JSON, text and HTML.
# FIT_CASE=expandable or FIT_CASE=fifo runs one control alone, not cut at the fragmenting
# run's request count but until it fails or SECONDS run out: expandable segments, or the
# sessions released in the order they began (--release fifo, the caching allocator as in
# the fragmenting run); then scripts/gpu/fit/long.py OUTDIR CASE writes OUTDIR/CASE-report.txt.
set -u
OUT="${1:-${OUT:-/tmp/vramhook-fit}}"
POOL="${2:-7}"
SECS="${3:-225}"
mkdir -p "$OUT"
# shellcheck source=scripts/gpu/common.sh
source scripts/gpu/common.sh
use_gpu_build --lens
S=scripts/gpu/fit
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' \
    | tee "$OUT/env.txt"

serve() { # case alloc_conf [serve.py args...]
    local c=$1 conf=$2; shift 2
    rm -rf "$OUT/rings-$c" "$OUT/cap-$c" "$OUT/$c.stop"; mkdir -p "$OUT/cap-$c"
    "$BIN" agent --ring-dir "$OUT/rings-$c" --capture-dir "$OUT/cap-$c" --listen 127.0.0.1:9466 \
        > "$OUT/$c.agent.out" 2> "$OUT/$c.agent.err" &
    local agent=$!
    python3 $S/poll.py http://127.0.0.1:9466 "$OUT/$c.stop" > "$OUT/$c.fits.jsonl" 2> "$OUT/$c.poll.err" &
    local poll=$!
    local t0=$SECONDS
    PYTORCH_CUDA_ALLOC_CONF="$conf" VRAMHOOK_LENS_SNAPSHOT_S=5 PYTHONPATH="$VRAMHOOK_LENS_DIR" \
        LD_PRELOAD="$VRAMHOOK_LIB" VRAMHOOK_DIR="$OUT/rings-$c" \
        python3 $S/serve.py --pool-gib "$POOL" "$@" > "$OUT/$c.out" 2> "$OUT/$c.log"
    echo "$c: exit $? in $((SECONDS - t0)) s"
    sleep 3 # the failure drained and judged
    touch "$OUT/$c.stop"; wait $poll
    kill -TERM $agent; wait $agent
    "$BIN" analyze --json "$OUT"/cap-$c/*.vrhk > "$OUT/$c.report.json" 2> "$OUT/$c.analyze.err"
    "$BIN" analyze --json --fit-trend 60s,5min,10s "$OUT"/cap-$c/*.vrhk > "$OUT/$c.forecast.json" 2>> "$OUT/$c.analyze.err"
    "$BIN" analyze "$OUT"/cap-$c/*.vrhk > "$OUT/$c.report.txt" 2>&1
    "$BIN" analyze --html "$OUT/$c.report.html" "$OUT"/cap-$c/*.vrhk > /dev/null 2>&1
}
case "${FIT_CASE:-}" in
    expandable) serve expandable expandable_segments:True --seconds "$SECS" ;;
    fifo) serve fifo "" --release fifo --seconds "$SECS" ;;
    "") ;;
    *) echo "FIT_CASE: expandable or fifo, not $FIT_CASE" >&2; exit 2 ;;
esac
if [ -n "${FIT_CASE:-}" ]; then
    python3 $S/long.py "$OUT" "$FIT_CASE" | tee "$OUT/$FIT_CASE-report.txt"
    exit 0
fi
serve frag "" --seconds "$SECS"
# The control: the same requests, as many as the fragmented run made (its failing one and
# 60 more), with expandable segments.
n=$(python3 -c 'import json,sys
ls=[json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
o=[l for l in ls if l["kind"]=="oom"]
print(o[0]["index"]+61 if o else max([l.get("index",0) for l in ls]+[0])+1)' "$OUT/frag.out")
serve control expandable_segments:True --requests "$n"
python3 $S/check.py "$OUT" | tee "$OUT/fit-report.txt"
