/* torch_caching: PyTorch's default caching allocator, as measured in cuda-facts.md.
 * Twenty tensors of 7*(i+1) MiB (rounded to 2 MiB), each its own cudaMalloc segment;
 * every other one goes back to the cache (no cudaFree); then a huge request
 * (SIM_OOM_GIB, default 200 GiB) fails, the cache is emptied (burst of cudaFree)
 * and the request is retried, fails again, and the OOM is reported.
 * Leaves live at exit: the ten tensors still in use (i even: 710 MiB). */
#include "common.h"
#include "sim_cuda_runtime.h"

#define NT 20
struct seg {
    void *ptr;
    size_t size;
    int in_use;
    int live; /* still a cudaMalloc segment */
};
static struct seg segs[NT + 1];
static int nsegs;

static uint64_t reserved(void) {
    uint64_t r = 0;
    for (int i = 0; i < nsegs; i++)
        if (segs[i].live) r += segs[i].size;
    return r;
}

/* the caching allocator: reuse a cached segment that fits, else cudaMalloc */
static cudaError_t tensor_alloc(size_t size, int *idx, cksum_t *ck) {
    for (int i = 0; i < nsegs; i++)
        if (segs[i].live && !segs[i].in_use && segs[i].size >= size) {
            segs[i].in_use = 1;
            *idx = i;
            return cudaSuccess;
        }
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, size);
    ck_add(ck, (uint64_t)e);
    if (e == cudaErrorMemoryAllocation) {
        /* PyTorch: free all cached blocks, then retry once */
        int freed = 0;
        for (int i = 0; i < nsegs; i++)
            if (segs[i].live && !segs[i].in_use) {
                cudaError_t fe = cudaFree(segs[i].ptr);
                ck_add(ck, (uint64_t)fe);
                segs[i].live = 0;
                freed++;
            }
        ck_add(ck, (uint64_t)freed);
        e = cudaMalloc(&p, size);
        ck_add(ck, (uint64_t)e);
    }
    if (e != cudaSuccess) return e;
    ck_add(ck, (uint64_t)(uintptr_t)p);
    segs[nsegs] = (struct seg){p, size, 1, 1};
    *idx = nsegs++;
    return cudaSuccess;
}

int main(void) {
    cksum_t ck;
    ck_init(&ck);
    cudaError_t e = cudaSetDevice(0);
    if (e != cudaSuccess) DIE("cudaSetDevice: %s", cudaGetErrorString(e));
    int idx[NT];
    for (int i = 0; i < NT; i++) {
        size_t sz = (7 * (size_t)(i + 1) * MiB + 2 * MiB - 1) / (2 * MiB) * (2 * MiB);
        e = tensor_alloc(sz, &idx[i], &ck);
        if (e != cudaSuccess) DIE("tensor %d: %s", i, cudaGetErrorString(e));
    }
    for (int i = 1; i < NT; i += 2) segs[idx[i]].in_use = 0; /* back to the cache */
    printf("reserved=%llu\n", (unsigned long long)reserved());
    ck_add(&ck, reserved());

    uint64_t oom_gib = env_u64("SIM_OOM_GIB", 200);
    int big;
    e = tensor_alloc(oom_gib * GiB, &big, &ck);
    ck_add(&ck, (uint64_t)e);
    if (e == cudaErrorMemoryAllocation) {
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        printf("OOM: tried to allocate %.2f GiB (GPU 0 has a total capacity of %.2f GiB of which %.2f GiB is free; "
               "%.2f MiB reserved by this program)\n",
               (double)oom_gib, (double)tot / GiB, (double)fr / GiB, (double)reserved() / MiB);
        cudaGetLastError();
    } else if (e == cudaSuccess) {
        printf("huge allocation of %llu GiB succeeded\n", (unsigned long long)oom_gib);
    } else {
        DIE("huge allocation: %s", cudaGetErrorString(e));
    }
    printf("reserved_after=%llu\n", (unsigned long long)reserved());
    ck_add(&ck, reserved());
    ck_print(&ck);
    return 0;
}
