#!/usr/bin/env bash
# The lens's stacks (VRAMHOOK_LENS_STACKS=1) on the GPU machine, real PyTorch: a fragmented
# cache's OOM under `vramhook run --record`, the snapshot the lens dumps beside the capture,
# then `vramhook analyze capture snapshot`: the fatal incident must list the live allocations'
# stack at stacks_oom.py's KEEP line and the request's at its ASK line. Then the cost of
# PyTorch's memory history per allocation (off / on, python stacks).
#   bash scripts/gpu/lens/stacks.sh OUTDIR [--check-only]   (release build in .gpu/: scripts/gpu/prepare.sh)
# Writes OUTDIR/stacks-report.txt (PASS/FAIL per check) and the run's files.
set -u
# shellcheck source=scripts/gpu/common.sh
source scripts/gpu/common.sh
gpu_run_start stacks "${1:-}" --lens
mkdir -p "$OUT/run"
S=scripts/gpu/lens
# --check-only: judge a run made before (the GPU part done, the analysis and checks again).
if [ "${2:-}" != --check-only ]; then
    gpu_versions torch > "$OUT/env.txt" 2>&1
    cat "$OUT/env.txt"
    rm -f "$OUT"/run/vramhook-stacks-*.pickle
    t0=$SECONDS
    VRAMHOOK_LENS_STACKS=1 timeout 300 "$BIN" run --record "$OUT/run/stacks.vhc" \
        -- python3 "$PWD/$S/stacks_oom.py" > "$OUT/stacks.out" 2> "$OUT/stacks.log"
    echo "stacks_oom: exit $? in $((SECONDS - t0)) s"
    python3 $S/stacks_oom.py bench > "$OUT/stacks_bench.json" 2> "$OUT/stacks_bench.err"
fi
# The program's fill ends in an OOM of its own (caught), so the lens dumps a snapshot there
# too: the fatal request's is the last one.
SNAP=$(ls "$OUT"/run/vramhook-stacks-*.pickle 2>/dev/null | sort -V | tail -1)
if [ -n "$SNAP" ]; then
    "$BIN" analyze "$OUT/run/stacks.vhc" "$SNAP" > "$OUT/stacks.report.txt" 2>&1
    "$BIN" analyze --json "$OUT/run/stacks.vhc" "$SNAP" > "$OUT/stacks.report.json" 2> "$OUT/stacks.analyze.err"
    "$BIN" analyze --html "$OUT/stacks.report.html" "$OUT/run/stacks.vhc" "$SNAP" > /dev/null 2>&1
fi
python3 - "$OUT" "$SNAP" <<'PY' | tee "$OUT/stacks-report.txt"
import json, os, sys
out, snap = sys.argv[1], sys.argv[2]
ok = True
def check(name, cond, detail=""):
    global ok
    ok &= bool(cond)
    print("%s %s%s" % ("PASS" if cond else "FAIL", name, (": " + detail) if detail else ""))
lines = [json.loads(l) for l in open(os.path.join(out, "stacks.out")) if l.startswith("{")]
filled = next((l for l in lines if l.get("phase") == "filled"), {})
log = open(os.path.join(out, "stacks.log")).read()
check("the program failed with PyTorch's OutOfMemoryError", "OutOfMemoryError" in log)
check("the lens named the snapshot on stderr", bool(snap) and ("with stacks at this OOM: " + snap) in log, snap)
named = log.count("vramhook lens: PyTorch memory snapshot with stacks at this OOM: ")
check("no other lens complaint", log.count("vramhook lens:") == named, "%d snapshot line(s)" % named)
if not snap or not filled:
    print("RESULT: FAIL (no snapshot or no filled line)"); sys.exit(1)
r = json.load(open(os.path.join(out, "stacks.report.json")))
fatal = [o for o in r["ooms"] if o["from_snapshot"] is None and o["requested_bytes"] == 2 << 30]
check("the capture has the fatal 2 GiB incident", len(fatal) == 1)
live = fatal[0]["live_at_oom"] if fatal else None
check("it lists the live allocations' stacks", live is not None)
if live:
    top = live["stacks"][0]
    f = top["frames"][0] if top["frames"] else {}
    check("the largest stack is the KEEP line of stacks_oom.py",
          f.get("file", "").endswith("stacks_oom.py") and f.get("line") == filled["keep_line"], json.dumps(f))
    check("its bytes are PyTorch's allocated at the OOM", top["bytes"] == filled["allocated"] and live["bytes"] == filled["allocated"],
          "%d allocations, %d bytes; memory_allocated() %d" % (top["allocations"], top["bytes"], filled["allocated"]))
    check("one allocation per cached segment", top["allocations"] == filled["segments"])
    rf = live["request_frames"][0] if live["request_frames"] else {}
    check("the failed request's stack is the ASK line", rf.get("line") == filled["ask_line"], json.dumps(rf))
text = open(os.path.join(out, "stacks.report.txt")).read()
want = "stacks_oom.py:%d in <" % filled["keep_line"]
check("the text report names file:line", want in text, want)
check("the page has the stacks", "live-stacks" in open(os.path.join(out, "stacks.report.html")).read())
try:
    b = json.load(open(os.path.join(out, "stacks_bench.json")))
    print("INFO memory history cost: %.2f us per alloc+free off, %.2f us on (median of 5 rounds of 20,000)"
          % (b["us_per_alloc_free_off"], b["us_per_alloc_free_on"]))
except Exception as e:
    print("INFO no bench: %r" % (e,))
print("RESULT: %s" % ("PASS" if ok else "FAIL"))
PY
