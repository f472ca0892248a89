/* cache_holder: one process of issue #26's "is it me, or is it them?" pair on the simulated
 * driver (run two with VRAMHOOK_SIM_SHARED, so that they share one device).
 *
 * --hold N: a PyTorch-style process (it maps libc10_cuda.so) that reserves N segments of
 *   1 GiB (one cudaMalloc each), frees every tensor in them (the cache keeps the segments:
 *   memory_reserved() = N GiB, memory_allocated() 0) and holds them until the file named
 *   by --until exists. Meanwhile it does what the PyTorch lens's sampler does, every 100 ms:
 *   a framework sample and its stats (vramhook_lens_emit, found with dlsym: absent when
 *   untraced; SIM_NO_LENS=1 skips it, as a run without the lens). --live: the memory is in
 *   use instead (no sample says otherwise, and SIM_NO_LENS then counts as a plain program).
 *   It writes the file named by --ready once its memory is held.
 * --ask N: asks for N GiB once (cudaMalloc) and exits 1 when it fails, 0 when it fits.
 * Exit status 2 on setup errors. */
#include <dlfcn.h>
#include <unistd.h>

#include "common.h"
#include "sim_cuda.h"
#include "sim_cuda_runtime.h"

/* interposer/src/lens.rs LensRecord */
struct lens_record {
    uint32_t kind, framework;
    int32_t device;
    uint32_t reserved_zero;
    uint64_t a, b, c, d, pieces;
};

static void touch(const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) DIE("cannot write %s", path);
    fclose(f);
}

int main(int argc, char **argv) {
    int hold = arg_int(argc, argv, "--hold", 0), ask = arg_int(argc, argv, "--ask", 0);
    const char *until = arg_val(argc, argv, "--until"), *ready = arg_val(argc, argv, "--ready");
    if (ask > 0) {
        void *p = NULL;
        cudaError_t e = cudaMalloc(&p, (uint64_t)ask * GiB);
        printf("ask %d GiB: %s\n", ask, e == cudaSuccess ? "fitted" : "out of memory");
        if (e == cudaSuccess) cudaFree(p);
        return e == cudaSuccess ? 0 : 1;
    }
    if (hold <= 0 || !until || !ready) DIE("usage: cache_holder --hold N --until FILE --ready FILE | --ask N");
    int live = has_flag(argc, argv, "--live");
    for (int i = 0; i < hold; i++) {
        void *p = NULL;
        if (cudaMalloc(&p, GiB) != cudaSuccess) DIE("cudaMalloc %d", i);
    }
    int (*emit)(const struct lens_record *) = NULL;
    if (!getenv("SIM_NO_LENS") || strcmp(getenv("SIM_NO_LENS"), "1") != 0)
        emit = (int (*)(const struct lens_record *))dlsym(RTLD_DEFAULT, "vramhook_lens_emit");
    uint64_t reserved = (uint64_t)hold * GiB, allocated = live ? reserved : 0;
    int wrote_ready = 0;
    for (int t = 0; t < 600 && access(until, F_OK) != 0; t++) {
        if (emit) {
            struct lens_record sample = {1, 1 /* PyTorch */, 0, 0, reserved, allocated, live ? 0 : GiB, (uint64_t)hold, 0};
            struct lens_record stats = {4, 1, 0, 0, 0 /* stranded */, UINT64_MAX /* no limit */, 0, 0, 0};
            emit(&sample);
            emit(&stats);
        }
        if (!wrote_ready) {
            touch(ready);
            wrote_ready = 1;
        }
        usleep(100 * 1000);
    }
    printf("held %d GiB (%s)\n", hold, live ? "live" : "cached");
    return 0;
}
