/* torch_expandable: PyTorch with expandable_segments:True. The context comes from
 * cudart; the VMM calls go through PyTorch's lazy driver shim, i.e.
 * dlopen("libcuda.so.1") + dlsym of each name (never cuGetProcAddress).
 * One segment: reserve 8x the device, map 20 MiB pages for a few tensors. Then a
 * huge request (SIM_OOM_GIB, default 200 GiB): a new segment is reserved and pages are
 * created and mapped until cuMemCreate fails with OOM; those pages are unmapped and
 * released, the segment freed, and the request retried once (same again) before the
 * OOM is reported. At exit everything is unmapped, released and freed: nothing live. */
#include <dlfcn.h>

#include "common.h"
#include "sim_cuda.h"
#include "sim_cuda_runtime.h"
#include "vmm.h"

#define PAGE (20 * MiB)

static struct {
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*addr_free)(CUdeviceptr, size_t);
} S;

struct segment {
    CUdeviceptr base;
    size_t size;
    size_t npages, cap;
    CUmemGenericAllocationHandle *h;
};

static CUmemAllocationProp prop;
static cksum_t ck;

static void load_shim(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!lib) lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) DIE("dlopen libcuda.so.1: %s", dlerror());
#define L(f, n)                                                                                                        \
    do {                                                                                                               \
        *(void **)&S.f = dlsym(lib, n);                                                                                \
        if (!S.f) DIE("dlsym %s", n);                                                                                  \
    } while (0)
    L(reserve, "cuMemAddressReserve");
    L(create, "cuMemCreate");
    L(map, "cuMemMap");
    L(set_access, "cuMemSetAccess");
    L(unmap, "cuMemUnmap");
    L(release, "cuMemRelease");
    L(addr_free, "cuMemAddressFree");
#undef L
}

static int seg_init(struct segment *s, size_t size) {
    memset(s, 0, sizeof *s);
    CUresult r = S.reserve(&s->base, size, 0, 0, 0);
    ck_add(&ck, (uint64_t)r);
    if (r) return -1;
    s->size = size;
    ck_add(&ck, s->base);
    return 0;
}

/* map one more page; returns the CUresult of the failing step */
static CUresult seg_grow(struct segment *s) {
    if ((s->npages + 1) * PAGE > s->size) return CUDA_ERROR_OUT_OF_MEMORY;
    if (s->npages == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 64;
        s->h = realloc(s->h, s->cap * sizeof *s->h);
        if (!s->h) DIE("realloc");
    }
    CUmemGenericAllocationHandle h = 0;
    CUresult r = S.create(&h, PAGE, &prop, 0);
    if (r) return r;
    CUdeviceptr at = s->base + s->npages * PAGE;
    r = S.map(at, PAGE, 0, h, 0);
    if (r) DIE("cuMemMap failed: %d", r);
    CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    r = S.set_access(at, PAGE, &acc, 1);
    if (r) DIE("cuMemSetAccess failed: %d", r);
    s->h[s->npages++] = h;
    return CUDA_SUCCESS;
}

static void seg_shrink_all(struct segment *s) {
    while (s->npages > 0) {
        s->npages--;
        CUresult r1 = S.unmap(s->base + s->npages * PAGE, PAGE);
        CUresult r2 = S.release(s->h[s->npages]);
        if (r1 || r2) DIE("unmap/release failed: %d %d", r1, r2);
    }
}

static void seg_destroy(struct segment *s) {
    seg_shrink_all(s);
    CUresult r = S.addr_free(s->base, s->size);
    if (r) DIE("cuMemAddressFree failed: %d", r);
    free(s->h);
    memset(s, 0, sizeof *s);
}

/* try to back `bytes` in a fresh segment; on OOM undo everything */
static CUresult huge_attempt(size_t bytes, size_t *pages_before_oom) {
    struct segment s;
    size_t sz = (bytes + PAGE - 1) / PAGE * PAGE;
    if (seg_init(&s, sz)) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = CUDA_SUCCESS;
    while (s.npages * PAGE < bytes && (r = seg_grow(&s)) == CUDA_SUCCESS) {
    }
    *pages_before_oom = s.npages;
    seg_destroy(&s); /* success or not, the demo does not keep it */
    return r;
}

int main(void) {
    ck_init(&ck);
    cudaError_t e = cudaSetDevice(0);
    if (e != cudaSuccess) DIE("cudaSetDevice: %s", cudaGetErrorString(e));
    cudaFree(NULL); /* PyTorch's usual context kick */
    load_shim();
    prop = pinned_on_device(0);
    size_t fr = 0, total = 0;
    if (cudaMemGetInfo(&fr, &total) != cudaSuccess) DIE("cudaMemGetInfo");

    struct segment seg;
    if (seg_init(&seg, 8 * total / PAGE * PAGE)) DIE("reserve failed");
    size_t tensors[] = {30 * MiB, 50 * MiB, 70 * MiB, 90 * MiB, 110 * MiB, 130 * MiB};
    size_t used = 0;
    for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; i++) {
        used += tensors[i];
        while (seg.npages * PAGE < used) {
            CUresult r = seg_grow(&seg);
            if (r) DIE("page for tensor %zu: %d", i, r);
        }
    }
    printf("reserved=%llu\n", (unsigned long long)(seg.npages * PAGE));
    ck_add(&ck, seg.npages);

    uint64_t oom_gib = env_u64("SIM_OOM_GIB", 200);
    size_t pages = 0;
    CUresult r = huge_attempt(oom_gib * GiB, &pages);
    ck_add(&ck, (uint64_t)r);
    ck_add(&ck, pages);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
        r = huge_attempt(oom_gib * GiB, &pages); /* PyTorch retries after emptying its cache */
        ck_add(&ck, (uint64_t)r);
        ck_add(&ck, pages);
    }
    if (r == CUDA_ERROR_OUT_OF_MEMORY)
        printf("OOM: tried to allocate %.2f GiB (%zu pages of 20 MiB mapped before the device was full)\n",
               (double)oom_gib, pages);
    else if (r == CUDA_SUCCESS)
        printf("huge allocation of %llu GiB succeeded\n", (unsigned long long)oom_gib);
    else
        DIE("huge allocation: %d", r);

    seg_destroy(&seg);
    ck_print(&ck);
    return 0;
}
