/* ask: one cudaMalloc of BYTES (the first argument, default 100 MiB) on device 0, which
 * fails when the device has less free; prints `result=<cudaError_t>` and frees what it
 * got. For the tests of another process holding the device (the holder untraced). */
#include "common.h"
#include "sim_cuda_runtime.h"

int main(int argc, char **argv) {
    uint64_t bytes = argc > 1 ? strtoull(argv[1], NULL, 10) : 100 * MiB;
    cksum_t ck;
    ck_init(&ck);
    if (cudaSetDevice(0)) DIE("cudaSetDevice");
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, (size_t)bytes);
    ck_add(&ck, (uint64_t)e);
    printf("result=%d\n", (int)e);
    if (e == cudaSuccess && cudaFree(p)) DIE("cudaFree");
    ck_print(&ck);
    return 0;
}
