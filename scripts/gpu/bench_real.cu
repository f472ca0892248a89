// Cost of the cheapest real memory calls, timed one by one, for the hooked-versus-plain
// comparison on a real GPU. Prints one JSON line of medians (ns).
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

static double median(std::vector<double> &v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 2000;
    cudaStream_t s;
    cudaStreamCreate(&s);
    void *warm;
    cudaMallocAsync(&warm, 1 << 20, s);
    cudaFreeAsync(warm, s);
    cudaStreamSynchronize(s);
    std::vector<double> am, af, mm, mf;
    using clk = std::chrono::steady_clock;
    for (int i = 0; i < iters; i++) {
        void *p;
        auto t0 = clk::now();
        cudaMallocAsync(&p, 1 << 20, s);
        auto t1 = clk::now();
        cudaFreeAsync(p, s);
        auto t2 = clk::now();
        am.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
        af.push_back(std::chrono::duration<double, std::nano>(t2 - t1).count());
    }
    cudaStreamSynchronize(s);
    for (int i = 0; i < iters; i++) {
        void *p;
        auto t0 = clk::now();
        cudaMalloc(&p, 512);
        auto t1 = clk::now();
        cudaFree(p);
        auto t2 = clk::now();
        mm.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
        mf.push_back(std::chrono::duration<double, std::nano>(t2 - t1).count());
    }
    printf("{\"iters\":%d,\"cudaMallocAsync_1MiB_ns\":%.0f,\"cudaFreeAsync_ns\":%.0f,\"cudaMalloc_512B_ns\":%.0f,\"cudaFree_512B_ns\":%.0f}\n",
           iters, median(am), median(af), median(mm), median(mf));
    return 0;
}
