#!/usr/bin/env bash
# Sets up a new machine for vramhook and runs the main job on a built-in default:
#   - installs the system packages vramhook's build needs (Debian/Ubuntu, apt-get): make, a
#     C compiler, python3, and clang, llvm and libbpf-dev for the eBPF programs;
#   - builds the simulated CUDA driver (tests/simcuda) and vramhook itself (the `vramhook`
#     binary and the interposer `libvramhook.so`, in target/$VRAMHOOK_PROFILE/);
#   - installs them for this user (scripts/install.sh --user: ~/.local/bin/vramhook,
#     ~/.local/share/vramhook/libvramhook.so and the PyTorch lens) and says whether
#     ~/.local/bin is on PATH, with the one line to add when it is not;
#   - traces the demo workload on the simulated driver and analyses its capture.
# The tests' own tools (chromium, tmux, Go and the Go-built backends: Prometheus, promtool,
# Jaeger, cargo-deb, maturin) are not set up here: scripts/test.sh builds them when missing
# and keeps them in .tools/ between runs.
# Env: VRAMHOOK_PROFILE=release|debug (default release), SETUP_NO_INSTALL=1, SETUP_NO_DEMO=1.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
profile="${VRAMHOOK_PROFILE:-release}"
case "$profile" in
    release|debug) ;;
    *) echo "setup: VRAMHOOK_PROFILE must be release or debug, not $profile" >&2; exit 2 ;;
esac

missing=()
command -v make >/dev/null || missing+=(make)
command -v cc >/dev/null || missing+=(gcc)
command -v python3 >/dev/null || missing+=(python3)
# The README's recipes read the agent's /metrics with curl.
command -v curl >/dev/null || missing+=(curl)
# eBPF mode: the BPF programs are built by clang against the libbpf headers.
command -v clang >/dev/null || missing+=(clang)
command -v llvm-strip >/dev/null || missing+=(llvm)
[ -f /usr/include/bpf/bpf_helpers.h ] || missing+=(libbpf-dev)
. scripts/lib/apt.sh
install_missing setup ${missing[@]+"${missing[@]}"}
command -v cargo >/dev/null || { echo "setup: Rust is required (cargo not found; see https://rustup.rs)" >&2; exit 1; }
. scripts/lib/toolchain.sh
pin_toolchain

make -s -C tests/simcuda
# Only the CLI and the interposer: the tests build the rest (scripts/test.sh).
if [ "$profile" = release ]; then
    cargo build --release -p vramhook -p vramhook-interposer
else
    cargo build -p vramhook -p vramhook-interposer
fi
bin="$root/target/$profile/vramhook"
lib="$root/target/$profile/libvramhook.so"
echo "setup: built $bin and $lib"

if [ "${SETUP_NO_INSTALL:-0}" != 1 ]; then
    scripts/install.sh --user --from "target/$profile"
fi

if [ "${SETUP_NO_DEMO:-0}" != 1 ]; then
    mkdir -p target/demo
    echo
    echo "== vramhook demo: a PyTorch-style caching allocator on the simulated CUDA driver, traced"
    "$bin" demo --record target/demo/vramhook-demo.vhc
    echo
    echo "== vramhook analyze target/demo/vramhook-demo.vhc"
    "$bin" analyze target/demo/vramhook-demo.vhc --html target/demo/report.html
    echo
    echo "setup: done. The demo's HTML report is target/demo/report.html; run the tests with scripts/test.sh"
fi
