/* async_pool: stream-ordered allocation.
 *  - cudaMallocAsync/cudaFreeAsync on a stream (default pool): 1, 3, 5 MiB
 *  - the same through the _ptsz entry points (async_pool_ptsz.c is compiled with
 *    SIM_PTSZ, like nvcc --default-stream per-thread): 2, 7 MiB
 *  - a created pool: 3 x 4 MiB with cudaMallocFromPoolAsync (+ one through _ptsz),
 *    freed; the reserve stays (cudaMemGetInfo shows it), cudaMemPoolTrimTo(pool, 0)
 *    gives it back, the pool is destroyed.
 * Leaves live at exit: no allocations; the default pool keeps its reserve (10 MiB). */
#include "common.h"
#include "sim_cuda_runtime.h"

void ptsz_round(cudaStream_t s, cudaMemPool_t pool, cksum_t *ck); /* async_pool_ptsz.c */

static size_t used_now(void) {
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot)) DIE("cudaMemGetInfo");
    return tot - fr;
}

int main(void) {
    cksum_t ck;
    ck_init(&ck);
    if (cudaSetDevice(0)) DIE("cudaSetDevice");
    cudaStream_t s;
    if (cudaStreamCreate(&s)) DIE("cudaStreamCreate");
    size_t base = used_now();

    size_t sizes[] = {1 * MiB, 3 * MiB, 5 * MiB};
    void *p[3];
    for (int i = 0; i < 3; i++) {
        cudaError_t e = cudaMallocAsync(&p[i], sizes[i], s);
        if (e) DIE("cudaMallocAsync: %s", cudaGetErrorString(e));
        ck_add(&ck, (uint64_t)(uintptr_t)p[i]);
    }
    for (int i = 0; i < 3; i++) ck_add(&ck, (uint64_t)cudaFreeAsync(p[i], s));
    cudaDeviceSynchronize();
    size_t kept = used_now() - base;
    printf("default_pool_reserve=%zu\n", kept);
    ck_add(&ck, kept);

    struct cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    cudaMemPool_t pool;
    if (cudaMemPoolCreate(&pool, &props)) DIE("cudaMemPoolCreate");

    ptsz_round(s, pool, &ck);

    void *q[3];
    for (int i = 0; i < 3; i++) {
        cudaError_t e = cudaMallocFromPoolAsync(&q[i], 4 * MiB, pool, s);
        if (e) DIE("cudaMallocFromPoolAsync: %s", cudaGetErrorString(e));
        ck_add(&ck, (uint64_t)(uintptr_t)q[i]);
    }
    for (int i = 0; i < 3; i++) ck_add(&ck, (uint64_t)cudaFreeAsync(q[i], s));
    cudaDeviceSynchronize();
    size_t pool_kept = used_now() - base - kept;
    printf("created_pool_reserve_after_free=%zu\n", pool_kept);
    ck_add(&ck, pool_kept);
    ck_add(&ck, (uint64_t)cudaMemPoolTrimTo(pool, 0));
    size_t after_trim = used_now() - base - kept;
    printf("created_pool_reserve_after_trim=%zu\n", after_trim);
    ck_add(&ck, after_trim);
    ck_add(&ck, (uint64_t)cudaMemPoolDestroy(pool));
    /* an invalid free is an error */
    ck_add(&ck, (uint64_t)cudaFreeAsync((void *)(uintptr_t)0x1234, s));
    cudaGetLastError();
    ck_add(&ck, (uint64_t)cudaStreamDestroy(s));
    ck_print(&ck);
    return 0;
}
