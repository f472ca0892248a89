/* bench_pair [--threads T] [--iters N] [--size BYTES] [--sync]: the hook's cost per call,
 * measured inside one process, call beside call.
 *
 * Each thread takes two pointers to each driver function: libcuda's own (glibc's dlsym on
 * the libcuda handle, which never sees an interposer's exported dlsym) and the one a
 * program gets (cuGetProcAddress_v2 as the process resolves it: with
 * LD_PRELOAD=libvramhook.so, vramhook's wrapper). Every iteration then makes one
 * alloc + free pair through each, in alternating order, each call timed alone with the
 * TSC. "plain" is libcuda's pointer, "hooked" the program's; without LD_PRELOAD both are
 * libcuda's, and the difference between them is the method's own error (an A/A run).
 *
 * Timing two processes against each other (scripts/gpu/bench.sh calls) compares process
 * against process: on the H200 two plain processes' medians of cudaMallocAsync lay 370 to
 * 708 ns apart. Here both sides share the process, the pool's block, the stream, the
 * caches and the CPU's frequency, so what is left is what the wrapper adds.
 *
 * Default: cuMemAllocAsync(size, 1 MiB) + cuMemFreeAsync on a stream of the thread's own
 * (the pool hands the same block back each time: the cheapest calls a server makes).
 * --sync: cuMemAlloc_v2 + cuMemFree_v2 instead (the simulated driver's lock-free path under
 * VRAMHOOK_SIM_FAST=1; on a real GPU these cost tens of µs).
 *
 * Prints one JSON line: for alloc and free, plain and hooked p50/p99/p99.9 (ns), the same
 * percentiles of hooked - plain ("added_*"), the median of hooked - plain at each
 * position modulo 256 of the loop ("phase_*": periodic work of the hook shows there), and
 * the page faults the timed loops took.
 * Needs only libdl and libcuda.so.1 at run time (simulated or real): no CUDA headers. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <x86intrin.h>

#include "thread_faults.h"

typedef int CUresult;
typedef void *CUcontext;
typedef void *CUstream;
typedef CUresult (*alloc_async_fn)(uint64_t *, size_t, CUstream);
typedef CUresult (*free_async_fn)(uint64_t, CUstream);
typedef CUresult (*alloc_fn)(uint64_t *, size_t);
typedef CUresult (*free_fn)(uint64_t);
typedef CUresult (*gpa_fn)(const char *, void **, int, uint64_t, int *);

#define DIE(...)                                                                                                       \
    do {                                                                                                               \
        fprintf(stderr, "bench_pair: " __VA_ARGS__);                                                                   \
        fputc('\n', stderr);                                                                                           \
        exit(1);                                                                                                       \
    } while (0)

static int iters = 20000, sync_calls = 0;
static size_t size = 1 << 20;
static CUcontext ctx;
static gpa_fn gpa;
static void *(*glibc_dlsym)(void *, const char *);
static void *cuda;
/* Per thread and iteration: [0] plain alloc, [1] plain free, [2] hooked alloc, [3] hooked free (ticks). */
static uint64_t *ticks;
static _Atomic long errors;

static inline uint64_t start_tick(void) {
    _mm_lfence();
    uint64_t t = __rdtsc();
    _mm_lfence();
    return t;
}

static inline uint64_t end_tick(void) {
    unsigned aux;
    uint64_t t = __rdtscp(&aux);
    _mm_lfence();
    return t;
}

static void *resolve(const char *name, int version, int from_program) {
    void *p = NULL;
    if (from_program) {
        int status = 0;
        if (gpa(name, &p, version, 0, &status) != 0 || !p) DIE("cuGetProcAddress_v2(%s) failed", name);
    } else if (!(p = glibc_dlsym(cuda, name))) {
        DIE("libcuda has no %s", name);
    }
    return p;
}

