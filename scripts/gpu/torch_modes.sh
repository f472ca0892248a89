# Sourced by the GPU scripts: PyTorch's three allocator modes, by the names the scripts and
# their reports use.
# torch_alloc_conf MODE: the PYTORCH_CUDA_ALLOC_CONF of MODE (default, expandable, async).
torch_alloc_conf() {
    case $1 in
        default) echo "" ;;
        expandable) echo "expandable_segments:True" ;;
        async) echo "backend:cudaMallocAsync" ;;
        *) echo "torch_alloc_conf: unknown mode $1" >&2; return 1 ;;
    esac
}
