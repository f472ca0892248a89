# Sourced by scripts/bench/calls.sh and scripts/bench/pair.sh: the settings both share, the
# interposer library checked, the simulated driver built (SIM_SKIP_BUILD=1: use
# tests/simcuda/build as it is; the GPU machine has no make) and put first on the loader's
# path. Sets ROOT, LIB, ITERS, THREADS, NCPU, CPU, and BENCH: the workload the caller names
# itself after in BENCH_NAME (bench-calls: tests/simcuda/build/workloads/bench_calls).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
LIB="${VRAMHOOK_LIB:-target/release/libvramhook.so}"
case "$LIB" in /*) ;; *) LIB="$ROOT/$LIB" ;; esac
BENCH="$ROOT/tests/simcuda/build/workloads/${BENCH_NAME//-/_}"
ITERS="${BENCH_ITERS:-20000}"
THREADS="${BENCH_THREADS:-1 16}"
NCPU="$(nproc)"
CPU="${BENCH_CPU:-$((NCPU - 1))}"
if [ ! -f "$LIB" ]; then
    echo "############################################################" >&2
    echo "## $BENCH_NAME: interposer library NOT FOUND: $LIB" >&2
    echo "## build it (cargo build --release) or set VRAMHOOK_LIB" >&2
    echo "############################################################" >&2
    exit 1
fi
[ "${SIM_SKIP_BUILD:-0}" = 1 ] || make -s -C "$ROOT/tests/simcuda" -j2 all
# The simulated libcuda.so.1 before any other: on a GPU machine LD_LIBRARY_PATH names the
# real driver's folder, which the loader searches before a benchmark's RUNPATH (the
# "simulated" figures of earlier H200 runs were the real driver's for that reason).
export LD_LIBRARY_PATH="$ROOT/tests/simcuda/build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
