#!/usr/bin/env bash
# On the GPU machine: build ollama v0.24.0's vendored ggml CUDA backend (and ggml-base, which
# it links) for sm_90 only, from .gpu/ollama/ggml-src.tar.gz (made by prepare.sh here), and
# leave ollama's library layout in .gpu/ollama/lib/ollama/ plus a copy in OUTDIR to carry.
#   bash scripts/gpu/ollama/build-cuda.sh OUTDIR
set -euo pipefail
OUT="${1:-${OUT:-/tmp/vramhook-ollama}}"
mkdir -p "$OUT"
SRC=/tmp/ollama-ggml
rm -rf "$SRC"; mkdir -p "$SRC"
tar -xzf .gpu/ollama/ggml-src.tar.gz -C "$SRC"
{ nvcc --version | tail -2; cmake --version | head -1; nproc; } | tee "$OUT/build-env.txt"
t0=$SECONDS
cmake -S "$SRC" -B "$SRC/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90-real \
    -DCMAKE_POLICY_VERSION_MINIMUM=3.5 -DCMAKE_DISABLE_FIND_PACKAGE_Vulkan=ON > "$SRC/configure.log" 2>&1 \
    || { tail -40 "$SRC/configure.log"; exit 1; }
echo "configured in $((SECONDS - t0)) s"
cmake --build "$SRC/build" --target ggml-cuda -j "$(nproc)" > "$SRC/build.log" 2>&1 || { tail -60 "$SRC/build.log"; exit 1; }
echo "ggml-cuda built in $((SECONDS - t0)) s"
L=.gpu/ollama/lib/ollama
rm -rf "$L"; mkdir -p "$L/cuda_v13"
cp -a "$SRC"/build/lib/ollama/libggml-base.so* "$L/"
cp -a "$SRC"/build/lib/ollama/libggml-cuda.so* "$L/cuda_v13/"
find "$L" -type f -name "*.so*" -exec strip --strip-unneeded {} +
ls -laR "$L"
tar -C .gpu/ollama -cJf "$OUT/ggml-libs.tar.xz" lib
ls -la "$OUT"
