#!/usr/bin/env bash
# Builds (once) and caches the real backends the agent's integration tests run
# against on loopback: Jaeger v2, Prometheus 3 and promtool, and the Kubernetes manifest
# checker (k8s-check), in .tools/bin.
# Idempotent: a binary already there at the right version is kept.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN="$PWD/.tools/bin"
mkdir -p "$BIN"
export GOBIN="$BIN"
# Be gentle with a 2-core machine shared with other builds.
export GOFLAGS="${GOFLAGS:--p=1} -buildvcs=false"
export GOMAXPROCS="${GOMAXPROCS:-1}"

JAEGER_VERSION=v1.76.0
PROMETHEUS_VERSION=v0.316.0

build() { # name module version
    local name=$1 module=$2 version=$3 stamp="$BIN/.$1.version"
    if [[ -x "$BIN/$name" && -f "$stamp" && "$(cat "$stamp")" == "$version" ]]; then
        echo "backends: $name $version cached"
        return
    fi
    echo "backends: building $name $version (go install $module@$version)"
    nice -n 10 go install "$module@$version"
    echo "$version" > "$stamp"
}

build promtool github.com/prometheus/prometheus/cmd/promtool "$PROMETHEUS_VERSION"
build prometheus github.com/prometheus/prometheus/cmd/prometheus "$PROMETHEUS_VERSION"
# Jaeger's go.mod has a replace directive, so `go install module@version` refuses it:
# build it as the main module from its downloaded source instead.
build_jaeger() {
    local stamp="$BIN/.jaeger.version"
    if [[ -x "$BIN/jaeger" && -f "$stamp" && "$(cat "$stamp")" == "$JAEGER_VERSION" ]]; then
        echo "backends: jaeger $JAEGER_VERSION cached"
        return
    fi
    echo "backends: building jaeger $JAEGER_VERSION (cmd/jaeger, Jaeger v2)"
    local dir
    dir=$(go mod download -json "github.com/jaegertracing/jaeger@$JAEGER_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [[ -d "$dir" ]] || { echo "backends: cannot download jaeger $JAEGER_VERSION" >&2; exit 1; }
    (cd "$dir" && GOFLAGS="$GOFLAGS -mod=mod" nice -n 10 go build -o "$BIN/jaeger" ./cmd/jaeger)
    echo "$JAEGER_VERSION" > "$stamp"
}
build_jaeger
# Small Go tools of our own, each rebuilt when its source changes.
# dashboard (deploy/grafana/gen): writes and checks the Grafana dashboard with
# grafana-foundation-sdk.
build_go_tool() { # name dir
    local name=$1 dir=$2 stamp="$BIN/.$1.version" version
    version=$(cat "$dir"/main.go "$dir"/go.mod "$dir"/go.sum | sha256sum | cut -c1-16)
    if [[ -x "$BIN/$name" && -f "$stamp" && "$(cat "$stamp")" == "$version" ]]; then
        echo "backends: $name $version cached"
        return
    fi
    echo "backends: building $name $version"
    (cd "$dir" && nice -n 10 go build -o "$BIN/$name" .)
    echo "$version" > "$stamp"
}
build_go_tool dashboard deploy/grafana/gen
# k8s-check (deploy/check/k8s): decodes the Kubernetes manifests strictly into k8s.io/api's types.
build_go_tool k8s-check deploy/check/k8s
# cargo-deb, for the .deb (scripts/package-deb.sh and its test).
CARGO_DEB_VERSION=3.8.0
if [[ -x "$BIN/cargo-deb" && -f "$BIN/.cargo-deb.version" && "$(cat "$BIN/.cargo-deb.version")" == "$CARGO_DEB_VERSION" ]]; then
    echo "backends: cargo-deb $CARGO_DEB_VERSION cached"
else
    echo "backends: installing cargo-deb $CARGO_DEB_VERSION"
    nice -n 10 cargo install cargo-deb --version "$CARGO_DEB_VERSION" --locked --root "$PWD/.tools" --quiet
    echo "$CARGO_DEB_VERSION" > "$BIN/.cargo-deb.version"
fi
# maturin from PyPI, in a virtual environment of its own, for the wheel (scripts/build-wheel.sh).
MATURIN_VERSION=1.16.0
if [[ -x "$PWD/.tools/venv/bin/maturin" && -f "$BIN/.maturin.version" && "$(cat "$BIN/.maturin.version")" == "$MATURIN_VERSION" ]]; then
    echo "backends: maturin $MATURIN_VERSION cached"
else
    echo "backends: installing maturin $MATURIN_VERSION (pip, .tools/venv)"
    python3 -m venv "$PWD/.tools/venv"
    "$PWD/.tools/venv/bin/pip" install --quiet "maturin==$MATURIN_VERSION"
    echo "$MATURIN_VERSION" > "$BIN/.maturin.version"
fi
echo "backends: ready in $BIN"
ls -l "$BIN"
