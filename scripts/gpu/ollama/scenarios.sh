#!/usr/bin/env bash
# The five scenarios of issue #12 against one ollama build, in one of two modes:
#   scenarios.sh agent DIR   ollama serve started with LD_PRELOAD=libvramhook.so while `vramhook
#                            agent` runs (started by run.sh); each checkpoint reads NVML, the
#                            agent's state and /api/ps together (probe.py)
#   scenarios.sh run DIR     the whole script runs under `vramhook run` (run.sh starts it), which
#                            sets LD_PRELOAD for every descendant; checkpoints read NVML and /api/ps
# Needs: $OLLAMA (the binary, ../lib/ollama beside it), $MODELS (an OLLAMA_MODELS directory),
# $GGUF_A/$GGUF_B, $VRAMHOOK and $VRAMHOOK_LIB. Every step is bounded in time.
set -u
MODE=$1 DIR=$2
mkdir -p "$DIR"
HERE=$(cd "$(dirname "$0")" && pwd)
API=http://127.0.0.1:11434
export OLLAMA_HOST=127.0.0.1:11434 OLLAMA_MODELS="$MODELS"
CK="$DIR/checkpoints.jsonl"
say() { echo "[$(date +%T.%N | cut -c1-12)] $*"; }
checkpoint() { python3 "$HERE/probe.py" checkpoint "$1" "$CK"; }
preload() { if [ "$MODE" = agent ]; then echo "LD_PRELOAD=$VRAMHOOK_LIB"; else echo "VRAMHOOK_UNUSED=1"; fi; }

SERVE_PID=""
start_serve() { # NAME [VAR=VALUE...]
    local name=$1; shift
    env OLLAMA_CONTEXT_LENGTH=4096 OLLAMA_KEEP_ALIVE=10m OLLAMA_MAX_LOADED_MODELS=3 OLLAMA_NOPRUNE=1 "$@" "$(preload)" \
        "$OLLAMA" serve > "$DIR/serve-$name.log" 2>&1 &
    SERVE_PID=$!
    echo "$name $SERVE_PID" >> "$DIR/serve-pids.txt"
    for _ in $(seq 300); do curl -sf -m 1 "$API/api/version" > /dev/null && break; sleep 0.1; done
    # Discovery runs in the background after the listener: wait until it has said what it found.
    for _ in $(seq 300); do grep -q 'inference compute' "$DIR/serve-$name.log" && break; sleep 0.1; done
    say "serve $name pid $SERVE_PID up: $(grep -m1 'inference compute' "$DIR/serve-$name.log" | cut -c1-220)"
}
stop_serve() {
    [ -n "$SERVE_PID" ] || return
    kill "$SERVE_PID" 2>/dev/null
    for _ in $(seq 200); do kill -0 "$SERVE_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$SERVE_PID" 2>/dev/null; wait "$SERVE_PID" 2>/dev/null; SERVE_PID=""
    sleep 1
}
generate() { # OUTNAME JSON
    curl -s -m 240 "$API/api/generate" -d "$2" > "$DIR/$1.json"; echo " $1: $(head -c 300 "$DIR/$1.json" | tr '\n' ' ')"
}
unload() { # MODEL
    curl -s -m 60 "$API/api/generate" -d "{\"model\":\"$1\",\"keep_alive\":0}" > /dev/null
}
wait_unloaded() {
    for _ in $(seq 300); do
        [ "$(curl -s -m 2 "$API/api/ps" | python3 -c 'import json,sys; print(len(json.load(sys.stdin).get("models",[])))' 2>/dev/null)" = 0 ] \
            && ! pgrep -f "$OLLAMA runner.*--model" > /dev/null && return
        sleep 0.1
    done
    say "models still loaded after 30 s"
}
P='"prompt":"The memory of a GPU is","raw":true'

say "mode $MODE"
# 1. serve, load, generate, unload.
start_serve main
for m in a b; do
    f=$GGUF_A; [ $m = b ] && f=$GGUF_B
    printf 'FROM %s\nTEMPLATE {{ .Prompt }}\n' "$f" > "$DIR/Modelfile.$m"
    timeout 180 "$OLLAMA" create "vh-$m" -f "$DIR/Modelfile.$m" > "$DIR/create-$m.log" 2>&1; say "create vh-$m: exit $?"
done
curl -s -m 240 "$API/api/generate" -d "{\"model\":\"vh-a\",$P,\"stream\":true,\"options\":{\"num_predict\":3000,\"temperature\":0.8}}" > "$DIR/s1-generate.jsonl" &
gen=$!
for _ in $(seq 600); do [ -s "$DIR/s1-generate.jsonl" ] && break; sleep 0.05; done
sleep 0.5
checkpoint s1-generating
if [ "$MODE" = agent ]; then
    "$VRAMHOOK" top --once 150x24 > "$DIR/top-generating.txt" 2>&1
    curl -s -m 5 http://127.0.0.1:9464/metrics > "$DIR/metrics-generating.txt"
