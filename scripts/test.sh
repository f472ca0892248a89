#!/usr/bin/env bash
# Runs all the tests: formatting and lints, the simulated driver's self-test, and the
# workspace's tests (unit, property, corruption, end to end through the simulated CUDA
# driver, real Jaeger and Prometheus on loopback, headless Chromium, the README's recipes).
# Run scripts/setup.sh once first (it builds vramhook and the simulated driver).
# What only the tests need is set up here when missing: chromium, tmux, Go and systemd's
# tools (apt-get), and the Go-built backends and packagers (scripts/lib/backends.sh:
# Prometheus, promtool, Jaeger, k8s-check, cargo-deb, maturin), built once and cached in
# .tools/ between runs (a second run builds nothing). TEST_SKIP_BACKENDS=1 skips them:
# their tests then say "not run".
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
command -v chromium >/dev/null || missing+=(chromium)
command -v tmux >/dev/null || missing+=(tmux)
command -v go >/dev/null || missing+=(golang-go)
command -v systemd-analyze >/dev/null || missing+=(systemd)
command -v curl >/dev/null || missing+=(curl)
. scripts/lib/apt.sh
install_missing test ${missing[@]+"${missing[@]}"}
. scripts/lib/toolchain.sh
pin_toolchain
[ "${TEST_SKIP_BACKENDS:-0}" = 1 ] || scripts/lib/backends.sh
make -s -C tests/simcuda
cargo fmt --all -- --check
cargo build --workspace --all-targets
cargo clippy --workspace --all-targets -- -D warnings
bash tests/simcuda/selftest.sh
# The checkers' self-tests: each judge of a result (the benchmark summary's targets, the
# GPU runs' checkers) must fail on a made-up run that is wrong (a wrong verdict misleads).
python3 scripts/bench/pair_summary_test.py
python3 scripts/gpu/ollama/check_selftest.py
python3 scripts/gpu/pools/pools_check_selftest.py
python3 scripts/gpu/fit/check_selftest.py
# Every prepare step that can run here works into an empty folder, the first time and again
# (scripts/gpu/ollama/prepare.sh needs ollama's fetched source: checked by hand).
prepare_twice() { # script, then the files it must leave
    local script=$1 out
    shift
    out=$(mktemp -d)
    for round in 1 2; do
        VRAMHOOK_GPU_OUT="$out/gpu" bash "$script" > "$out/log" 2>&1 \
            || { cat "$out/log"; echo "test: $script failed (round $round)" >&2; exit 1; }
    done
    for f in "$@"; do
        [ -s "$out/gpu/$f" ] || { echo "test: $script left no $f" >&2; exit 1; }
    done
    rm -rf "$out"
    echo "test: $script twice into an empty folder: ok"
}
prepare_twice scripts/gpu/bench-prepare.sh libvramhook.so
prepare_twice scripts/gpu/prepare.sh vramhook libvramhook.so libvramhook-parts.so bench_pair bench_model bench_replay bench_agent
# Tests that cannot run here (no root, no mounts) say "not run: <reason>" and are listed
# below; cargo would count them as passed. Under CI (root) such a test fails instead.
not_run_log=$(mktemp)
trap 'rm -f "$not_run_log"' EXIT
export VRAMHOOK_NOT_RUN_LOG="$not_run_log"
status=0
cargo test --workspace --no-fail-fast || status=$?
if [ -s "$not_run_log" ]; then
    echo
    echo "== $(sort -u "$not_run_log" | wc -l) test(s) NOT RUN (cargo counted them as passed; they did not run):"
    sort -u "$not_run_log"
fi
exit "$status"
