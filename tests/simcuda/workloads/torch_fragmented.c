/* torch_fragmented: PyTorch's caching allocator stranding memory in split segments, the
 * H200 case of issue #10 scaled to the simulated device.
 *
 * Fill the device with 1000 MiB tensors (each its own cudaMalloc segment), free them (the
 * cache keeps the segments), keep a 600 MiB tensor in each cached segment (best fit splits
 * each segment: 400 MiB free behind every tensor), then ask for 2000 MiB. No free block is
 * large enough, cudaMalloc fails, no segment is wholly free to give back, the retry fails,
 * and the allocator raises, after calling its out-of-memory observers. There the PyTorch
 * lens writes the allocator's numbers into the vramhook ring; this program makes the same
 * call the lens makes (vramhook_lens_emit, found with dlsym: absent when untraced, and
 * SIM_NO_LENS=1 skips it, as a run without the lens). It prints PyTorch's message.
 *
 * SIM_EXPANDABLE=1: expandable segments. One address range grows by 20 MiB pages
 * (cuMemCreate + cuMemMap); freed blocks coalesce inside it, so the 600 MiB tensors pack
 * together and the 2000 MiB request fits in what they leave: nothing fails.
 * SIM_HOLD_S=N: wait N seconds once the cache is fragmented (for a reader to see it live).
 * Exit status: 1 after the OOM, 0 when everything fitted. */
#include <dlfcn.h>
#include <unistd.h>

#include "common.h"
#include "sim_cuda.h"
#include "sim_cuda_runtime.h"

#define BIG (1000 * MiB)
#define KEEP (600 * MiB)
#define REQUEST (2000 * MiB)
#define PAGE (20 * MiB)
#define MAXB 4096

#define MAXS 256
#include "block_cache.h"

static int expandable;
static cksum_t ck;

static CUresult (*reserve_fn)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
static CUresult (*create_fn)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
static CUresult (*map_fn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);

/* a new segment of `size` (the default allocator), or `size` more bytes mapped at the end
 * of the one expandable segment; 0 on success */
static int grow(uint64_t size) {
    if (!expandable) {
        void *p = NULL;
        cudaError_t e = cudaMalloc(&p, size);
        ck_add(&ck, (uint64_t)e);
        if (e != cudaSuccess) return -1;
        segs[nsegs] = (struct segment){(uint64_t)(uintptr_t)p, size, 1};
        add_block((uint64_t)(uintptr_t)p, size, nsegs++, 0);
        return 0;
    }
    if (nsegs == 0) {
        CUdeviceptr base = 0;
        if (reserve_fn(&base, 64 * GiB, 0, 0, 0)) DIE("cuMemAddressReserve failed");
        segs[nsegs++] = (struct segment){base, 0, 1};
    }
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    for (uint64_t done = 0; done < size; done += PAGE) {
        CUmemGenericAllocationHandle h = 0;
        CUresult r = create_fn(&h, PAGE, &prop, 0);
        ck_add(&ck, (uint64_t)r);
        if (r) return -1;
        if (map_fn(segs[0].base + segs[0].size, PAGE, 0, h, 0)) DIE("cuMemMap failed");
        add_block(segs[0].base + segs[0].size, PAGE, 0, 0);
        release(nblocks - 1);
        segs[0].size += PAGE;
    }
    return 0;
}

static void release_tensor(uint64_t addr) {
    for (int i = 0; i < nblocks; i++)
        if (blocks[i].used && blocks[i].addr == addr) {
            release(i);
            return;
        }
    DIE("no tensor at %llx", (unsigned long long)addr);
}

/* the allocator: a cached block, else more memory, else give back whole free segments and
 * try once more, else report to the observers and raise; the tensor's address, 0 on OOM */
