#!/usr/bin/env bash
# eBPF mode on the real GPU (issue 13). From the repo root on the GPU machine, with the
# release build in .gpu/ (scripts/gpu/prepare.sh):  bash scripts/gpu/ebpf.sh [OUTDIR]
# 1. Three PyTorch processes start BEFORE the agent: "late" (plain; allocates only after a
#    signal), "early" (plain; allocated 5 x 200 MiB before the agent started), and
#    "preload" (the same as late, under LD_PRELOAD: it has a ring).
# 2. `vramhook agent --ebpf` starts and attaches; then the processes get SIGUSR1.
# 3. The agent's state is saved and compared (scripts/gpu/ebpf_check.py): late's eBPF live
#    bytes = preload's ring live bytes = memory_reserved(); early is "attached late" with its
#    200 MiB tensors in the device's untraced bytes; preload's probe events dropped (ring wins).
# 4. SIGTERM to the agent: probes gone; the processes carry on.
# 5. Per-call cost of cudaMallocAsync/cudaFreeAsync/cudaMalloc/cudaFree: plain, LD_PRELOAD,
#    eBPF (agent attached), 3 interleaved rounds.
set -u
OUT="${1:-${OUT:-/tmp/vramhook-ebpf}}"
mkdir -p "$OUT"
BIN="$PWD/.gpu/vramhook"
LIB="$PWD/.gpu/libvramhook.so"
RINGS=/tmp/vh-ebpf-rings
rm -rf "$RINGS"
export PYTHONUNBUFFERED=1
[ -x "$BIN" ] && [ -f "$LIB" ] || { echo "MISSING .gpu/vramhook or .gpu/libvramhook.so" >&2; exit 1; }
(nvcc -O2 -o /tmp/bench_real scripts/gpu/bench_real.cu > "$OUT/nvcc.log" 2>&1 &)
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; uname -r;
  ls /proc/driver/nvidia/gpus 2>&1 | head -3; grep -m1 libcuda /proc/self/maps; ls -la /usr/local/nvidia/lib64/libcuda.so* 2>&1 | head -3; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

python3 scripts/gpu/torch_wait.py late > "$OUT/late.out" 2> "$OUT/late.err" &
LATE=$!
python3 scripts/gpu/torch_wait.py early > "$OUT/early.out" 2> "$OUT/early.err" &
EARLY=$!
VRAMHOOK_DIR=$RINGS LD_PRELOAD="$LIB" python3 scripts/gpu/torch_wait.py late > "$OUT/preload.out" 2> "$OUT/preload.err" &
PRE=$!
for f in late early preload; do
    for _ in $(seq 600); do grep -q ready "$OUT/$f.out" 2>/dev/null && break; sleep 0.1; done
done
echo "ready: late=$LATE early=$EARLY preload=$PRE"; cat "$OUT"/{late,early,preload}.out

"$BIN" agent --ebpf --ebpf-device 0 --ring-dir "$RINGS" --listen 127.0.0.1:9477 --no-recover --snapshot-ms 100 \
    2> "$OUT/agent.log" &
AGENT=$!
for _ in $(seq 300); do grep -q "eBPF probes attached\|error" "$OUT/agent.log" && break; sleep 0.1; done
sleep 1.5
get() { python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:9477$1', timeout=5).read().decode())"; }
get /api/v1/state > "$OUT/state_attached.json"
kill -USR1 $LATE $EARLY $PRE
for f in late early preload; do
    for _ in $(seq 300); do grep -q done "$OUT/$f.out" 2>/dev/null && break; sleep 0.1; done
done
sleep 1.5
get /api/v1/state > "$OUT/state.json"
get /metrics > "$OUT/metrics.txt"
kill -TERM $AGENT; wait $AGENT; echo "agent exit $?"
cat "$OUT/agent.log"
# The processes carry on without probes: one more allocation each, then they end.
kill -TERM $LATE $EARLY $PRE; wait $LATE $EARLY $PRE; echo "workloads exit: $?"
python3 scripts/gpu/ebpf_check.py "$OUT" | tee "$OUT/results.txt"

# Per-call cost, interleaved: plain, LD_PRELOAD, eBPF (agent attached only for its run).
wait
for _ in $(seq 100); do [ -x /tmp/bench_real ] && break; sleep 0.2; done
rm -f "$OUT/bench.jsonl"
for round in 1 2 3; do
    taskset -c 3 /tmp/bench_real 2000 | sed 's/^{/{"mode":"plain",/' >> "$OUT/bench.jsonl"
    rm -rf /tmp/vh-bench
    VRAMHOOK_DIR=/tmp/vh-bench VRAMHOOK_RING_SLOTS=1048576 LD_PRELOAD="$LIB" taskset -c 3 /tmp/bench_real 2000 \
        | sed 's/^{/{"mode":"preload",/' >> "$OUT/bench.jsonl"
    "$BIN" agent --ebpf --ebpf-device 0 --ring-dir "$RINGS" --no-http --no-recover 2> "$OUT/bench-agent.log" &
    A=$!
    for _ in $(seq 300); do grep -q "eBPF probes attached" "$OUT/bench-agent.log" && break; sleep 0.1; done
    taskset -c 3 /tmp/bench_real 2000 | sed 's/^{/{"mode":"ebpf",/' >> "$OUT/bench.jsonl"
    kill -TERM $A; wait $A
done
cat "$OUT/bench.jsonl"
python3 - "$OUT/bench.jsonl" <<'PY' | tee "$OUT/bench.txt"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for k in ("cudaMallocAsync_1MiB_ns", "cudaFreeAsync_ns", "cudaMalloc_512B_ns", "cudaFree_512B_ns"):
    m = {mode: statistics.median(r[k] for r in rows if r["mode"] == mode) for mode in ("plain", "preload", "ebpf")}
    p = m["plain"]
    print(f"{k:26} plain {p:8.0f}  preload {m['preload']:8.0f} ({m['preload']/p:5.2f}x)  ebpf {m['ebpf']:8.0f} ({m['ebpf']/p:5.2f}x)")
PY
