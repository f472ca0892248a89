#!/usr/bin/env bash
# Self-test of the simulated CUDA driver/runtime and the workloads.
# Builds everything, runs each workload with VRAMHOOK_SIM_LOG_DIR set, and checks exit
# codes, checksum stability, the JSON log and the exit summaries.
# Prints "N passed, M failed"; exits non-zero on any failure.
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
W="$HERE/build/workloads"
make -s -C "$HERE" -j2 all || { echo "build failed"; echo "0 passed, 1 failed"; exit 1; }

TMP="$(mktemp -d /tmp/simcuda-selftest.XXXXXX)"
trap 'rm -rf "$TMP"' EXIT
# the sim's own variables must not leak in from the caller
unset VRAMHOOK_SIM_DEVICES VRAMHOOK_SIM_VRAM_BYTES VRAMHOOK_SIM_SHARED VRAMHOOK_SIM_FAST VRAMHOOK_SIM_LOG_DIR SIM_OOM_GIB

PASS=0
FAIL=0
ok() { PASS=$((PASS + 1)); echo "ok   $*"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL $*"; }

MiB=1048576
# run NAME EXPECTED_RC ENV... -- ARGS... ; leaves $LOGDIR, $OUTF, $CKSUM
RUN_N=0
run() {
    local name=$1 want_rc=$2
    shift 2
    local envs=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    RUN_N=$((RUN_N + 1))
    LOGDIR="$TMP/log.$RUN_N"
    OUTF="$TMP/out.$RUN_N"
    mkdir -p "$LOGDIR"
    env "${envs[@]+"${envs[@]}"}" VRAMHOOK_SIM_LOG_DIR="$LOGDIR" timeout 120 "$W/$name" "$@" >"$OUTF" 2>"$OUTF.err"
    local rc=$?
    CKSUM="$(tail -n 1 "$OUTF")"
    if [ "$rc" != "$want_rc" ]; then
        bad "$name $*: exit $rc, expected $want_rc ($(tail -n 3 "$OUTF.err" | tr '\n' ' '))"
        return 1
    fi
    if ! [[ "$CKSUM" =~ ^checksum=[0-9a-f]{16}$ ]]; then
        bad "$name $*: last line is not checksum=<16 hex>: '$CKSUM'"
        return 1
    fi
    ok "$name $*: exit $rc, $CKSUM"
    return 0
}

# check_logs DIR 'python expression over S (list of summaries per file), L (all lines per file)'
# Every line of every file must be JSON; each file must end with one summary line.
check_logs() {
    local dir=$1 desc=$2 expr=$3
    if python3 - "$dir" "$expr" <<'PY'; then ok "$desc"; else bad "$desc"; fi
import json, os, sys
d, expr = sys.argv[1], sys.argv[2]
files = sorted(os.listdir(d))
S, L = [], []
for f in files:
    lines = [json.loads(l) for l in open(os.path.join(d, f))]
    sums = [l for l in lines if l.get("summary")]
    calls = [l for l in lines if not l.get("summary")]
    for c in calls:
        for k in ("fn", "result", "addr", "size", "aux", "device", "tid"):
            assert k in c, (f, c)
    if not sums or not lines[-1].get("summary"):
        print(f"{f}: no summary at the end", file=sys.stderr); sys.exit(1)
    S.append(sums[-1]); L.append(calls)
def dev(s, i=0): return s["devices"][i]
def fns(calls): return [c["fn"] for c in calls]
env = dict(S=S, L=L, dev=dev, fns=fns, MiB=1048576, GiB=1 << 30)
r = eval(expr, env)
if not r:
    print("check failed:", expr, file=sys.stderr)
    for s in S: print("  summary:", json.dumps(s), file=sys.stderr)
    sys.exit(1)
PY
}

# ---- 1. exports and cuGetProcAddress ----
missing=""
nlisted=0
for s in cuInit cuDriverGetVersion cuDeviceGet cuDeviceGetCount cuDeviceTotalMem_v2 cuDevicePrimaryCtxRetain \
    cuDevicePrimaryCtxRelease_v2 cuCtxCreate_v2 cuCtxSetCurrent cuCtxGetCurrent cuCtxGetDevice cuCtxSynchronize \
    cuStreamCreate cuStreamCreateWithPriority cuStreamDestroy cuStreamDestroy_v2 cuStreamSynchronize cuGetProcAddress cuGetProcAddress_v2 cuGetErrorName \
    cuMemGetInfo_v2 cuMemAlloc_v2 cuMemAllocPitch_v2 cuMemAllocManaged cuMemFree_v2 cuMemAllocAsync \
    cuMemAllocAsync_ptsz cuMemAllocFromPoolAsync cuMemAllocFromPoolAsync_ptsz cuMemFreeAsync cuMemFreeAsync_ptsz \
    cuMemPoolCreate cuMemPoolDestroy cuMemPoolTrimTo cuDeviceGetDefaultMemPool cuMemGetAllocationGranularity \
    cuDeviceGetMemPool cuDeviceSetMemPool cuMemPoolGetAttribute cuMemPoolSetAttribute \
    cuMemCreate cuMemRelease cuMemAddressReserve cuMemAddressFree cuMemMap cuMemUnmap cuMemSetAccess \
    cuArrayCreate_v2 cuArray3DCreate_v2 cuArrayDestroy cuMipmappedArrayCreate cuMipmappedArrayDestroy \
    cuIpcGetMemHandle cuIpcOpenMemHandle cuIpcOpenMemHandle_v2 cuIpcCloseMemHandle cuMemGetAddressRange_v2 \
    cuMemExportToShareableHandle \
    cuMemImportFromShareableHandle; do
    nlisted=$((nlisted + 1))
    nm -D --defined-only "$HERE/build/libcuda.so.1" | grep -qw "T $s" || missing="$missing $s"
done
[ -z "$missing" ] && ok "libcuda.so.1 exports all driver entry points" || bad "libcuda.so.1 lacks:$missing"
n_exported=$(nm -D --defined-only "$HERE/build/libcuda.so.1" | grep -c ' T ')
[ "$n_exported" = "$nlisted" ] && ok "libcuda.so.1 exports nothing else ($nlisted functions)" || bad "libcuda.so.1 exports $n_exported functions, expected $nlisted"
readelf -d "$HERE/build/libcuda.so.1" | grep -q 'SONAME.*libcuda.so.1' && readelf -d "$HERE/build/libcuda.so.1" | grep -q SYMBOLIC \
    && ok "libcuda.so.1: soname and -Bsymbolic" || bad "libcuda.so.1: soname or SYMBOLIC missing"
readelf -d "$HERE/build/libcudart.so.13" | grep -q 'SONAME.*libcudart.so.13' && ok "libcudart.so.13 soname" || bad "libcudart.so.13 soname"
if nm -D "$HERE/build/libcudart.so.13" | grep -qE ' U cu[A-Z]'; then bad "libcudart.so.13 links driver symbols directly"; else ok "libcudart.so.13 has no direct driver references"; fi
if nm "$W/torch_caching_static" | grep -qE ' T cudaMalloc$'; then ok "torch_caching_static has cudart linked in"; else bad "torch_caching_static: cudaMalloc not static"; fi
if "$W/gpa_check" >"$TMP/gpa.out" 2>&1; then ok "cuGetProcAddress answers like dlsym (gpa_check)"; else bad "gpa_check: $(cat "$TMP/gpa.out")"; fi

# ---- 2. workloads ----
# single-threaded ones: the checksum must be stable across runs and with/without logging
stable() {
    local name=$1
    shift
    local a b c
    run "$name" 0 -- "$@" || return
    a=$CKSUM
    run "$name" 0 -- "$@" || return
    b=$CKSUM
    c=$(timeout 120 "$W/$name" "$@" 2>/dev/null | tail -n 1)
    if [ "$a" = "$b" ] && [ "$a" = "$c" ]; then ok "$name $*: checksum stable (2 logged runs + 1 unlogged)"; else bad "$name $*: checksum differs: $a / $b / $c"; fi
}

stable torch_caching
check_logs "$LOGDIR" "torch_caching: 10 segments (710 MiB) live, 2 OOMs, 10 frees" \
    "dev(S[0])['live_bytes'] == 710*MiB and dev(S[0])['live_allocations'] == 10 and dev(S[0])['used_physical'] == 710*MiB and sum(1 for c in L[0] if c['fn']=='cuMemAlloc_v2' and c['result']==2 and c['size']==200*GiB) == 2 and fns(L[0]).count('cuMemFree_v2') == 10 and sum(1 for c in L[0] if c['fn']=='cuMemAlloc_v2' and c['result']==0) == 20"
grep -q '^reserved=1551892480$' "$OUTF" && ok "torch_caching: reserved=1551892480 printed" || bad "torch_caching: reserved line"
grep -q '^OOM: tried to allocate 200.00 GiB' "$OUTF" && ok "torch_caching: OOM message" || bad "torch_caching: OOM message"
ck_shared=$CKSUM
stable torch_caching_static
[ "$CKSUM" = "$ck_shared" ] && ok "static and shared cudart give the same checksum" || bad "static vs shared checksum differ"
check_logs "$LOGDIR" "torch_caching_static: same ground truth" "dev(S[0])['live_bytes'] == 710*MiB"
run torch_caching 0 SIM_OOM_GIB=1 -- && grep -q 'huge allocation of 1 GiB succeeded' "$OUTF" && ok "torch_caching: SIM_OOM_GIB=1 fits" || bad "torch_caching SIM_OOM_GIB=1"
run torch_caching 0 VRAMHOOK_SIM_VRAM_BYTES=2147483648 -- && check_logs "$LOGDIR" "torch_caching on a 2 GiB device" \
    "dev(S[0])['capacity'] == 2*GiB and dev(S[0])['live_bytes'] == 710*MiB"

stable torch_expandable
check_logs "$LOGDIR" "torch_expandable: nothing live, 3 reserves, cuMemCreate OOMs, no cuMemAlloc" \
    "dev(S[0])['live_bytes'] == 0 and dev(S[0])['used_physical'] == 0 and fns(L[0]).count('cuMemAddressReserve') == 3 and fns(L[0]).count('cuMemAddressFree') == 3 and sum(1 for c in L[0] if c['fn']=='cuMemCreate' and c['result']==2) == 2 and 'cuMemAlloc_v2' not in fns(L[0]) and fns(L[0]).count('cuMemMap') == fns(L[0]).count('cuMemUnmap') == sum(1 for c in L[0] if c['fn']=='cuMemCreate' and c['result']==0) == fns(L[0]).count('cuMemRelease')"

stable ggml_vmm
check_logs "$LOGDIR" "ggml_vmm: 8 x 4 MiB mapped after release = 32 MiB live" \
    "dev(S[0])['live_bytes'] == 32*MiB and dev(S[0])['live_allocations'] == 8 and dev(S[0])['used_physical'] == 32*MiB and any(c['fn']=='cuMemAddressReserve' and c['size']==32*GiB for c in L[0]) and fns(L[0]).count('cuMemRelease') == 8 and 'cuMemUnmap' not in fns(L[0])"
stable ggml_vmm --cleanup
check_logs "$LOGDIR" "ggml_vmm --cleanup: nothing live" \
    "dev(S[0])['live_bytes'] == 0 and dev(S[0])['used_physical'] == 0 and fns(L[0]).count('cuMemUnmap') == 1"

stable async_pool
check_logs "$LOGDIR" "async_pool: no live allocations, default pool keeps 10 MiB, all variants seen" \
    "dev(S[0])['live_bytes'] == 0 and dev(S[0])['used_physical'] == 10*MiB and all(f in fns(L[0]) for f in ['cuMemAllocAsync','cuMemAllocAsync_ptsz','cuMemFreeAsync','cuMemFreeAsync_ptsz','cuMemAllocFromPoolAsync','cuMemAllocFromPoolAsync_ptsz','cuMemPoolCreate','cuMemPoolTrimTo','cuMemPoolDestroy'])"
grep -q '^created_pool_reserve_after_free=12582912$' "$OUTF" && grep -q '^created_pool_reserve_after_trim=0$' "$OUTF" \
    && ok "async_pool: pool keeps its reserve after free, trim releases it" || bad "async_pool: reserve/trim figures"
# torch_async: PyTorch's cudaMallocAsync shape; the pool grows in chunks and keeps them.
OUTF="$TMP/torch_async.out"
VRAMHOOK_SIM_POOL_CHUNK_BYTES=$((96 << 20)) "$W/torch_async" >"$OUTF" 2>&1
grep -q '^pool_reserved=1610612736$' "$OUTF" && grep -q '^pool_used=807403520$' "$OUTF" \
    && ok "torch_async: 96 MiB chunks, the reserve stays after frees (cuMemPoolGetAttribute)" \
    || bad "torch_async: $(cat "$OUTF")"

leak_live() { python3 -c "import sys; n=int(sys.argv[1]); print(sum((i%5+1)*1048576+i*1000 for i in range(1,n,2)))" "$1"; }
stable leak
check_logs "$LOGDIR" "leak: odd buffers live" "dev(S[0])['live_bytes'] == $(leak_live 10) and dev(S[0])['live_allocations'] == 5"
run leak 7 -- --n 25 --exit 7 && check_logs "$LOGDIR" "leak --n 25 --exit 7: exit code and live bytes" \
    "dev(S[0])['live_bytes'] == $(leak_live 25) and dev(S[0])['live_allocations'] == 12"

stable fork_exec
check_logs "$LOGDIR" "fork_exec: parent and child each log to their own pid file" \
    "len(S) == 2 and sorted(dev(s)['live_bytes'] for s in S) == sorted([$(leak_live 4), 28*MiB]) and all(s['pid'] != S[0]['pid'] for s in S[1:])"

stable ollama_shape && grep -q '^pids serve' "$OUTF" && [ "$(ls "$LOGDIR" | wc -l)" = 3 ] \
    && ok "ollama_shape: the server and the discovery child log nothing, the three runners (one out of memory, restarted) each their own" \
    || bad "ollama_shape: $(cat "$OUTF.err" | head -3 | tr '\n' ' ')"

run threads16 0 -- && a=$CKSUM && check_logs "$LOGDIR" "threads16: 32000 alloc/free pairs from 16 threads, nothing live" \
    "dev(S[0])['live_bytes'] == 0 and fns(L[0]).count('cuMemAlloc_v2') == 32000 and fns(L[0]).count('cuMemFree_v2') == 32000 and len(set(c['tid'] for c in L[0] if c['fn']=='cuMemAlloc_v2')) == 16 and all(c['result']==0 for c in L[0])"
run threads16 0 -- && [ "$a" = "$CKSUM" ] && ok "threads16: checksum independent of scheduling" || bad "threads16 checksum differs"
run threads16 0 -- --threads 4 --iters 500 && check_logs "$LOGDIR" "threads16 --threads 4 --iters 500" \
    "fns(L[0]).count('cuMemAlloc_v2') == 2000"

stable misc_api
check_logs "$LOGDIR" "misc_api: nothing live, every kind logged" \
    "dev(S[0])['live_bytes'] == 0 and dev(S[0])['used_physical'] == 0 and all(f in fns(L[0]) for f in ['cuMemAllocPitch_v2','cuMemAllocManaged','cuArrayCreate_v2','cuArray3DCreate_v2','cuArrayDestroy','cuMipmappedArrayCreate','cuMipmappedArrayDestroy','cuIpcOpenMemHandle','cuIpcCloseMemHandle','cuMemImportFromShareableHandle','cuMemGetInfo_v2']) and any(c['fn']=='cuMemAllocPitch_v2' and c['aux']==1024 and c['size']==1024*300 for c in L[0]) and any(c['fn']=='cuArrayCreate_v2' and c['size']==1024*512*16 for c in L[0]) and any(c['fn']=='cuMipmappedArrayCreate' and c['size']==4*sum(max(256>>l,1)**2 for l in range(9)) for c in L[0]) and sum(1 for c in L[0] if c['fn']=='cuMemFree_v2' and c['result']==1) == 2"
run misc_api 0 VRAMHOOK_SIM_DEVICES=2 -- && check_logs "$LOGDIR" "misc_api on 2 devices: 3 MiB live on device 1" \
    "len(S[0]['devices']) == 2 and dev(S[0],0)['live_bytes'] == 0 and dev(S[0],1)['live_bytes'] == 3*MiB and any(c['device']==1 and c['fn']=='cuMemAlloc_v2' for c in L[0])"

run bench_calls 0 VRAMHOOK_SIM_FAST=1 -- --threads 2 --iters 2000 && grep '^{' "$OUTF" | python3 -c 'import json,sys; d=json.loads(sys.stdin.readline()); assert d["errors"]==0 and d["alloc_median_ns"]>0' \
    && ok "bench_calls: JSON line" || bad "bench_calls JSON line"

# ---- 3. what a naive LD_PRELOAD of exported driver symbols sees (cuda-facts.md) ----
NP="$HERE/build/naive_preload.so"
o=$(LD_PRELOAD="$NP" "$W/torch_caching" 2>&1 >/dev/null | grep naive_preload)
[ "$o" = "naive_preload: cuMemAlloc_v2=0 cuMemFree_v2=0 cuMemCreate=0" ] && ok "naive preload sees nothing of cudart (torch_caching)" || bad "naive preload on torch_caching: $o"
o=$(LD_PRELOAD="$NP" "$W/ggml_vmm" 2>&1 >/dev/null | grep naive_preload)
[ "$o" = "naive_preload: cuMemAlloc_v2=0 cuMemFree_v2=0 cuMemCreate=8" ] && ok "naive preload sees ggml's direct VMM calls only" || bad "naive preload on ggml_vmm: $o"
o=$(LD_PRELOAD="$NP" "$W/misc_api" 2>&1 >/dev/null | grep naive_preload)
[ "$o" = "naive_preload: cuMemAlloc_v2=0 cuMemFree_v2=0 cuMemCreate=2" ] && ok "naive preload: no driver-internal calls leak out (misc_api)" || bad "naive preload on misc_api: $o"

# ---- 4. shared device across processes ----
SHM="/dev/shm/simcuda-selftest-$$"
rm -f "$SHM"
VRAMHOOK_SIM_SHARED="$SHM" "$W/leak" --n 10 --hold 3 >/dev/null &
hold_pid=$!
sleep 1
used=$(python3 -c "import struct,sys; print(struct.unpack('<Q', open(sys.argv[1],'rb').read(8))[0])" "$SHM" 2>/dev/null)
[ "$used" = $((11 * MiB * 2)) ] && ok "shared mode: another process sees the holder's 22 MiB" || bad "shared mode: counter is '$used', expected $((11 * MiB * 2))"
out=$(VRAMHOOK_SIM_SHARED="$SHM" VRAMHOOK_SIM_VRAM_BYTES=$((1480 * MiB + 10 * MiB)) "$W/torch_caching" 2>&1)
if echo "$out" | grep -q '^checksum='; then bad "shared mode: torch_caching should not fit next to the holder"; else ok "shared mode: processes compete for the same VRAM"; fi
wait $hold_pid
used=$(python3 -c "import struct,sys; print(struct.unpack('<Q', open(sys.argv[1],'rb').read(8))[0])" "$SHM")
[ "$used" = 0 ] && ok "shared mode: memory returned at process exit" || bad "shared mode: counter is $used after exit"
rm -f "$SHM"

# ---- 5. the GPU machine's pool-overhead probe (scripts/gpu/pools) reads the simulated driver ----
# The simulated driver keeps no bytes of its own: every byte the probe sees used is a pool's
# reserve or its own cuMemAlloc, so the summary's "outside" column is 0 at every step.
# Its own folder: two runs of the suite side by side must not share the probe or its output.
probe_dir=$(mktemp -d)
PROBE="$probe_dir/overhead_probe"
POOLS="$HERE/../../scripts/gpu/pools"
if gcc -O2 -Wall -Werror -o "$PROBE" "$POOLS/overhead_probe.c" -ldl; then
    ov="$probe_dir/overhead.jsonl"
    : > "$ov"
    for s in malloc async async-threshold pool malloc-then-async streams priority-streams; do
        LD_LIBRARY_PATH="$HERE/build" "$PROBE" "$s" >> "$ov" || bad "overhead_probe $s failed"
    done
    summary=$(python3 "$POOLS/overhead_summary.py" "$ov")
    rows=$(echo "$summary" | grep '^  [a-z]' | grep -v '^  step ' | sed 's/  *[0-9-]* KiB per stream$//')
    steps=$(echo "$rows" | wc -l)
    outside=$(echo "$rows" | awk '{print $NF}' | sort -u | tr '\n' ' ')
    reserve64=$(echo "$summary" | grep -c '^  async 64 MiB  .* 64.0 ' || true)
    [ "$steps" = 188 ] && [ "$outside" = "0.0 " ] && [ "$reserve64" = 4 ] \
        && ok "overhead probe: $steps steps, nothing outside the pools and its own allocations" \
        || bad "overhead probe summary (steps $steps, outside '$outside', 64 MiB reserves $reserve64):
$summary"
else
    bad "overhead_probe.c does not build"
fi
rm -rf "$probe_dir"

echo "$PASS passed, $FAIL failed"
[ "$FAIL" = 0 ]
