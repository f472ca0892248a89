#!/usr/bin/env bash
# ollama v0.24.0 under vramhook on the GPU machine (issue #12). Two device commands, or one:
#   bash scripts/gpu/ollama/run.sh build OUTDIR       ggml-cuda for sm_90 (~3 min); OUTDIR gets
#                                                     ggml-libs.tar.xz: put it in .gpu/ollama/ here
#   bash scripts/gpu/ollama/run.sh scenarios OUTDIR   the five scenarios, under the agent with
#                                                     LD_PRELOAD and under `vramhook run`, and
#                                                     warm_probe in each, then the checks
#                                                     (check.py); exit 1 on a mismatch
#   bash scripts/gpu/ollama/run.sh all OUTDIR         build, then scenarios (~6 min)
# OUTDIR gets ollama.txt (the report), raw.tar.gz (everything check.py reads: rerun it on the
# unpacked copy with `python3 check.py vho`), and the README's excerpts.
# What it needs in .gpu/ (scripts/gpu/ollama/prepare.sh makes it here): vramhook,
# libvramhook.so, ollama/ollama.gz (v0.24.0, stripped), ollama/ggml-libs.tar.xz,
# ollama/gguf-*.whl; for `build`, ollama/ggml-src.tar.gz.
set -u
STEP=${1:-scenarios}
OUT="${2:-${OUT:-/tmp/vramhook-ollama}}"
mkdir -p "$OUT"
HERE=scripts/gpu/ollama
[ "$STEP" = build ] && exec bash "$HERE/build-cuda.sh" "$OUT"
if [ "$STEP" = all ]; then
    bash "$HERE/build-cuda.sh" "$OUT" || exit 1
    cp "$OUT/ggml-libs.tar.xz" .gpu/ollama/ggml-libs.tar.xz
fi
R=/tmp/vho
rm -rf "$R" /dev/shm/vramhook; mkdir -p "$R/dist/bin" "$R/models"
export VRAMHOOK="$PWD/.gpu/vramhook" VRAMHOOK_LIB="$PWD/.gpu/libvramhook.so"
export OLLAMA="$R/dist/bin/ollama" MODELS="$R/models" GGUF_A="$R/vh-a.gguf" GGUF_B="$R/vh-b.gguf"
export PYTHONUNBUFFERED=1
gunzip -c .gpu/ollama/ollama.gz > "$OLLAMA"; chmod +x "$OLLAMA"
tar -xJf .gpu/ollama/ggml-libs.tar.xz -C "$R/dist"
# ollama's CUDA 13 package ships cudart and cuBLAS beside libggml-cuda.so: link the toolkit's.
for l in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
    f=$(ls /usr/local/cuda/lib64/$l 2>/dev/null || find / -name "$l" -not -path '*/proc/*' 2>/dev/null | head -1)
    ln -sf "$(readlink -f "$f")" "$R/dist/lib/ollama/cuda_v13/$l"
done
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/ollama/gguf-*.whl && export PYTHONPATH=/tmp/site
# warm_probe, built here for sm_90 (the copy built on the development machine if nvcc fails).
export WARM_PROBE="$R/warm_probe" CUBLAS_LIB="$R/dist/lib/ollama/cuda_v13/libcublas.so.13"
nvcc -O2 -arch=sm_90 -Xptxas -v -o "$WARM_PROBE" $HERE/warm_probe.cu -ldl > "$R/warm_probe-build.log" 2>&1 \
    || { tail -5 "$R/warm_probe-build.log"; cp .gpu/ollama/warm_probe "$WARM_PROBE" 2>/dev/null; }
grep -c "stack frame" "$R/warm_probe-build.log"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; "$OLLAMA" --version 2>&1 | tail -1;
  ls -l "$R/dist/lib/ollama" "$R/dist/lib/ollama/cuda_v13"; uname -r; } > "$R/env.txt" 2>&1
