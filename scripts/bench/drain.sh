#!/usr/bin/env bash
# `vramhook run` versus `vramhook agent` draining the same sustained load, side by side:
# DRAIN_PROCS processes (64) of threads16 --threads DRAIN_THREADS (16) --iters DRAIN_ITERS,
# default rings, DRAIN_ROUNDS interleaved rounds (run, agent, run, agent, ...). Prints, per
# round (each writing a capture to $TMPDIR: run --record, agent --capture-dir), events kept (delivered, process start/exit records included) and dropped as each
# reported them, the kept %, and the
# ratio run/agent. Needs the release build (scripts/bench/run.sh builds it) and jq, curl.
# DRAIN_BASELINE_BIN=/path/to/an/older/vramhook adds a third mode per round, `base`: that
# binary's `run` (to measure a change to `run` against the agent in the same rounds).
set -euo pipefail
cd "$(dirname "$0")/../.."
profile=${DRAIN_PROFILE:-release}
bin=target/$profile/vramhook
lib=target/$profile/libvramhook.so
procs=${DRAIN_PROCS:-64} threads=${DRAIN_THREADS:-16} iters=${DRAIN_ITERS:-2000} rounds=${DRAIN_ROUNDS:-3}
make -s -C tests/simcuda
wl="$PWD/tests/simcuda/build/workloads/threads16"
# The reader (run or agent) gets a CPU of its own, the last one, and the writers the
# others (DRAIN_PIN=0 turns this off): with 1024 writer threads on a few cores, a reader
# scheduled among them gets a thousandth of the CPU and both modes keep only what the
# rings hold (64 x 65536 slots), which compares nothing. A host with cores to spare is
# the production case this stands for.
ncpu=$(nproc)
if [ "${DRAIN_PIN:-1}" = 1 ] && [ "$ncpu" -ge 2 ]; then
    reader_pin=(taskset -c $((ncpu - 1)))
    writers="taskset -c 0-$((ncpu - 2))"
else
    reader_pin=() writers=""
fi
load="for i in \$(seq $procs); do $writers $wl --threads $threads --iters $iters >/dev/null & done; wait"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "drain: $procs processes x $threads threads x $iters iterations, default rings, $rounds rounds ($profile build)"
printf '%-6s %-6s %12s %12s %8s\n' round mode kept dropped kept%
base=${DRAIN_BASELINE_BIN:-}
base_kept=0 base_drop=0
pct() { awk -v k="$1" -v d="$2" 'BEGIN { printf "%.2f", (k + d) ? 100 * k / (k + d) : 0 }'; }
run_kept=0 run_drop=0 agent_kept=0 agent_drop=0
# One `vramhook run` of the load with binary $2 (both with this build's libvramhook.so), as
# mode $1 of round $r: prints its row and sets k (kept) and d (dropped).
traced_run() {
    local mode=$1 runner=$2 dir
    dir=$(mktemp -d /dev/shm/vramhook-drain.XXXXXX)
    VRAMHOOK_LIB="$PWD/$lib" "${reader_pin[@]}" "$runner" run --quiet --ring-dir "$dir" --record "$tmp/$mode.vhc" \
        --summary-json "$tmp/$mode.json" -- sh -c "$load"
    k=$(jq '.events' "$tmp/$mode.json")
    d=$(jq '[.processes[].dropped_events] | add // 0' "$tmp/$mode.json")
    printf '%-6s %-6s %12d %12d %8s\n' "$r" "$mode" "$k" "$d" "$(pct "$k" "$d")"
    rm -rf "$dir" "$tmp/$mode.vhc"
}
for r in $(seq "$rounds"); do
    if [ -n "$base" ]; then
        traced_run base "$base"
        base_kept=$((base_kept + k)) base_drop=$((base_drop + d))
    fi
    traced_run run "$bin"
    run_kept=$((run_kept + k)) run_drop=$((run_drop + d))

    dir=$(mktemp -d /dev/shm/vramhook-drain.XXXXXX)
    rm -rf "$tmp/captures"
    : >"$tmp/agent.log" # exists before the background agent's redirection does (sed below reads it at once)
    "${reader_pin[@]}" "$bin" agent --ring-dir "$dir" --listen 127.0.0.1:0 --no-recover --capture-dir "$tmp/captures" 2>"$tmp/agent.log" &
    apid=$!
    until addr=$(sed -n 's/^vramhook agent: listening on //p' "$tmp/agent.log") && [ -n "$addr" ]; do sleep 0.1; done
    LD_PRELOAD="$PWD/$lib" VRAMHOOK_DIR="$dir" sh -c "$load"
    # Drained: every ring file gone (closed rings are removed) and none open.
    for _ in $(seq 600); do
        [ -z "$(ls -A "$dir")" ] && [ "$(curl -s "http://$addr/api/v1/state" | jq '.agent.rings_open')" = 0 ] && break
        sleep 0.2
    done
    [ -z "$(ls -A "$dir")" ] || echo "agent: rings still there after 120 s: $(ls "$dir" | head -3)" >&2
    curl -s "http://$addr/api/v1/state" >"$tmp/state.json"
    kill -TERM "$apid"; wait "$apid" || true
    k=$(jq '.agent.events_ingested' "$tmp/state.json")
    d=$(jq '[.snapshot.processes[].dropped_events] | add // 0' "$tmp/state.json")
    agent_kept=$((agent_kept + k)) agent_drop=$((agent_drop + d))
    printf '%-6s %-6s %12d %12d %8s\n' "$r" agent "$k" "$d" "$(pct "$k" "$d")"
    rm -rf "$dir" "$tmp/captures"
done
rp=$(pct $run_kept $run_drop) ap=$(pct $agent_kept $agent_drop)
if [ -n "$base" ]; then
    bp=$(pct $base_kept $base_drop)
    echo "total  base   $base_kept kept, $base_drop dropped: $bp %"
    awk -v b="$bp" -v a="$ap" 'BEGIN { printf "base/agent kept ratio: %.3f\n", (a > 0) ? b / a : 0 }'
fi
echo "total  run    $run_kept kept, $run_drop dropped: $rp %"
echo "total  agent  $agent_kept kept, $agent_drop dropped: $ap %"
awk -v r="$rp" -v a="$ap" 'BEGIN { printf "run/agent kept ratio: %.3f\n", (a > 0) ? r / a : 0 }'
