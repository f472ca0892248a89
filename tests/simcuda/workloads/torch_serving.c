/* torch_serving: a PyTorch-style inference server whose cache fragments step by step until
 * a large request fails (issue #30: the fit of the next large request, warned before the OOM).
 *
 * Every step (SIM_STEP_MS, default 50 ms) a request comes: a block of variable size (32 to
 * 480 MiB) kept for a variable number of steps, one in SIM_KEEP_EVERY (default 24) kept
 * for good (a long tail of sessions that never end), and every SIM_LARGE_EVERY steps
 * (default 100) a large one (1536 MiB, kept 4 steps). The allocator is PyTorch's caching
 * allocator for large blocks: best fit over cached blocks, split; else a new segment of the
 * request's size (rounded to 2 MiB); else give back the wholly free segments and try once
 * more; else report to the out-of-memory observers and raise. Kept blocks split the cached
 * segments they land in, so the cache strands ever more free bytes in split segments and
 * must take new segments from the device, until a large request finds no room.
 *
 * Each step it asks the driver for its free bytes and writes what PyTorch's lens writes:
 * a sample (reserved, allocated, largest free block) and stats (free bytes inside split
 * segments, no limit, the largest request given back); at the OOM, the lens's OOM record and segments.
 *
 * SIM_NO_CACHING=1, the control: the same requests, sizes and lifetimes, with the caching
 * allocator off (PYTORCH_NO_CUDA_MEMORY_CACHING=1: each block its own cudaMalloc, freed
 * at once): nothing strands, nothing fails. On a 9 GiB device the cached server fails at
 * step 550; the control run to step 560 keeps at least 1.56 GiB free after every step (its
 * fit of the 1.5 GiB request stays above 1). Run further, the kept tail alone leaves
 * 1.34 GiB free at step 570 and 1.47 GiB at step 582: a 1.5 GiB request would not fit
 * there either, by capacity, and its fit rightly goes below 1.
 * SIM_DEVICE (default 0): the device it runs on.
 * SIM_STEPS (default 600): steps at most. Exit status: 1 after the OOM, 0 otherwise. */
#include <dlfcn.h>
#include <time.h>

#include "common.h"
#include "sim_cuda.h"
#include "sim_cuda_runtime.h"

#define LARGE (1536 * MiB)
#define GRAN (2 * MiB)
#define MAXB 8192
#define MAXS 2048
#define MAXT 4096

#include "block_cache.h"

static int no_caching;
static int device;
static cksum_t ck;

static int seg_used(int s) {
    for (int i = 0; i < nblocks; i++)
        if (blocks[i].seg == s && blocks[i].used) return 1;
    return 0;
}
/* free bytes inside segments with a block in use (PyTorch's inactive_split_bytes) */
static uint64_t stranded(void) {
    uint64_t f = 0;
    for (int i = 0; i < nblocks; i++)
        if (!blocks[i].used && segs[blocks[i].seg].live && seg_used(blocks[i].seg)) f += blocks[i].size;
    return f;
}

/* What PyTorch's lens reports as the largest request given back: the largest segment not
 * held whole by one block in use (a segment is made the size of the request the cache could
 * not serve). */
static uint64_t largest_given_back(void) {
    uint64_t m = 0;
    for (int s = 0; s < nsegs; s++) {
        if (!segs[s].live) continue;
        int whole = 0;
        for (int i = 0; i < nblocks; i++)
            if (blocks[i].seg == s && blocks[i].used && blocks[i].size == segs[s].size) whole = 1;
        if (!whole && segs[s].size > m) m = segs[s].size;
    }
    return m;
}

static int grow(uint64_t size) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, size);
    ck_add(&ck, (uint64_t)e);
    if (e != cudaSuccess) return -1;
    if (nsegs == MAXS) DIE("too many segments");
    segs[nsegs] = (struct segment){(uint64_t)(uintptr_t)p, size, 1};
    add_block((uint64_t)(uintptr_t)p, size, nsegs++, 0);
    return 0;
}

static uint64_t at(int b) { return b < 0 ? 0 : blocks[b].addr; }

/* the caching allocator; the tensor's address, 0 on OOM */
static uint64_t tensor(uint64_t size) {
    size = (size + GRAN - 1) / GRAN * GRAN;
    if (no_caching) {
        void *p = NULL;
        cudaError_t e = cudaMalloc(&p, size);
        ck_add(&ck, (uint64_t)e);
        if (e != cudaSuccess) return 0;
        if (nsegs == MAXS) DIE("too many segments");
        segs[nsegs] = (struct segment){(uint64_t)(uintptr_t)p, size, 1};
        add_block((uint64_t)(uintptr_t)p, size, nsegs++, 1);
        return (uint64_t)(uintptr_t)p;
    }
    int b = take_cached(size);
    if (b >= 0) return at(b);
    if (grow(size) == 0) return at(take_cached(size));
    for (int s = 0; s < nsegs; s++) {
        if (!segs[s].live || seg_used(s)) continue;
        for (int i = 0; i < nblocks; i++)
            if (blocks[i].seg == s) blocks[i--] = blocks[--nblocks];
        ck_add(&ck, (uint64_t)cudaFree((void *)(uintptr_t)segs[s].base));
        segs[s].live = 0;
    }
    if (grow(size) == 0) return at(take_cached(size));
    return 0;
}

