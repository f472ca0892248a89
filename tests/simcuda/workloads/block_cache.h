/* A PyTorch-like caching allocator's block and segment lists, shared by the workloads that
 * play one (torch_fragmented.c, torch_serving.c): best fit over cached blocks with splits,
 * frees merged with free neighbours, and the lens records such a cache would write.
 * Define MAXB (blocks) and MAXS (segments) before including it; the includer sets
 * `lens_device` when it is not device 0. */
#ifndef BLOCK_CACHE_H
#define BLOCK_CACHE_H

#include <stdint.h>

/* A block of a segment: [addr, addr+size), in use or cached. */
struct block {
    uint64_t addr, size;
    int seg, used;
};
static struct block blocks[MAXB];
static int nblocks;
struct segment {
    uint64_t base, size;
    int live;
};
static struct segment segs[MAXS];
static int nsegs;

/* interposer/src/lens.rs LensRecord */
struct lens_record {
    uint32_t kind, framework;
    int32_t device;
    uint32_t reserved_zero;
    uint64_t a, b, c, d, pieces;
};
static int (*lens_emit)(const struct lens_record *);
static int lens_device;
static void lens(uint32_t kind, uint64_t a, uint64_t b, uint64_t c, uint64_t d, uint64_t pieces) {
    if (!lens_emit) return;
    struct lens_record r = {kind, 1 /* PyTorch */, lens_device, 0, a, b, c, d, pieces};
    lens_emit(&r);
}

static uint64_t reserved(void) {
    uint64_t r = 0;
    for (int i = 0; i < nsegs; i++)
        if (segs[i].live) r += segs[i].size;
    return r;
}
static uint64_t allocated(void) {
    uint64_t a = 0;
    for (int i = 0; i < nblocks; i++)
        if (blocks[i].used) a += blocks[i].size;
    return a;
}
static uint64_t largest_free(int seg) {
    uint64_t l = 0;
    for (int i = 0; i < nblocks; i++)
        if (!blocks[i].used && (seg < 0 || blocks[i].seg == seg) && blocks[i].size > l) l = blocks[i].size;
    return l;
}

static void add_block(uint64_t addr, uint64_t size, int seg, int used) {
    if (nblocks == MAXB) DIE("too many blocks");
    blocks[nblocks++] = (struct block){addr, size, seg, used};
}

/* best fit over cached blocks, split; -1 when none fits */
static int take_cached(uint64_t size) {
    int best = -1;
    for (int i = 0; i < nblocks; i++)
        if (!blocks[i].used && blocks[i].size >= size && (best < 0 || blocks[i].size < blocks[best].size)) best = i;
    if (best < 0) return -1;
    if (blocks[best].size > size) {
        add_block(blocks[best].addr + size, blocks[best].size - size, blocks[best].seg, 0);
        blocks[best].size = size;
    }
    blocks[best].used = 1;
    return best;
}

/* a freed block merges with free neighbours of its segment (indices move: tensors are
 * known by address) */
static void release(int b) {
    blocks[b].used = 0;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = 0; i < nblocks && !changed; i++)
            for (int j = 0; j < nblocks && !changed; j++)
                if (i != j && !blocks[i].used && !blocks[j].used && blocks[i].seg == blocks[j].seg &&
                    blocks[i].addr + blocks[i].size == blocks[j].addr) {
                    blocks[i].size += blocks[j].size;
                    blocks[j] = blocks[--nblocks];
                    changed = 1;
                }
    }
}

/* A segment's bytes in use and its cached pieces. */
static inline void segment_usage(int seg, uint64_t *used, uint64_t *pieces) {
    *used = *pieces = 0;
    for (int i = 0; i < nblocks; i++) {
        if (blocks[i].seg != seg) continue;
        if (blocks[i].used)
            *used += blocks[i].size;
        else
            ++*pieces;
    }
}

/* What PyTorch's out-of-memory observers record for a failed request: the request and the
 * cache, then each live segment. */
static inline void lens_oom(uint64_t request) {
    lens(2, request, reserved(), allocated(), largest_free(-1), 0);
    for (int s = 0; s < nsegs; s++) {
        if (!segs[s].live) continue;
        uint64_t used, pieces;
        segment_usage(s, &used, &pieces);
        lens(3, segs[s].base, segs[s].size, used, largest_free(s), pieces);
    }
}

#endif
