/* ollama_backend: the stand-in for ggml's CUDA backend (libggml-cuda.so), which ollama's
 * runner loads at run time with dlopen. Like the real one (measured on the H200, issue #12),
 * it takes tensors through the shared cudart (weights, KV cache, compute buffer, cuBLAS's
 * 64 MiB workspace and a small one), a stream-ordered allocation that cuBLAS makes and frees,
 * and a VMM pool through libcuda directly: reserve 32 GiB, then 2 MiB pieces created, mapped
 * and released at once. */
#include "common.h"
#include "sim_cuda.h"
#include "sim_cuda_runtime.h"
#include "vmm.h"

#define EXPORT __attribute__((visibility("default")))

/* Discovery: what ollama's discovery children do (device count and properties, free memory
 * through NVML): no CUDA memory function. */
EXPORT int backend_devices(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) return -1;
    return n;
}

/* Loads a model: `gpu_mib` of weights on the GPU. 0 on success; on an OOM, ggml's message
 * and 2 (the real runner then crashes: "signal arrived during cgo execution", exit 2). */
EXPORT int backend_load(uint64_t gpu_mib, uint64_t *checksum) {
    if (cudaSetDevice(0) != cudaSuccess) return 1;
    const size_t sizes[] = {gpu_mib * MiB, 64 * MiB /* KV */, 68 * MiB /* compute */, 64 * MiB /* cuBLAS */, 1024};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        void *p = NULL;
        cudaError_t e = cudaMalloc(&p, sizes[i]);
        if (e != cudaSuccess) {
            fprintf(stderr, "ggml_backend_cuda_buffer_type_alloc_buffer: allocating %.2f MiB on device 0: cudaMalloc failed: %s\n",
                    (double)sizes[i] / (double)MiB, cudaGetErrorString(e));
            fprintf(stderr, "alloc_tensor_range: failed to allocate CUDA0 buffer of size %zu\n", sizes[i]);
            return 2;
        }
        *checksum ^= (uint64_t)(uintptr_t)p;
    }
    void *tmp = NULL;
    if (cudaMallocAsync(&tmp, 1 * MiB, 0) != cudaSuccess || cudaFreeAsync(tmp, 0) != cudaSuccess) return 3;

    CUmemAllocationProp prop = pinned_on_device(0);
    CUdeviceptr base = 0;
    if (cuMemAddressReserve(&base, 32 * GiB, 0, 0, 0) != CUDA_SUCCESS) return 4;
    for (int i = 0; i < 3; i++) {
        CUmemGenericAllocationHandle h = 0;
        if (cuMemCreate(&h, 2 * MiB, &prop, 0) != CUDA_SUCCESS) return 5;
        if (cuMemMap(base + (CUdeviceptr)i * 2 * MiB, 2 * MiB, 0, h, 0) != CUDA_SUCCESS) return 6;
        CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        if (cuMemSetAccess(base + (CUdeviceptr)i * 2 * MiB, 2 * MiB, &acc, 1) != CUDA_SUCCESS) return 7;
        if (cuMemRelease(h) != CUDA_SUCCESS) return 8;
    }
    *checksum ^= base;
    return 0;
}
