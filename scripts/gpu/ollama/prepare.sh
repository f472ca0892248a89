#!/usr/bin/env bash
# On the development machine: what scripts/gpu/ollama/run.sh needs in .gpu/ (ignored by git).
# ollama v0.24.0 from the fetched repository (github:ollama/ollama, bare git dir in $OLLAMA_GIT),
# exported file by file (two test-data blobs are missing from the fetch, so `git archive` fails)
# to $OLLAMA_SRC outside this repository, built with Go (its modules from the Go proxy) and
# stripped; ggml's sources for the CUDA build on the GPU machine; the `gguf` wheel; vramhook.
set -euo pipefail
cd "$(dirname "$0")/../../.."
OLLAMA_GIT=${OLLAMA_GIT:-/work/.mirror/ollama+ollama/repo}
OLLAMA_SRC=${OLLAMA_SRC:-/work/ollama-src}
G=.gpu/ollama
mkdir -p "$G"
if [ ! -f "$OLLAMA_SRC/go.mod" ]; then
    mkdir -p "$OLLAMA_SRC"
    git --git-dir="$OLLAMA_GIT" ls-tree -r v0.24.0 | while read -r mode type sha path; do
        [ "$type" = blob ] || continue
        mkdir -p "$OLLAMA_SRC/$(dirname "$path")"
        if [ "$mode" = 120000 ]; then ln -sf "$(git --git-dir="$OLLAMA_GIT" cat-file blob "$sha")" "$OLLAMA_SRC/$path"; continue; fi
        git --git-dir="$OLLAMA_GIT" cat-file blob "$sha" > "$OLLAMA_SRC/$path" 2>/dev/null || { echo "missing blob: $path"; rm -f "$OLLAMA_SRC/$path"; continue; }
        # (an `if`: a bare `[ … ] && chmod` ends the loop with status 1 on the last file when
        # that file is not executable, and `set -e` stopped the script there on a fresh machine)
        if [ "$mode" = 100755 ]; then chmod +x "$OLLAMA_SRC/$path"; fi
    done
fi
(cd "$OLLAMA_SRC" && CGO_ENABLED=1 go build -trimpath -ldflags='-s -w -X=github.com/ollama/ollama/version.Version=0.24.0' -o "$OLLAMA_SRC/ollama" .)
gzip -9c "$OLLAMA_SRC/ollama" > "$G/ollama.gz"
tar -C "$OLLAMA_SRC" -czf "$G/ggml-src.tar.gz" CMakeLists.txt ml/backend/ggml/ggml
python3 -m pip download -q --no-deps -d "$G" gguf==0.19.0
# warm_probe: run.sh builds it on the GPU machine; a copy built here (where an nvcc is on the
# PATH: the nvidia-cuda-nvcc wheels do) is its fallback.
if command -v nvcc > /dev/null; then
    nvcc -O2 -arch=sm_90 -o "$G/warm_probe" scripts/gpu/ollama/warm_probe.cu -ldl
fi
cargo build --release -p vramhook -p vramhook-interposer
strip -o .gpu/vramhook target/release/vramhook
strip -o .gpu/libvramhook.so target/release/libvramhook.so
ls -la .gpu "$G"
echo "then, on the GPU machine: run.sh build (once; put its ggml-libs.tar.xz in $G), run.sh scenarios"
