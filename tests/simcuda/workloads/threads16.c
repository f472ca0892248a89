/* threads16: --threads T (default 16) threads, each doing --iters N (default 2000)
 * cudaMalloc/cudaFree pairs of varying small sizes, plus a cudaMallocAsync/
 * cudaFreeAsync pair on its own stream every 250 iterations. The checksum combines
 * per-thread results (error codes and sizes, not addresses) by addition, so it does
 * not depend on scheduling. Leaves live at exit: nothing (the default pool keeps its
 * reserve). */
#include <pthread.h>

#include "common.h"
#include "sim_cuda_runtime.h"

static int iters = 2000;

static void *worker(void *arg) {
    uint64_t t = (uint64_t)(uintptr_t)arg;
    cksum_t ck;
    ck_init(&ck);
    ck_add(&ck, t);
    cudaStream_t s;
    if (cudaSetDevice(0) || cudaStreamCreate(&s)) DIE("thread setup");
    for (int i = 0; i < iters; i++) {
        size_t sz = 256 + ((t * 7919 + (uint64_t)i * 104729) % 65536);
        void *p = NULL;
        cudaError_t e = cudaMalloc(&p, sz);
        ck_add(&ck, (uint64_t)e);
        ck_add(&ck, sz);
        if (e == cudaSuccess) ck_add(&ck, (uint64_t)cudaFree(p));
        if (i % 250 == 0) {
            void *q = NULL;
            e = cudaMallocAsync(&q, sz * 16, s);
            ck_add(&ck, (uint64_t)e);
            if (e == cudaSuccess) ck_add(&ck, (uint64_t)cudaFreeAsync(q, s));
        }
    }
    ck_add(&ck, (uint64_t)cudaStreamDestroy(s));
    return (void *)(uintptr_t)ck.h;
}

int main(int argc, char **argv) {
    int nt = arg_int(argc, argv, "--threads", 16);
    iters = arg_int(argc, argv, "--iters", iters);
    if (nt < 1) nt = 1;
    pthread_t *th = calloc((size_t)nt, sizeof *th);
    for (int i = 0; i < nt; i++)
        if (pthread_create(&th[i], NULL, worker, (void *)(uintptr_t)i)) DIE("pthread_create");
    uint64_t sum = 0;
    for (int i = 0; i < nt; i++) {
        void *r;
        pthread_join(th[i], &r);
        sum += (uint64_t)(uintptr_t)r;
    }
    cksum_t ck;
    ck_init(&ck);
    ck_add(&ck, (uint64_t)nt);
    ck_add(&ck, (uint64_t)iters);
    ck_add(&ck, sum);
    ck_print(&ck);
    return 0;
}