static void *worker(void *arg) {
    size_t t = (size_t)(uintptr_t)arg;
    CUresult (*set_current)(CUcontext) = (CUresult(*)(CUcontext))resolve("cuCtxSetCurrent", 4000, 1);
    CUresult (*stream_create)(CUstream *, unsigned) = (CUresult(*)(CUstream *, unsigned))resolve("cuStreamCreate", 2000, 1);
    if (set_current(ctx)) DIE("cuCtxSetCurrent");
    CUstream s = NULL;
    if (!sync_calls && stream_create(&s, 1 /* CU_STREAM_NON_BLOCKING */)) DIE("cuStreamCreate");
    /* [0] libcuda's own, [1] what the program resolves. */
    alloc_async_fn aa[2];
    free_async_fn fa[2];
    alloc_fn am[2];
    free_fn fm[2];
    for (int side = 0; side < 2; side++) {
        aa[side] = (alloc_async_fn)resolve("cuMemAllocAsync", 11020, side);
        fa[side] = (free_async_fn)resolve("cuMemFreeAsync", 11020, side);
        am[side] = (alloc_fn)resolve(side ? "cuMemAlloc" : "cuMemAlloc_v2", 3020, side);
        fm[side] = (free_fn)resolve(side ? "cuMemFree" : "cuMemFree_v2", 3020, side);
    }
    uint64_t *tk = ticks + t * (size_t)iters * 4;
    /* Warm-up, untimed: the pool's block, the ring (made at the first hooked call), this
     * thread's lane, and the first touch of the result array. */
    for (int i = 0; i < 256; i++) {
        for (int side = 0; side < 2; side++) {
            uint64_t p = 0;
            if (sync_calls) {
                if (am[side](&p, size) || fm[side](p)) DIE("warm-up");
            } else if (aa[side](&p, size, s) || fa[side](p, s)) {
                DIE("warm-up");
            }
        }
    }
    memset(tk, 0, (size_t)iters * 4 * sizeof *tk);
    struct rusage before = thread_usage();
    for (int i = 0; i < iters; i++) {
        for (int k = 0; k < 2; k++) {
            int side = k ^ (i & 1); /* plain first on even iterations, hooked first on odd */
            uint64_t p = 0;
            uint64_t t0 = start_tick();
            CUresult e1 = sync_calls ? am[side](&p, size) : aa[side](&p, size, s);
            uint64_t t1 = end_tick();
            CUresult e2 = sync_calls ? fm[side](p) : fa[side](p, s);
            uint64_t t2 = end_tick();
            tk[(size_t)i * 4 + side * 2] = t1 - t0;
            tk[(size_t)i * 4 + side * 2 + 1] = t2 - t1;
            if (e1 || e2) errors++;
        }
    }
    add_faults_since(&before);
    return NULL;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

static double pct(double *v, size_t n, double p) {
    return v[(size_t)(p * (double)(n - 1) + 0.5)];
}

/* ns per TSC tick, against CLOCK_MONOTONIC over 100 ms. */
static double ns_per_tick(void) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    uint64_t t0 = __rdtsc();
    struct timespec nap = {0, 100 * 1000 * 1000};
    nanosleep(&nap, NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    uint64_t t1 = __rdtsc();
    double ns = (double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec);
    return ns / (double)(t1 - t0);
}

/* Percentiles, and the mean of the middle 98% (the TSC of a VM can tick in steps of
 * 10 ns: the mean of many such readings resolves what one median cannot). */
static void print_pcts(const char *name, double *v, size_t n, const char *sep) {
    qsort(v, n, sizeof *v, cmp_double);
    size_t lo = n / 100, hi = n - n / 100;
    double sum = 0;
    for (size_t i = lo; i < hi; i++) sum += v[i];
    printf("\"%s_p50_ns\":%.1f,\"%s_p99_ns\":%.1f,\"%s_p999_ns\":%.1f,\"%s_mean_ns\":%.2f%s", name, pct(v, n, 0.5), name,
           pct(v, n, 0.99), name, pct(v, n, 0.999), name, hi > lo ? sum / (double)(hi - lo) : 0.0, sep);
}

static int arg_int(int argc, char **argv, const char *name, int def) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return atoi(argv[i + 1]);
    return def;
}

