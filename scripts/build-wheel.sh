#!/usr/bin/env bash
# Builds the Python wheel with maturin (pip install maturin):
#   scripts/build-wheel.sh [--profile release|dev] [--out DIR] [--no-build]  -> DIR/vramhook-*.whl
# The wheel carries bin/vramhook (maturin, bindings = "bin") and, as wheel data installed
# under the environment's prefix, share/vramhook/libvramhook.so and share/vramhook/lens/
# (the PyTorch lens: lens/ of this tree when it exists). Serialised with a lock: two
# builds share target/wheel-data.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=release
out=target/wheels
build=1
while (($#)); do
    case "$1" in
        --profile) profile="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --no-build) build=0; shift ;;
        *) echo "build-wheel.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
maturin=${MATURIN:-$(command -v maturin || echo .tools/venv/bin/maturin)}
[ -x "$maturin" ] || { echo "build-wheel.sh: maturin not found (pip install maturin, or scripts/lib/backends.sh)" >&2; exit 1; }
dir=$([ "$profile" = dev ] && echo debug || echo "$profile")
mkdir -p target "$out"
exec 9>target/.wheel.lock
flock 9
if [ "$build" = 1 ]; then
    cargo build --profile "$profile" -p vramhook -p vramhook-interposer
fi
[ -f "target/$dir/libvramhook.so" ] || { echo "build-wheel.sh: target/$dir/libvramhook.so missing (build without --no-build)" >&2; exit 1; }
share=target/wheel-data/data/share/vramhook
rm -rf target/wheel-data
mkdir -p "$share"
install -m 0755 "target/$dir/libvramhook.so" "$share/libvramhook.so"
if [ -d lens ]; then
    cp -r lens "$share/lens"
    find "$share/lens" -name __pycache__ -prune -exec rm -rf {} +
fi
# Not a manylinux audit: the binary needs the glibc it was built against (a wheel for
# this machine's kind of Linux, like the .deb), so the tag is plain linux.
"$maturin" build --profile "$profile" --strip --compatibility linux --out "$out" ${MATURIN_QUIET:+--quiet}
