// Real-GPU probe for vramhook: makes known device-memory calls through the runtime
// (cudaMalloc & co.) and, like ggml's VMM pool, directly through the driver (-lcuda),
// and prints each call it made as a JSON line ("probe": {...}) so that a checker can
// compare them with what vramhook captured, address for address.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>

static void line(const char *api, int result, unsigned long long addr, unsigned long long size) {
    printf("{\"probe\":true,\"api\":\"%s\",\"result\":%d,\"addr\":%llu,\"size\":%llu}\n", api, result, addr, size);
}

int main() {
    const size_t sizes[] = {512, 1 << 20, 2 << 20, 20 << 20, 7 << 20, 64 << 20, 3000, 100 << 20};
    const int n = sizeof sizes / sizeof sizes[0];
    void *p[n];
    for (int i = 0; i < n; i++) {
        cudaError_t e = cudaMalloc(&p[i], sizes[i]);
        line("cudaMalloc", e, (unsigned long long)p[i], sizes[i]);
    }
    for (int i = 1; i < n; i += 2) line("cudaFree", cudaFree(p[i]), (unsigned long long)p[i], 0);

    cudaStream_t s;
    cudaStreamCreate(&s);
    void *a = nullptr;
    cudaError_t e = cudaMallocAsync(&a, 8 << 20, s);
    line("cudaMallocAsync", e, (unsigned long long)a, 8 << 20);
    line("cudaFreeAsync", cudaFreeAsync(a, s), (unsigned long long)a, 0);
    cudaStreamSynchronize(s);

    void *pitched = nullptr;
    size_t pitch = 0;
    e = cudaMallocPitch(&pitched, &pitch, 1000, 100);
    line("cudaMallocPitch", e, (unsigned long long)pitched, (unsigned long long)pitch * 100);
    line("cudaFree", cudaFree(pitched), (unsigned long long)pitched, 0);

    // The driver API called directly, as ggml's VMM pool does.
    CUdevice dev;
    cuDeviceGet(&dev, 0);
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    size_t gran = 0;
    cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    CUdeviceptr base = 0;
    CUresult r = cuMemAddressReserve(&base, 32ull << 30, 0, 0, 0);
    line("cuMemAddressReserve", r, base, 32ull << 30);
    for (int i = 0; i < 4; i++) {
        CUmemGenericAllocationHandle h;
        r = cuMemCreate(&h, 4 * gran, &prop, 0);
        line("cuMemCreate", r, 0, 4 * gran);
        r = cuMemMap(base + i * 4 * gran, 4 * gran, 0, h, 0);
        line("cuMemMap", r, base + i * 4 * gran, 4 * gran);
        CUmemAccessDesc acc = {};
        acc.location = prop.location;
        acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        cuMemSetAccess(base + i * 4 * gran, 4 * gran, &acc, 1);
        line("cuMemRelease", cuMemRelease(h), 0, 0);  // ggml releases at once: still mapped
    }
    line("cuMemUnmap", cuMemUnmap(base, 16 * gran), base, 16 * gran);
    line("cuMemAddressFree", cuMemAddressFree(base, 32ull << 30), base, 32ull << 30);

    void *huge = nullptr;
    e = cudaMalloc(&huge, 200ull << 30);
    line("cudaMalloc", e, 0, 200ull << 30);
    cudaGetLastError();
    for (int i = 0; i < n; i += 2) line("cudaFree", cudaFree(p[i]), (unsigned long long)p[i], 0);
    printf("probe done\n");
    return 0;
}
