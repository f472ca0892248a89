/* naive_preload.so: a deliberately naive LD_PRELOAD that only exports cuMemAlloc_v2,
 * cuMemFree_v2 and cuMemCreate (no dlsym or cuGetProcAddress hooks). selftest.sh uses it
 * to check the sim reproduces cuda-facts.md: such a hook sees nothing of what cudart
 * does (cudart uses cuGetProcAddress pointers), but sees ggml's direct -lcuda VMM calls,
 * and never sees the driver calling itself. Counts go to stderr at exit. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>

#define SIM_CUDA_NO_API_DEFINES
#include "sim_cuda.h"

static _Atomic long n_alloc, n_free, n_create;

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    n_alloc++;
    CUresult (*real)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))dlsym(RTLD_NEXT, "cuMemAlloc_v2");
    return real(dptr, bytesize);
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
    n_free++;
    CUresult (*real)(CUdeviceptr) = (CUresult(*)(CUdeviceptr))dlsym(RTLD_NEXT, "cuMemFree_v2");
    return real(dptr);
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags) {
    n_create++;
    CUresult (*real)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long) =
        (CUresult(*)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long))dlsym(
            RTLD_NEXT, "cuMemCreate");
    return real(h, size, prop, flags);
}

__attribute__((destructor)) static void report(void) {
    fprintf(stderr, "naive_preload: cuMemAlloc_v2=%ld cuMemFree_v2=%ld cuMemCreate=%ld\n", (long)n_alloc,
            (long)n_free, (long)n_create);
}
