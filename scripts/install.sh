#!/usr/bin/env bash
# Installs vramhook on this host, or removes it again. Idempotent: running it twice changes
# nothing the second time; files an admin edited (the settings in /etc/default) are kept.
#
#   scripts/install.sh [--from DIR] [--destdir DIR]     install (builds target/release first
#                                                       when DIR has no binaries)
#   scripts/install.sh --uninstall [--destdir DIR]      remove what install put in place
#   scripts/install.sh --user [--from DIR] [--uninstall]
#                                                       for this user only, no root, no units:
#       ~/.local/bin/vramhook                         the CLI and agent
#       ~/.local/share/vramhook/libvramhook.so        the interposer (`vramhook run` finds it)
#       ~/.local/share/vramhook/lens/                 the PyTorch lens (`vramhook lens-dir`)
#     and says whether ~/.local/bin is on PATH, with the line to add when it is not.
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
user=0
while (($#)); do
    case "$1" in
        --from) from="$2"; shift 2 ;;
        --destdir) destdir="${2%/}"; shift 2 ;;
        --uninstall) mode=uninstall; shift ;;
        --user) user=1; shift ;;
        -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
        *) echo "install.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

if [ "$user" = 1 ]; then
    [ -z "$destdir" ] || { echo "install.sh: --user and --destdir do not go together" >&2; exit 2; }
    ubin="$HOME/.local/bin"
    ushare="$HOME/.local/share/vramhook"
    if [ "$mode" = uninstall ]; then
        for f in "$ubin/vramhook" "$ushare/libvramhook.so"; do
            if [ -e "$f" ]; then rm -f "$f"; echo "removed $f"; fi
        done
        if [ -d "$ushare/lens" ]; then rm -rf "$ushare/lens"; echo "removed $ushare/lens"; fi
        rmdir "$ushare" 2>/dev/null || true
        exit 0
    fi
    if [ ! -x "$from/vramhook" ] || [ ! -f "$from/libvramhook.so" ]; then
        echo "install.sh: no vramhook and libvramhook.so in $from (build them: cargo build --release -p vramhook -p vramhook-interposer)" >&2
        exit 1
    fi
    mkdir -p "$ubin" "$ushare/lens"
    # Through a temporary name and a rename: a vramhook running from there keeps its file.
    install -m 0755 "$from/vramhook" "$ubin/.vramhook.new" && mv -f "$ubin/.vramhook.new" "$ubin/vramhook"
    install -m 0755 "$from/libvramhook.so" "$ushare/.libvramhook.so.new" && mv -f "$ushare/.libvramhook.so.new" "$ushare/libvramhook.so"
    rm -rf "$ushare/lens.new"
    mkdir -p "$ushare/lens.new"
    cp -R lens/sitecustomize.py lens/vramhook_lens "$ushare/lens.new/"
    find "$ushare/lens.new" -name __pycache__ -prune -exec rm -rf {} +
    rm -rf "$ushare/lens" && mv "$ushare/lens.new" "$ushare/lens"
    echo "installed $ubin/vramhook"
    echo "installed $ushare/libvramhook.so"
    echo "installed $ushare/lens/"
    case ":$PATH:" in
        *":$ubin:"*) echo "install.sh: $ubin is on your PATH: run vramhook --version" ;;
        *)
            echo "install.sh: $ubin is not on your PATH. Add it (then open a new shell):"
            echo "    echo 'export PATH=\"\$HOME/.local/bin:\$PATH\"' >> ~/.bashrc"
            echo "or run it as $ubin/vramhook" ;;
    esac
    exit 0
fi

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