cat "$R/env.txt"
t0=$SECONDS
python3 $HERE/make_model.py "$GGUF_A" 4 1 && python3 $HERE/make_model.py "$GGUF_B" 2 2
ls -l "$R"/*.gguf; echo "models made in $((SECONDS - t0)) s"

# Mode 1: the agent, ollama serve with LD_PRELOAD.
mkdir -p "$R/agent"
"$VRAMHOOK" agent --snapshot-ms 100 --capture-dir "$R/agent/capture" > "$R/agent/agent.log" 2>&1 &
agent=$!
for _ in $(seq 100); do curl -sf -m 1 http://127.0.0.1:9464/metrics > /dev/null && break; sleep 0.1; done
python3 $HERE/probe.py sample "$R/agent/samples.jsonl" "$R/agent/stop-sampling" &
sampler=$!
timeout 150 bash $HERE/scenarios.sh agent "$R/agent" 2>&1 | tee "$R/agent/scenarios.log"
curl -s -m 5 http://127.0.0.1:9464/metrics > "$R/agent/metrics.txt"
curl -s -m 5 http://127.0.0.1:9464/api/v1/state > "$R/agent/state.json"
touch "$R/agent/stop-sampling"; wait $sampler
kill -INT $agent; wait $agent; echo "agent exit $? after $((SECONDS - t0)) s"
while read -r _ p; do kill "$p" 2>/dev/null; done < "$R/agent/serve-pids.txt"   # none should be left

# Mode 2: the same under `vramhook run` (rm the models: create again, as a user would).
rm -rf /dev/shm/vramhook "$MODELS"; mkdir -p "$R/run" "$MODELS"
timeout 150 "$VRAMHOOK" run --record "$R/run/run.vhc" --summary-json "$R/run/summary.json" \
    -- bash $HERE/scenarios.sh run "$R/run" > "$R/run/scenarios.log" 2>&1
echo "vramhook run exit $? after $((SECONDS - t0)) s"; tail -40 "$R/run/scenarios.log"

# Mode 3: the agent again, with ollama's new engine (its runner reports what it allocated).
rm -rf /dev/shm/vramhook; mkdir -p "$R/agent-new"
"$VRAMHOOK" agent --snapshot-ms 100 --capture-dir "$R/agent-new/capture" > "$R/agent-new/agent.log" 2>&1 &
agent=$!
for _ in $(seq 100); do curl -sf -m 1 http://127.0.0.1:9464/metrics > /dev/null && break; sleep 0.1; done
python3 $HERE/probe.py sample "$R/agent-new/samples.jsonl" "$R/agent-new/stop-sampling" &
sampler=$!
OLLAMA_NEW_ENGINE=1 timeout 130 bash $HERE/scenarios.sh agent "$R/agent-new" > "$R/agent-new/scenarios.log" 2>&1
echo "new engine: exit $? after $((SECONDS - t0)) s"; tail -30 "$R/agent-new/scenarios.log"
curl -s -m 5 http://127.0.0.1:9464/metrics > "$R/agent-new/metrics.txt"
touch "$R/agent-new/stop-sampling"; wait $sampler
kill -INT $agent; wait $agent
while read -r _ p; do kill "$p" 2>/dev/null; done < "$R/agent-new/serve-pids.txt"

# Kernels' stack (local memory) sizes in the CUDA backend: the driver reserves local memory
# for the largest one a context has launched, for every thread the GPU can hold.
cuobjdump -res-usage "$R/dist/lib/ollama/cuda_v13/libggml-cuda.so" > "$R/res-usage.txt" 2>&1
grep -o 'STACK:[0-9]*' "$R/res-usage.txt" | sort | uniq -c | sort -t: -k2 -n > "$R/stack-sizes.txt"
awk '/Function/{f=$2} /STACK:/{match($0,/STACK:[0-9]+/); print substr($0,RSTART+6,RLENGTH-6), f}' "$R/res-usage.txt" \
    | sort -n | tail -8 > "$R/stack-largest.txt"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> "$R/stack-sizes.txt"
python3 -c 'import torch; p=torch.cuda.get_device_properties(0); print("SMs", p.multi_processor_count, "max threads/SM", p.max_threads_per_multi_processor)' >> "$R/stack-sizes.txt" 2>&1
tail -8 "$R/stack-sizes.txt"

for m in agent run agent-new; do
    caps=$(ls "$R/$m"/*.vhc "$R/$m"/capture/* 2>/dev/null | grep -v "\.tmp$")
    # shellcheck disable=SC2086
    "$VRAMHOOK" analyze $caps "$R/$m/serve-fail.log" > "$R/$m/analyze-fail.txt" 2>&1
    "$VRAMHOOK" analyze $caps --json > "$R/$m/analyze.json" 2> "$R/$m/analyze.err"
done
python3 $HERE/check.py "$R" | tee "$OUT/ollama.txt"
status=${PIPESTATUS[0]}
cp "$R/agent/top-generating.txt" "$R/agent/metrics-generating.txt" "$R/agent/analyze-fail.txt" "$OUT/" 2>/dev/null
rm -f "$R/res-usage.txt"
tar -C /tmp --exclude='*.gguf' --exclude='vho/models/blobs' --exclude='vho/dist' --exclude='vho/warm_probe' -czf "$OUT/raw.tar.gz" vho
ls -la "$OUT"
exit $status
