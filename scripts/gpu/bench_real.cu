// Cost of the cheapest real memory calls, timed one by one, for the hooked-versus-plain
// comparison on a real GPU: bench_real [ITERS]. Prints one JSON line: p50, p99 and p99.9
// (ns) of cudaMallocAsync 1 MiB / cudaFreeAsync on one stream (the pool reuses the block)
// and of cudaMalloc / cudaFree 512 B, the page faults the process took during each timed
// loop (getrusage), and what the pieces of a hook cost here, measured in tight loops:
// rdtsc, cuCtxGetDevice and cuCtxGetCurrent per call.
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <sys/resource.h>
#include <x86intrin.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

using clk = std::chrono::steady_clock;

static double pct(std::vector<double> v, double p) {
    std::sort(v.begin(), v.end());
    return v[(size_t)(p * (double)(v.size() - 1) + 0.5)];
}

static long faults(long *major) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    *major = ru.ru_majflt;
    return ru.ru_minflt;
}

static double ns(clk::time_point a, clk::time_point b) { return std::chrono::duration<double, std::nano>(b - a).count(); }

// Mean ns per call of `f` over `n` calls, the best of five tries.
template <class F> static double per_call(int n, F f) {
    double best = 1e30;
    for (int t = 0; t < 5; t++) {
        auto a = clk::now();
        for (int i = 0; i < n; i++) f();
        best = std::min(best, ns(a, clk::now()) / n);
    }
    return best;
}

// NAME_ns is the median again, under the name scripts/gpu/ebpf.sh reads.
static void print_pcts(const char *name, const std::vector<double> &v) {
    printf("\"%s_p50_ns\":%.0f,\"%s_p99_ns\":%.0f,\"%s_p999_ns\":%.0f,\"%s_ns\":%.0f,", name, pct(v, 0.5), name,
           pct(v, 0.99), name, pct(v, 0.999), name, pct(v, 0.5));
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 10000;
    cudaStream_t s;
    cudaStreamCreate(&s);
    std::vector<double> am(iters), af(iters), mm(iters), mf(iters);
    // Warm-up, untimed: the pool's block, the ring (made at the first hooked call), and
    // the first touch of the result vectors.
    for (int i = 0; i < 64; i++) {
        void *p;
        cudaMallocAsync(&p, 1 << 20, s);
        cudaFreeAsync(p, s);
        cudaMalloc(&p, 512);
        cudaFree(p);
    }
    cudaStreamSynchronize(s);
    long maj0, maj1, maj2, maj3;
    long min0 = faults(&maj0);
    for (int i = 0; i < iters; i++) {
        void *p;
        auto t0 = clk::now();
        cudaMallocAsync(&p, 1 << 20, s);
        auto t1 = clk::now();
        cudaFreeAsync(p, s);
        auto t2 = clk::now();
        am[i] = ns(t0, t1);
        af[i] = ns(t1, t2);
    }
    long min1 = faults(&maj1);
    cudaStreamSynchronize(s);
    long min2 = faults(&maj2);
    for (int i = 0; i < iters; i++) {
        void *p;
        auto t0 = clk::now();
        cudaMalloc(&p, 512);
        auto t1 = clk::now();
        cudaFree(p);
        auto t2 = clk::now();
        mm[i] = ns(t0, t1);
        mf[i] = ns(t1, t2);
    }
    long min3 = faults(&maj3);
    // The driver's functions from the libcuda cudart loaded (no -lcuda needed to build).
    int dev = -1;
    CUcontext ctx = nullptr;
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    auto get_dev = cuda ? (CUresult(*)(CUdevice *))dlsym(cuda, "cuCtxGetDevice") : nullptr;
    auto get_cur = cuda ? (CUresult(*)(CUcontext *))dlsym(cuda, "cuCtxGetCurrent") : nullptr;
    volatile unsigned long long sink = 0;
    double tsc = per_call(1000000, [&] { sink += __rdtsc(); });
    double get_device = get_dev ? per_call(100000, [&] { get_dev(&dev); }) : -1;
    double get_current = get_cur ? per_call(100000, [&] { get_cur(&ctx); }) : -1;
    printf("{\"iters\":%d,", iters);
    print_pcts("cudaMallocAsync_1MiB", am);
    print_pcts("cudaFreeAsync", af);
    print_pcts("cudaMalloc_512B", mm);
    print_pcts("cudaFree_512B", mf);
    printf("\"async_loop_minflt\":%ld,\"async_loop_majflt\":%ld,\"malloc_loop_minflt\":%ld,\"malloc_loop_majflt\":%ld,"
           "\"rdtsc_ns\":%.1f,\"cuCtxGetDevice_ns\":%.1f,\"cuCtxGetCurrent_ns\":%.1f,\"device\":%d}\n",
           min1 - min0, maj1 - maj0, min3 - min2, maj3 - maj2, tsc, get_device, get_current, dev);
    return 0;
}
