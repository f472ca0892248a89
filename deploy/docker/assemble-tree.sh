#!/usr/bin/env bash
# Performs the runtime stage of deploy/docker/Dockerfile on a directory: the same files at
# the same paths, the same user, and the entrypoint as a script. No registry serves base
# images here, so CI checks the image this way (tests/safety/tests/deploy.rs).
#   deploy/docker/assemble-tree.sh TREE BUILD_DIR
set -euo pipefail
tree="$1"
build="$2"
install -D -m 0755 "$build/vramhook" "$tree/usr/local/bin/vramhook"
install -D -m 0755 "$build/libvramhook.so" "$tree/opt/vramhook/libvramhook.so"
mkdir -p "$tree/etc"
echo "vramhook:x:65532:65532::/nonexistent:/usr/sbin/nologin" >>"$tree/etc/passwd"
echo "vramhook:x:65532:" >>"$tree/etc/group"
# ENTRYPOINT and CMD, as the image runs them (USER 65532:65532).
cat >"$tree/entrypoint" <<EOS
#!/bin/sh
[ \$# -gt 0 ] || set -- agent --listen 0.0.0.0:9464
exec "$tree/usr/local/bin/vramhook" "\$@"
EOS
chmod 0755 "$tree/entrypoint"
