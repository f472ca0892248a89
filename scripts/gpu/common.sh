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
