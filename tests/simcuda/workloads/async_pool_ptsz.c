/* Compiled with SIM_PTSZ: cudaMallocAsync & co. become the _ptsz entry points. */
#define SIM_PTSZ 1
#include "common.h"
#include "sim_cuda_runtime.h"

void ptsz_round(cudaStream_t s, cudaMemPool_t pool, cksum_t *ck);

void ptsz_round(cudaStream_t s, cudaMemPool_t pool, cksum_t *ck) {
    void *a = NULL, *b = NULL, *c = NULL;
    cudaError_t e = cudaMallocAsync(&a, 2 * MiB, s); /* cudaMallocAsync_ptsz */
    if (e) DIE("cudaMallocAsync_ptsz: %s", cudaGetErrorString(e));
    e = cudaMallocAsync(&b, 7 * MiB, s);
    if (e) DIE("cudaMallocAsync_ptsz: %s", cudaGetErrorString(e));
    e = cudaMallocFromPoolAsync(&c, 1 * MiB, pool, s); /* cudaMallocFromPoolAsync_ptsz */
    if (e) DIE("cudaMallocFromPoolAsync_ptsz: %s", cudaGetErrorString(e));
    ck_add(ck, (uint64_t)(uintptr_t)a);
    ck_add(ck, (uint64_t)(uintptr_t)b);
    ck_add(ck, (uint64_t)(uintptr_t)c);
    ck_add(ck, (uint64_t)cudaFreeAsync(a, s)); /* cudaFreeAsync_ptsz */
    ck_add(ck, (uint64_t)cudaFreeAsync(b, s));
    ck_add(ck, (uint64_t)cudaFreeAsync(c, s));
}
