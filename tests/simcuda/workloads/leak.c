/* leak: allocates N buffers (--n N, default 10; a bare number also works) of mixed
 * sizes with cudaMalloc, frees the even-numbered ones, and exits with --exit CODE
 * (default 0) leaving the odd-numbered ones live. --hold SECONDS sleeps before exiting
 * (to test the shared-device mode).
 * Buffer i has (i % 5 + 1) MiB + i * 1000 bytes. */
#include <unistd.h>

#include "common.h"
#include "sim_cuda_runtime.h"

int main(int argc, char **argv) {
    int n = 10;
    const char *v;
    if ((v = arg_val(argc, argv, "--n"))) n = atoi(v);
    else if (argc > 1 && argv[1][0] >= '0' && argv[1][0] <= '9') n = atoi(argv[1]);
    int code = arg_int(argc, argv, "--exit", 0), hold = arg_int(argc, argv, "--hold", 0);
    if (n < 0) n = 0;
    cksum_t ck;
    ck_init(&ck);
    void **p = calloc((size_t)n + 1, sizeof *p);
    uint64_t live = 0;
    for (int i = 0; i < n; i++) {
        size_t sz = (size_t)(i % 5 + 1) * MiB + (size_t)i * 1000;
        cudaError_t e = cudaMalloc(&p[i], sz);
        if (e != cudaSuccess) DIE("cudaMalloc %d: %s", i, cudaGetErrorString(e));
        ck_add(&ck, sz);
        ck_add(&ck, (uint64_t)(uintptr_t)p[i]);
        if (i % 2) live += sz;
    }
    for (int i = 0; i < n; i += 2) ck_add(&ck, (uint64_t)cudaFree(p[i]));
    printf("live=%llu\n", (unsigned long long)live);
    ck_print(&ck);
    fflush(stdout);
    if (hold > 0) sleep((unsigned)hold);
    return code;
}