fi
wait $gen; say "s1 generated $(grep -c '"response"' "$DIR/s1-generate.jsonl") chunks"
tail -1 "$DIR/s1-generate.jsonl" | cut -c1-400
checkpoint s1-loaded
unload vh-a; wait_unloaded
checkpoint s1-unloaded

# 2. two models at once.
generate s2-a "{\"model\":\"vh-a\",$P,\"stream\":false,\"options\":{\"num_predict\":16}}"
generate s2-b "{\"model\":\"vh-b\",$P,\"stream\":false,\"options\":{\"num_predict\":16}}"
checkpoint s2-two-models
unload vh-a; unload vh-b; wait_unloaded

# 3. a large num_ctx: 131,072 tokens, 4 layers x 4 KiB = 2 GiB of KV cache.
generate s3-large-ctx "{\"model\":\"vh-a\",$P,\"stream\":false,\"options\":{\"num_predict\":16,\"num_ctx\":131072}}"
checkpoint s3-large-ctx
unload vh-a; wait_unloaded
stop_serve

# 4. OLLAMA_NUM_PARALLEL=4, four concurrent requests.
start_serve parallel OLLAMA_NUM_PARALLEL=4
pids=""
for i in 1 2 3 4; do
    curl -s -m 240 "$API/api/generate" -d "{\"model\":\"vh-a\",$P,\"stream\":true,\"options\":{\"num_predict\":1500}}" > "$DIR/s4-generate-$i.jsonl" &
    pids="$pids $!"
done
for _ in $(seq 600); do [ -s "$DIR/s4-generate-4.jsonl" ] && break; sleep 0.05; done
sleep 0.5
checkpoint s4-parallel-generating
wait $pids
checkpoint s4-parallel
unload vh-a; wait_unloaded
stop_serve

# 5. Another process holds all but 1.25 GiB of the GPU. (a) all layers forced onto the GPU
# with a 2 GiB KV cache: the runner's allocation fails and ollama reports the error; (b) the
# same model as ollama plans it: a new runner, part of the model on the CPU.
rm -f "$DIR/holding" "$DIR/release"
env "$(preload)" python3 "$HERE/probe.py" hold 1280 "$DIR/holding" "$DIR/release" > "$DIR/holder.out" 2> "$DIR/holder.log" &
holder=$!
for _ in $(seq 600); do [ -e "$DIR/holding" ] && break; sleep 0.1; done
say "holder: $(cat "$DIR/holder.out")"
start_serve fail
generate s5-forced "{\"model\":\"vh-a\",$P,\"stream\":false,\"options\":{\"num_predict\":16,\"num_gpu\":99,\"num_ctx\":131072}}"
checkpoint s5-forced
generate s5-planned "{\"model\":\"vh-a\",$P,\"stream\":false,\"options\":{\"num_predict\":16}}"
checkpoint s5-planned
unload vh-a; wait_unloaded
stop_serve
touch "$DIR/release"; wait $holder
say "holder exit $?"

# A process holding only its CUDA context, the reference for "context overhead".
rm -f "$DIR/ctx-ready" "$DIR/ctx-release"
env "$(preload)" python3 "$HERE/probe.py" context "$DIR/ctx-ready" "$DIR/ctx-release" > "$DIR/context.out" 2> "$DIR/context.log" &
ctx=$!
for _ in $(seq 300); do [ -e "$DIR/ctx-ready" ] && break; sleep 0.1; done
sleep 0.5
checkpoint context-only
touch "$DIR/ctx-release"; wait $ctx

# What the driver takes with no memory call once kernels run (warm_probe.cu): a checkpoint at
# each of its pauses reads NVML and vramhook's live bytes for it together.
if [ -x "${WARM_PROBE:-}" ]; then
    rm -f "$DIR"/at-* "$DIR"/go-*
    env "$(preload)" "$WARM_PROBE" "$DIR" "$CUBLAS_LIB" > "$DIR/warm.jsonl" 2> "$DIR/warm.log" &
    wp=$!
    for st in cold stacks cublas; do
        for _ in $(seq 300); do [ -e "$DIR/at-$st" ] && break; kill -0 $wp 2>/dev/null || break; sleep 0.1; done
        sleep 0.5
        checkpoint "warm-$st"
        touch "$DIR/go-$st"
    done
    wait $wp
    say "warm_probe exit $?: $(tr '\n' ' ' < "$DIR/warm.jsonl" | cut -c1-600)"
else
    say "warm_probe: not run: no binary at '${WARM_PROBE:-}'"
fi
say "done"
