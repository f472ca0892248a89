# Sourced by the GPU scripts, which run from the repository root.

# Every Python program they run: unbuffered output, and NVLink multicast off (the GPU machines
# lent for these runs ask for it off: NCCL, PyTorch and NVSHMEM each have their own switch).
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

# use_gpu_build [--lens]: BIN and VRAMHOOK_LIB from .gpu/ (scripts/gpu/prepare.sh puts this
# tree's release build there), with --lens the lens from lens/; exits when they are missing.
use_gpu_build() {
    BIN="$PWD/.gpu/vramhook"
    export VRAMHOOK_LIB="$PWD/.gpu/libvramhook.so"
    [ "${1:-}" = --lens ] && export VRAMHOOK_LENS_DIR="$PWD/lens"
    [ -x "$BIN" ] && [ -f "$VRAMHOOK_LIB" ] \
        || { echo "MISSING .gpu/vramhook or .gpu/libvramhook.so: run scripts/gpu/prepare.sh here first" >&2; exit 1; }
}

# gpu_run_start NAME OUTDIR [--lens]: how a GPU run script starts: OUT, the folder for its
# files (OUTDIR, else $OUT, else /tmp/vramhook-NAME), made; then use_gpu_build.
gpu_run_start() {
    OUT="${2:-${OUT:-/tmp/vramhook-$1}}"
    mkdir -p "$OUT"
    use_gpu_build "${3:-}"
}

# gpu_versions MODULE...: the GPU (name, driver, memory) and each Python MODULE's version,
# the lines of a run's env file.
gpu_versions() {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    local m
    for m in "$@"; do
        python3 -c "import $m; print('$m', $m.__version__)"
    done
}

# agent_state PORT: the state the agent listening on 127.0.0.1:PORT serves now, as JSON
# (Python, since the GPU machines need not have curl).
agent_state() {
    python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())' \
        "http://127.0.0.1:$1/api/v1/state"
}

# torch_alloc_conf MODE: the PYTORCH_CUDA_ALLOC_CONF of PyTorch's allocator mode MODE
# (default, expandable, async), by the names the scripts and their reports use.
torch_alloc_conf() {
    case $1 in
        default) echo "" ;;
        expandable) echo "expandable_segments:True" ;;
        async) echo "backend:cudaMallocAsync" ;;
        *) echo "torch_alloc_conf: unknown mode $1" >&2; return 1 ;;
    esac
}
