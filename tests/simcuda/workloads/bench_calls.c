/* bench_calls --threads T --iters N: each thread times N cudaMalloc(256) and N
 * cudaFree calls one by one (clock_gettime(CLOCK_MONOTONIC) around each call). cudart
 * reaches the driver through the pointers cuGetProcAddress_v2 handed out, so a hook
 * on that path is what is measured. Run with VRAMHOOK_SIM_FAST=1 so that the sim's
 * cuMemAlloc_v2/cuMemFree_v2 take no lock. Prints one JSON line: p50, p99 and p99.9 ns
 * per call over all threads' calls, and the page faults the threads took during the timed
 * loops (getrusage(RUSAGE_THREAD) before and after each thread's loop); then the
 * checksum line. (alloc_median_ns and free_median_ns repeat the p50s for older readers.) */
#include "common.h" /* first: it defines _GNU_SOURCE (RUSAGE_THREAD) */

#include <pthread.h>
#include <time.h>

#include "sim_cuda_runtime.h"
#include "thread_faults.h"

static int iters = 20000;
static uint64_t *alloc_ns, *free_ns;
static _Atomic int errors;

static int cmp_u64(const void *x, const void *y) {
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void *worker(void *arg) {
    size_t t = (size_t)(uintptr_t)arg;
    uint64_t *a = alloc_ns + t * (size_t)iters, *f = free_ns + t * (size_t)iters;
    if (cudaSetDevice(0)) DIE("cudaSetDevice");
    /* Warm-up, untimed: the first hooked call makes the ring, and the first calls of a
     * thread take its lane and fault in its stack and the result arrays. */
    for (int i = 0; i < 64; i++) {
        void *warm = NULL;
        if (cudaMalloc(&warm, 256) || cudaFree(warm)) DIE("warm-up");
    }
    memset(a, 0, (size_t)iters * sizeof *a);
    memset(f, 0, (size_t)iters * sizeof *f);
    struct rusage before = thread_usage();
    for (int i = 0; i < iters; i++) {
        void *p = NULL;
        uint64_t t0 = now_ns();
        cudaError_t e1 = cudaMalloc(&p, 256);
        uint64_t t1 = now_ns();
        cudaError_t e2 = cudaFree(p);
        uint64_t t2 = now_ns();
        a[i] = t1 - t0;
        f[i] = t2 - t1;
        if (e1 || e2) errors++;
    }
    add_faults_since(&before);
    return NULL;
}

static unsigned long long pct(uint64_t *v, size_t n, double p) {
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return (unsigned long long)v[i];
}

int main(int argc, char **argv) {
    int nt = arg_int(argc, argv, "--threads", 1);
    iters = arg_int(argc, argv, "--iters", iters);
    if (nt < 1) nt = 1;
    if (iters < 1) iters = 1;
    size_t n = (size_t)nt * (size_t)iters;
    alloc_ns = calloc(n, sizeof *alloc_ns);
    free_ns = calloc(n, sizeof *free_ns);
    if (!alloc_ns || !free_ns) DIE("calloc");
    pthread_t *th = calloc((size_t)nt, sizeof *th);
    for (int i = 0; i < nt; i++)
        if (pthread_create(&th[i], NULL, worker, (void *)(uintptr_t)i)) DIE("pthread_create");
    for (int i = 0; i < nt; i++) pthread_join(th[i], NULL);
    qsort(alloc_ns, n, sizeof *alloc_ns, cmp_u64);
    qsort(free_ns, n, sizeof *free_ns, cmp_u64);
    printf("{\"threads\":%d,\"iters\":%d,\"errors\":%d,"
           "\"alloc_p50_ns\":%llu,\"alloc_p99_ns\":%llu,\"alloc_p999_ns\":%llu,"
           "\"free_p50_ns\":%llu,\"free_p99_ns\":%llu,\"free_p999_ns\":%llu,"
           "\"alloc_median_ns\":%llu,\"free_median_ns\":%llu,\"minflt\":%ld,\"majflt\":%ld}\n",
           nt, iters, (int)errors, pct(alloc_ns, n, 0.5), pct(alloc_ns, n, 0.99), pct(alloc_ns, n, 0.999),
           pct(free_ns, n, 0.5), pct(free_ns, n, 0.99), pct(free_ns, n, 0.999), pct(alloc_ns, n, 0.5),
           pct(free_ns, n, 0.5), (long)minor_faults,
           (long)major_faults);
    cksum_t ck;
    ck_init(&ck);
    ck_add(&ck, (uint64_t)nt);
    ck_add(&ck, (uint64_t)iters);
    ck_add(&ck, (uint64_t)errors);
    ck_print(&ck);
    return errors ? 1 : 0;
}