static void release_tensor(uint64_t addr) {
    for (int i = 0; i < nblocks; i++)
        if (blocks[i].used && blocks[i].addr == addr) {
            if (no_caching) {
                int s = blocks[i].seg;
                ck_add(&ck, (uint64_t)cudaFree((void *)(uintptr_t)addr));
                segs[s].live = 0;
                blocks[i] = blocks[--nblocks];
                return;
            }
            release(i);
            return;
        }
    DIE("no tensor at %llx", (unsigned long long)addr);
}

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

struct live {
    uint64_t addr;
    long until; /* the step it ends at; -1: kept for good */
};
static struct live live[MAXT];
static int nlive;

static void sleep_ms(uint64_t ms) {
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int main(void) {
    ck_init(&ck);
    no_caching = env_u64("SIM_NO_CACHING", 0) != 0;
    uint64_t step_ms = env_u64("SIM_STEP_MS", 50), steps = env_u64("SIM_STEPS", 600);
    uint64_t keep_every = env_u64("SIM_KEEP_EVERY", 24), large_every = env_u64("SIM_LARGE_EVERY", 100);
    *(void **)&lens_emit = dlsym(RTLD_DEFAULT, "vramhook_lens_emit");
    device = (int)env_u64("SIM_DEVICE", 0);
    lens_device = device;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) DIE("cudaSetDevice: %s", cudaGetErrorString(e));
    size_t fr = 0, tot = 0;
    for (uint64_t t = 0; t < steps; t++) {
        /* requests that end now go first, in the order they came */
        for (int i = 0; i < nlive; i++)
            if (live[i].until == (long)t) {
                release_tensor(live[i].addr);
                live[i--] = live[--nlive];
            }
        uint64_t r = next();
        uint64_t size = 32 * MiB + (r % 15) * 32 * MiB;
        long until = (long)(t + 1 + (r >> 8) % 12);
        if ((r >> 16) % keep_every == 0) until = -1;
        int large = t % large_every == large_every / 2;
        if (large) {
            size = LARGE;
            until = (long)t + 4;
        }
        uint64_t addr = tensor(size);
        cudaMemGetInfo(&fr, &tot);
        if (!addr) {
            /* PyTorch's out-of-memory observers, then its message */
            lens(2, size, reserved(), allocated(), largest_free(-1), 0);
            for (int s = 0; s < nsegs; s++) {
                if (!segs[s].live) continue;
                uint64_t used = 0, pieces = 0;
                for (int i = 0; i < nblocks; i++)
                    if (blocks[i].seg == s) {
                        if (blocks[i].used)
                            used += blocks[i].size;
                        else
                            pieces++;
                    }
                lens(3, segs[s].base, segs[s].size, used, largest_free(s), pieces);
            }
            fprintf(stderr,
                    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate %.2f MiB at step %llu. "
                    "%.2f MiB free, %.2f MiB reserved by PyTorch, %.2f MiB allocated.\n",
                    (double)size / MiB, (unsigned long long)t, (double)fr / MiB, (double)reserved() / MiB,
                    (double)allocated() / MiB);
            printf("oom_step=%llu\n", (unsigned long long)t);
            ck_print(&ck);
            return 1;
        }
        if (nlive == MAXT) DIE("too many tensors");
        live[nlive++] = (struct live){addr, until};
        lens(1, reserved(), allocated(), no_caching ? 0 : largest_free(-1), (uint64_t)nsegs, 0);
        lens(4, no_caching ? 0 : stranded(), UINT64_MAX, no_caching ? 0 : largest_given_back(), 0, 0);
        if (getenv("SIM_VERBOSE"))
            fprintf(stderr, "step %llu%s free=%zu reserved=%llu allocated=%llu largest=%llu stranded=%llu\n",
                    (unsigned long long)t, large ? " L" : "", fr >> 20, (unsigned long long)(reserved() >> 20),
                    (unsigned long long)(allocated() >> 20), (unsigned long long)(largest_free(-1) >> 20),
                    (unsigned long long)(stranded() >> 20));
        ck_add(&ck, addr != 0);
        sleep_ms(step_ms);
    }
    printf("served %llu steps\n", (unsigned long long)steps);
    ck_print(&ck);
    return 0;
}
