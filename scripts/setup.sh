#!/usr/bin/env bash
# Sets up a new machine and runs the main job on a built-in default:
#   - installs the system packages the tools and tests need (Debian/Ubuntu, apt-get);
#   - builds the real OTLP backends the agent's tests use (Jaeger v2, Prometheus 3, with go install);
#   - builds the simulated CUDA driver (tests/simcuda) and vramhook itself;
#   - traces the demo workload on the simulated driver and analyses its capture.
# Env: VRAMHOOK_PROFILE=release|debug (default release), SETUP_SKIP_BACKENDS=1, SETUP_NO_DEMO=1.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
profile="${VRAMHOOK_PROFILE:-release}"

missing=()
command -v make >/dev/null || missing+=(make)
command -v cc >/dev/null || missing+=(gcc)
command -v python3 >/dev/null || missing+=(python3)
command -v chromium >/dev/null || missing+=(chromium)
command -v tmux >/dev/null || missing+=(tmux)
command -v go >/dev/null || missing+=(golang-go)
command -v systemd-analyze >/dev/null || missing+=(systemd)
# eBPF mode: the BPF programs are built by clang against the libbpf headers.
command -v clang >/dev/null || missing+=(clang)
command -v llvm-strip >/dev/null || missing+=(llvm)
[ -f /usr/include/bpf/bpf_helpers.h ] || missing+=(libbpf-dev)
if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
command -v cargo >/dev/null || { echo "setup: Rust is required (cargo not found; see https://rustup.rs)" >&2; exit 1; }

[ "${SETUP_SKIP_BACKENDS:-0}" = 1 ] || scripts/ci-backends.sh

make -s -C tests/simcuda
if [ "$profile" = release ]; then
    cargo build --release --workspace
else
    cargo build --workspace
fi

if [ "${SETUP_NO_DEMO:-0}" != 1 ]; then
    mkdir -p target/demo
    bin="$root/target/$profile/vramhook"
    echo
    echo "== vramhook demo: a PyTorch-style caching allocator on the simulated CUDA driver, traced"
    "$bin" demo --record target/demo/vramhook-demo.vhc
    echo
    echo "== vramhook analyze target/demo/vramhook-demo.vhc"
    "$bin" analyze target/demo/vramhook-demo.vhc --html target/demo/report.html
    echo
    echo "setup: done. The demo's HTML report is target/demo/report.html; run the tests with scripts/test.sh"
fi
