#!/usr/bin/env bash
# Builds (once) and caches the real backends the agent's integration tests run
# against on loopback: Jaeger v2, Prometheus 3 and promtool, in .tools/bin.
# Idempotent: a binary already there at the right version is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
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
        echo "ci-backends: $name $version cached"
        return
    fi
    echo "ci-backends: building $name $version (go install $module@$version)"
    nice -n 10 go install "$module@$version"
    echo "$version" > "$stamp"
}

build promtool github.com/prometheus/prometheus/cmd/promtool "$PROMETHEUS_VERSION"
build prometheus github.com/prometheus/prometheus/cmd/prometheus "$PROMETHEUS_VERSION"
build jaeger github.com/jaegertracing/jaeger/cmd/jaeger "$JAEGER_VERSION"
echo "ci-backends: ready in $BIN"
ls -l "$BIN"
