/* ggml_vmm: ggml-cuda's VMM pool, linked with -lcuda (plain symbol calls, no dlsym):
 * reserve 32 GiB, then 8 x (cuMemCreate 4 MiB, cuMemMap, cuMemSetAccess, cuMemRelease
 * of the handle at once), plus tensors through the shared cudart (cudaMalloc/cudaFree).
 * Exits without unmapping (ggml keeps its pool to the end): 32 MiB stay live.
 * --cleanup: one cuMemUnmap of the whole mapped range, cuMemAddressFree: nothing live. */
#include "common.h"
#include "sim_cuda.h"
#include "sim_cuda_runtime.h"
#include "vmm.h"

int main(int argc, char **argv) {
    cksum_t ck;
    ck_init(&ck);
    int cleanup = has_flag(argc, argv, "--cleanup");
    cudaError_t e = cudaSetDevice(0);
    if (e != cudaSuccess) DIE("cudaSetDevice: %s", cudaGetErrorString(e));

    void *t[6];
    for (int i = 0; i < 6; i++) {
        size_t sz = (size_t)(i + 1) * 3 * MiB + 4096 * (size_t)i;
        e = cudaMalloc(&t[i], sz);
        if (e) DIE("cudaMalloc: %s", cudaGetErrorString(e));
        ck_add(&ck, (uint64_t)(uintptr_t)t[i]);
    }

    CUmemAllocationProp prop = pinned_on_device(0);
    size_t gran = 0;
    CUresult r = cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    if (r) DIE("granularity: %d", r);
    ck_add(&ck, gran);

    const size_t pool_size = 32 * GiB;
    CUdeviceptr base = 0;
    r = cuMemAddressReserve(&base, pool_size, 0, 0, 0);
    if (r) DIE("cuMemAddressReserve: %d", r);
    ck_add(&ck, base);
    size_t mapped = 0;
    for (int i = 0; i < 8; i++) {
        const size_t chunk = 4 * MiB;
        CUmemGenericAllocationHandle h = 0;
        r = cuMemCreate(&h, chunk, &prop, 0);
        if (r) DIE("cuMemCreate: %d", r);
        r = cuMemMap(base + mapped, chunk, 0, h, 0);
        if (r) DIE("cuMemMap: %d", r);
        CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        r = cuMemSetAccess(base + mapped, chunk, &acc, 1);
        if (r) DIE("cuMemSetAccess: %d", r);
        r = cuMemRelease(h); /* ggml releases the handle at once; the mapping keeps it alive */
        if (r) DIE("cuMemRelease: %d", r);
        mapped += chunk;
    }
    ck_add(&ck, mapped);

    for (int i = 0; i < 6; i++) ck_add(&ck, (uint64_t)cudaFree(t[i]));

    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    ck_add(&ck, tot - fr);

    if (cleanup) {
        r = cuMemUnmap(base, mapped);
        if (r) DIE("cuMemUnmap: %d", r);
        r = cuMemAddressFree(base, pool_size);
        if (r) DIE("cuMemAddressFree: %d", r);
        ck_add(&ck, 1);
    }
    ck_print(&ck);
    return 0;
}
