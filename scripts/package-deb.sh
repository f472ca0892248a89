#!/usr/bin/env bash
# Builds the Debian package with cargo-deb (cargo install cargo-deb --locked):
#   scripts/package-deb.sh [--profile release|dev] [--no-build]   -> target/deb/vramhook_*.deb
# The units and the drop-in are staged with the Debian paths (/usr/bin/vramhook,
# /usr/lib/vramhook/libvramhook.so) instead of install.sh's /usr/local and /opt.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=release
build=1
while (($#)); do
    case "$1" in
        --profile) profile="$2"; shift 2 ;;
        --no-build) build=0; shift ;;
        *) echo "package-deb.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
cargo_deb=$(command -v cargo-deb || echo .tools/bin/cargo-deb)
[ -x "$cargo_deb" ] || { echo "package-deb.sh: cargo-deb not found (cargo install cargo-deb --locked)" >&2; exit 1; }
if [ "$build" = 1 ]; then
    cargo build --profile "$profile" -p vramhook -p vramhook-interposer
fi
staging=target/deb/staging
mkdir -p "$staging"
for f in vramhook-agent.service vramhook-agent@.service ollama-vramhook.conf; do
    sed -e 's|/usr/local/bin/vramhook|/usr/bin/vramhook|g' \
        -e 's|/opt/vramhook/libvramhook.so|/usr/lib/vramhook/libvramhook.so|g' \
        -e 's|scripts/install.sh (binary, library, units, /etc/default/vramhook), then|apt install ./vramhook_*.deb, then|' \
        "deploy/systemd/$f" >"$staging/$f"
done
"$cargo_deb" -p vramhook --no-build --no-strip --profile "$profile" -o target/deb/