static uint64_t at(int b) { return b < 0 ? 0 : blocks[b].addr; }
static uint64_t tensor(uint64_t size) {
    int b = take_cached(size);
    if (b >= 0) return at(b);
    if (grow(size) == 0) return at(take_cached(size));
    int freed = 0;
    for (int s = 0; s < nsegs && !expandable; s++) {
        int whole = segs[s].live;
        for (int i = 0; i < nblocks && whole; i++)
            if (blocks[i].seg == s && (blocks[i].used || blocks[i].size != segs[s].size)) whole = 0;
        if (!whole) continue;
        for (int i = 0; i < nblocks; i++)
            if (blocks[i].seg == s) blocks[i--] = blocks[--nblocks];
        ck_add(&ck, (uint64_t)cudaFree((void *)(uintptr_t)segs[s].base));
        segs[s].live = 0;
        freed++;
    }
    ck_add(&ck, (uint64_t)freed);
    if (grow(size) == 0) return at(take_cached(size));
    return 0;
}

static void lens_sample(void) {
    lens(1, reserved(), allocated(), largest_free(-1), (uint64_t)nsegs, 0);
}

static void fmt(char *out, uint64_t v) {
    if (v >= GiB)
        sprintf(out, "%.2f GiB", (double)v / GiB);
    else
        sprintf(out, "%.2f MiB", (double)v / MiB);
}

int main(void) {
    ck_init(&ck);
    expandable = env_u64("SIM_EXPANDABLE", 0) != 0;
    if (env_u64("SIM_NO_LENS", 0) == 0) *(void **)&lens_emit = dlsym(RTLD_DEFAULT, "vramhook_lens_emit");
    cudaError_t e = cudaSetDevice(0);
    if (e != cudaSuccess) DIE("cudaSetDevice: %s", cudaGetErrorString(e));
    if (expandable) {
        void *lib = dlopen("libcuda.so.1", RTLD_NOW);
        if (!lib) DIE("dlopen libcuda.so.1: %s", dlerror());
        *(void **)&reserve_fn = dlsym(lib, "cuMemAddressReserve");
        *(void **)&create_fn = dlsym(lib, "cuMemCreate");
        *(void **)&map_fn = dlsym(lib, "cuMemMap");
        if (!reserve_fn || !create_fn || !map_fn) DIE("dlsym of the VMM calls");
    }
    /* fill: 1000 MiB tensors while the device has room for one more */
    uint64_t fill[128];
    int n = 0;
    size_t fr = 0, tot = 0;
    while (n < 128 && cudaMemGetInfo(&fr, &tot) == cudaSuccess && fr >= BIG + 64 * MiB) {
        fill[n] = tensor(BIG);
        if (!fill[n]) DIE("fill: out of memory with %zu free", fr);
        n++;
    }
    lens_sample();
    for (int i = 0; i < n; i++) release_tensor(fill[i]);
    /* keep one 600 MiB tensor per cached segment (best fit picks a whole one each time) */
    for (int i = 0; i < n; i++)
        if (!tensor(KEEP)) DIE("keep %d: out of memory", i);
    lens_sample();
    printf("tensors=%d reserved=%llu allocated=%llu\n", n, (unsigned long long)reserved(),
           (unsigned long long)allocated());
    fflush(stdout);
    for (uint64_t s = env_u64("SIM_HOLD_S", 0); s > 0; s--) sleep(1);
    uint64_t big = tensor(REQUEST);
    cudaMemGetInfo(&fr, &tot);
    if (big) {
        printf("the %llu MiB tensor fitted\n", (unsigned long long)(REQUEST / MiB));
        ck_add(&ck, 1);
        ck_print(&ck);
        return 0;
    }
    /* PyTorch's out-of-memory observers, then its message */
    lens_oom(REQUEST);
    char req[32], total[32], free_s[32], alloc_s[32], unalloc[32];
    fmt(req, REQUEST);
    fmt(total, tot);
    fmt(free_s, fr);
    fmt(alloc_s, allocated());
    fmt(unalloc, reserved() - allocated());
    fprintf(stderr,
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate %s. GPU 0 has a total capacity of %s of "
            "which %s is free. Of the allocated memory %s is allocated by PyTorch, and %s is reserved by PyTorch but "
            "unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.\n",
            req, total, free_s, alloc_s, unalloc);
    ck_print(&ck);
    return 1;
}
