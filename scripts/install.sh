#!/usr/bin/env bash
# Installs vramhook on this host, or removes it again. Idempotent: running it twice changes
# nothing the second time; files an admin edited (the settings in /etc/default) are kept.
#
#   scripts/install.sh [--from DIR] [--destdir DIR]     install (builds target/release first
#                                                       when DIR has no binaries)
#   scripts/install.sh --uninstall [--destdir DIR]      remove what install put in place
#
# What goes where (the paths the units, the DaemonSet and the README use):
#   /usr/local/bin/vramhook                       the CLI and agent
#   /opt/vramhook/libvramhook.so                  the interposer (LD_PRELOAD)
#   /etc/systemd/system/vramhook-agent.service    agent for root's traced processes
#   /etc/systemd/system/vramhook-agent@.service   agent for one user's (vramhook-agent@USER)
#   /etc/default/vramhook                         the agent's settings (kept if present)
#   /usr/local/share/vramhook/                    drop-in for tracing a service, env example
# --destdir stages the tree under DIR instead of / (packaging, tests); systemctl is then
# not called.
set -euo pipefail
cd "$(dirname "$0")/.."
from=target/release
destdir=""
mode=install
while (($#)); do
    case "$1" in
        --from) from="$2"; shift 2 ;;
        --destdir) destdir="${2%/}"; shift 2 ;;
        --uninstall) mode=uninstall; shift ;;
        -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
        *) echo "install.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

bin="$destdir/usr/local/bin/vramhook"
lib="$destdir/opt/vramhook/libvramhook.so"
units="$destdir/etc/systemd/system"
env_file="$destdir/etc/default/vramhook"
share="$destdir/usr/local/share/vramhook"
changed=0

systemctl_maybe() {
    # Only on the real root, and only where systemd runs.
    if [ -z "$destdir" ] && [ -d /run/systemd/system ]; then systemctl "$@"; fi
}

# Copies $1 to $2 with mode $3 unless $2 already holds the same bytes.
put() {
    if [ -f "$2" ] && cmp -s "$1" "$2"; then return; fi
    install -D -m "$3" "$1" "$2"
    echo "installed $2"
    changed=1
}

if [ "$mode" = uninstall ]; then
    systemctl_maybe disable --now vramhook-agent.service 2>/dev/null || true
    for f in "$bin" "$lib" "$units/vramhook-agent.service" "$units/vramhook-agent@.service" \
        "$share/ollama-vramhook.conf" "$share/vramhook.env"; do
        if [ -e "$f" ]; then rm -f "$f"; echo "removed $f"; fi
    done
    rmdir "$destdir/opt/vramhook" "$share" 2>/dev/null || true
    # The settings file is the admin's: removed only if it is still the shipped default.
    if [ -f "$env_file" ] && cmp -s deploy/systemd/vramhook.env "$env_file"; then
        rm -f "$env_file"; echo "removed $env_file"
    elif [ -f "$env_file" ]; then
        echo "kept $env_file (edited)"
    fi
    systemctl_maybe daemon-reload
    exit 0
fi

if [ ! -x "$from/vramhook" ] || [ ! -f "$from/libvramhook.so" ]; then
    [ "$from" = target/release ] || { echo "install.sh: no vramhook and libvramhook.so in $from" >&2; exit 1; }
    echo "install.sh: building target/release"
    cargo build --release -p vramhook -p vramhook-interposer
fi
put "$from/vramhook" "$bin" 0755
put "$from/libvramhook.so" "$lib" 0755
put deploy/systemd/vramhook-agent.service "$units/vramhook-agent.service" 0644
put deploy/systemd/vramhook-agent@.service "$units/vramhook-agent@.service" 0644
put deploy/systemd/ollama-vramhook.conf "$share/ollama-vramhook.conf" 0644
put deploy/systemd/vramhook.env "$share/vramhook.env" 0644
if [ ! -f "$env_file" ]; then
    put deploy/systemd/vramhook.env "$env_file" 0644
fi
if [ "$changed" = 1 ]; then
    systemctl_maybe daemon-reload
    echo "install.sh: done. Start the agent with: systemctl enable --now vramhook-agent"
else
    echo "install.sh: already installed, nothing changed"
fi
