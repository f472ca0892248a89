/* paced --bursts N --per-burst K --gap-ms M: N bursts of K cudaMalloc(1 MiB) + cudaFree
 * pairs on one thread, M ms apart. The interposer looks for a periodic device sample on a
 * thread's every 256th allocation, and takes one when VRAMHOOK_MEMINFO_MS has passed: with
 * K = 256 each burst has one such look. Prints allocs=N*K and the checksum. */
#include <time.h>

#include "common.h"
#include "sim_cuda_runtime.h"

int main(int argc, char **argv) {
    int bursts = arg_int(argc, argv, "--bursts", 10), per = arg_int(argc, argv, "--per-burst", 256);
    int gap_ms = arg_int(argc, argv, "--gap-ms", 50);
    cksum_t ck;
    ck_init(&ck);
    long allocs = 0;
    for (int b = 0; b < bursts; b++) {
        for (int i = 0; i < per; i++) {
            void *p = NULL;
            cudaError_t e = cudaMalloc(&p, MiB);
            if (e != cudaSuccess) DIE("cudaMalloc: %s", cudaGetErrorString(e));
            ck_add(&ck, (uint64_t)(uintptr_t)p);
            ck_add(&ck, (uint64_t)cudaFree(p));
            allocs++;
        }
        struct timespec nap = {gap_ms / 1000, (long)(gap_ms % 1000) * 1000000L};
        nanosleep(&nap, NULL);
    }
    printf("allocs=%ld\n", allocs);
    ck_print(&ck);
    return 0;
}
