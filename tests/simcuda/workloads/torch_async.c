/* torch_async: PyTorch's caching allocator in `backend:cudaMallocAsync` mode, as measured on
 * the H200 (cuda-facts.md): the device's current pool with its release threshold at the
 * maximum (PyTorch sets it so, and the pool keeps every freed byte), twenty tensors of
 * 7..140 MiB through cudaMallocAsync, every other one freed, a stream synchronize. Then,
 * after --wait-ms, one cudaMemGetInfo: the point where the interposer samples the pools (as
 * torch.cuda.mem_get_info() does in scripts/gpu/pools). Prints the pool's own numbers there
 * (cuMemPoolGetAttribute, not wrapped: no event), what memory_reserved() would say.
 * With --oom-mib N, then asks cudaMalloc (outside the pool) for N MiB and reports whether
 * it failed (out_of_memory=1): a request the pool's idle reserve would have covered.
 * Leaves live at exit: the ten odd tensors (770 MiB), in a pool that reserves more. */
#include "common.h"
#include "sim_cuda.h"
#include "sim_cuda_runtime.h"
#include <unistd.h>

static uint64_t pool_attr(CUmemoryPool pool, CUmemPool_attribute a) {
    uint64_t v = 0;
    if (cuMemPoolGetAttribute(pool, a, &v)) DIE("cuMemPoolGetAttribute(%d)", (int)a);
    return v;
}

int main(int argc, char **argv) {
    int wait_ms = arg_int(argc, argv, "--wait-ms", 0);
    int oom_mib = arg_int(argc, argv, "--oom-mib", 0);
    if (cudaSetDevice(0)) DIE("cudaSetDevice");
    cudaStream_t s;
    if (cudaStreamCreate(&s)) DIE("cudaStreamCreate");
    CUmemoryPool pool;
    if (cuDeviceGetMemPool(&pool, 0)) DIE("cuDeviceGetMemPool");
    uint64_t keep_all = ~0ULL;
    if (cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all)) DIE("release threshold");

    void *t[20];
    for (int i = 0; i < 20; i++) {
        cudaError_t e = cudaMallocAsync(&t[i], (size_t)(7 * (i + 1)) * MiB, s);
        if (e) DIE("cudaMallocAsync: %s", cudaGetErrorString(e));
    }
    for (int i = 0; i < 20; i += 2)
        if (cudaFreeAsync(t[i], s)) DIE("cudaFreeAsync");
    if (cudaDeviceSynchronize()) DIE("cudaDeviceSynchronize");
    if (wait_ms > 0) usleep((useconds_t)wait_ms * 1000);
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot)) DIE("cudaMemGetInfo");
    printf("pool_reserved=%llu\n", (unsigned long long)pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT));
    printf("pool_used=%llu\n", (unsigned long long)pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT));
    if (oom_mib > 0) {
        void *big = NULL;
        cudaError_t e = cudaMalloc(&big, (size_t)oom_mib * MiB);
        printf("out_of_memory=%d\n", e == cudaErrorMemoryAllocation);
        if (!e) cudaFree(big);
    }
    fflush(stdout);
    return 0;
}