int main(int argc, char **argv) {
    int nt = arg_int(argc, argv, "--threads", 1);
    iters = arg_int(argc, argv, "--iters", iters);
    size = (size_t)arg_int(argc, argv, "--size", (int)size);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--sync")) sync_calls = 1;
    if (nt < 1) nt = 1;
    if (iters < 1) iters = 1;
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    if (!libc) DIE("libc.so.6 not loaded?");
    glibc_dlsym = (void *(*)(void *, const char *))dlvsym(libc, "dlsym", "GLIBC_2.34");
    if (!glibc_dlsym) glibc_dlsym = (void *(*)(void *, const char *))dlvsym(libc, "dlsym", "GLIBC_2.2.5");
    if (!glibc_dlsym) DIE("no glibc dlsym");
    if (!(cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL))) DIE("dlopen libcuda.so.1: %s", dlerror());
    /* The program's way in: the cuGetProcAddress_v2 the process resolves by name (an
     * interposer's when one is preloaded), as cudart does. */
    if (!(gpa = (gpa_fn)dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2"))) DIE("no cuGetProcAddress_v2");
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))resolve("cuInit", 2000, 1);
    CUresult (*retain)(CUcontext *, int) = (CUresult(*)(CUcontext *, int))resolve("cuDevicePrimaryCtxRetain", 7000, 1);
    if (init(0)) DIE("cuInit");
    if (retain(&ctx, 0)) DIE("cuDevicePrimaryCtxRetain");
    size_t n = (size_t)nt * (size_t)iters;
    ticks = calloc(n * 4, sizeof *ticks);
    pthread_t *th = calloc((size_t)nt, sizeof *th);
    if (!ticks || !th) DIE("calloc");
    for (int i = 0; i < nt; i++)
        if (pthread_create(&th[i], NULL, worker, (void *)(uintptr_t)i)) DIE("pthread_create");
    for (int i = 0; i < nt; i++) pthread_join(th[i], NULL);
    double scale = ns_per_tick();
    double *v = malloc(n * sizeof *v);
    if (!v) DIE("malloc");
    printf("{\"threads\":%d,\"iters\":%d,\"calls\":\"%s\",\"size\":%zu,\"preloaded\":%s,", nt, iters,
           sync_calls ? "cuMemAlloc_v2/cuMemFree_v2" : "cuMemAllocAsync/cuMemFreeAsync", size,
           getenv("LD_PRELOAD") && *getenv("LD_PRELOAD") ? "true" : "false");
    static const char *names[4] = {"plain_alloc", "plain_free", "hooked_alloc", "hooked_free"};
    for (int col = 0; col < 4; col++) {
        for (size_t i = 0; i < n; i++) v[i] = (double)ticks[i * 4 + col] * scale;
        print_pcts(names[col], v, n, ",");
    }
    /* Per iteration, hooked minus plain of the same iteration. */
    for (int call = 0; call < 2; call++) {
        for (size_t i = 0; i < n; i++) v[i] = ((double)ticks[i * 4 + 2 + call] - (double)ticks[i * 4 + call]) * scale;
        print_pcts(call ? "paired_free" : "paired_alloc", v, n, ",");
    }
    /* Per call type, the median paired difference at each position i % PHASES of a thread's
     * timed loop: work the hook does once every N calls (N dividing PHASES: a new ring page
     * every 64 events, that is every 32 iterations; a check every 256th allocation) stands
     * out at a few positions, and it is what the p99 is made of when it comes more often
     * than once in 100 calls. */
    enum { PHASES = 256 };
    for (int call = 0; call < 2; call++) {
        printf("\"phase_%s_p50_ns\":[", call ? "free" : "alloc");
        for (int ph = 0; ph < PHASES; ph++) {
            size_t m = 0;
            for (size_t t = 0; t < (size_t)nt; t++)
                for (size_t i = t * (size_t)iters + (size_t)ph; i < (t + 1) * (size_t)iters; i += PHASES)
                    v[m++] = ((double)ticks[i * 4 + 2 + call] - (double)ticks[i * 4 + call]) * scale;
            qsort(v, m, sizeof *v, cmp_double);
            printf("%.1f%s", m ? pct(v, m, 0.5) : 0.0, ph < PHASES - 1 ? "," : "],");
        }
    }
    printf("\"ns_per_tick\":%.5f,\"errors\":%ld,\"minflt\":%ld,\"majflt\":%ld}\n", scale, (long)errors, (long)minor_faults,
           (long)major_faults);
    return errors ? 1 : 0;
}
