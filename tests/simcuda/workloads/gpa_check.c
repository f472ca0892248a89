/* gpa_check: checks the sim's cuGetProcAddress against dlsym, the way the real
 * driver behaves (cuda-facts.md). Not a workload: run by selftest.sh without any
 * interposer. Prints "gpa_check ok" and exits 0, or names the first mismatch. */
#include <dlfcn.h>

#include "common.h"
#define SIM_CUDA_NO_API_DEFINES
#include "sim_cuda.h"

typedef CUresult (*gpa2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*gpa1_t)(const char *, void **, int, cuuint64_t);

static void *lib;
static int fails;

static void want(gpa2_t g, const char *sym, int ver, cuuint64_t fl, const char *exported) {
    void *p = (void *)1;
    CUdriverProcAddressQueryResult st = 99;
    CUresult r = g(sym, &p, ver, fl, &st);
    void *d = dlsym(lib, exported);
    if (r != CUDA_SUCCESS || st != CU_GET_PROC_ADDRESS_SUCCESS || !d || p != d) {
        fprintf(stderr, "MISMATCH %s@%d flags %llu: r=%d st=%d p=%p, dlsym(%s)=%p\n", sym, ver,
                (unsigned long long)fl, r, st, p, exported, d);
        fails++;
    }
}

static void want_fail(gpa2_t g, const char *sym, int ver, CUdriverProcAddressQueryResult want_st) {
    void *p = (void *)1;
    CUdriverProcAddressQueryResult st = 99;
    CUresult r = g(sym, &p, ver, 0, &st);
    if (r != CUDA_ERROR_NOT_FOUND || st != want_st || p != NULL) {
        fprintf(stderr, "EXPECTED FAILURE %s@%d: r=%d st=%d p=%p\n", sym, ver, r, st, p);
        fails++;
    }
}

int main(void) {
    lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) DIE("dlopen: %s", dlerror());
    gpa2_t g = (gpa2_t)dlsym(lib, "cuGetProcAddress_v2");
    gpa1_t g1 = (gpa1_t)dlsym(lib, "cuGetProcAddress");
    if (!g || !g1) DIE("no cuGetProcAddress");
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    if (g("cuGetProcAddress", &p, 12000, 0, &st) || p != (void *)g) DIE("cuGetProcAddress@12000 is not _v2");
    if (g("cuGetProcAddress", &p, 11030, 0, &st) || p != (void *)g1) DIE("cuGetProcAddress@11030 is not v1");
    g = (gpa2_t)p == (void *)g1 ? g : g; /* keep using _v2 */
    want(g, "cuMemAlloc", 3020, 0, "cuMemAlloc_v2");
    want(g, "cuMemAlloc", 13000, 0, "cuMemAlloc_v2");
    want(g, "cuMemFree", 3020, 0, "cuMemFree_v2");
    want(g, "cuMemGetInfo", 3020, 0, "cuMemGetInfo_v2");
    want(g, "cuMemAllocPitch", 3020, 0, "cuMemAllocPitch_v2");
    want(g, "cuMemAllocManaged", 12000, 0, "cuMemAllocManaged");
    want(g, "cuArrayCreate", 3020, 0, "cuArrayCreate_v2");
    want(g, "cuArray3DCreate", 3020, 0, "cuArray3DCreate_v2");
    want(g, "cuIpcOpenMemHandle", 11000, 0, "cuIpcOpenMemHandle_v2");
    want(g, "cuMemCreate", 12000, 0, "cuMemCreate");
    want(g, "cuMemMap", 12000, 0, "cuMemMap");
    want(g, "cuMemAllocAsync", 11020, 0, "cuMemAllocAsync");
    want(g, "cuMemAllocAsync", 11020, 2, "cuMemAllocAsync_ptsz");
    want(g, "cuMemFreeAsync", 11020, 2, "cuMemFreeAsync_ptsz");
    want(g, "cuMemAllocFromPoolAsync", 12000, 2, "cuMemAllocFromPoolAsync_ptsz");
    want(g, "cuMemAllocFromPoolAsync", 12000, 1, "cuMemAllocFromPoolAsync");
    want(g, "cuMemImportFromShareableHandle", 12000, 0, "cuMemImportFromShareableHandle");
    want_fail(g, "cuNoSuchFunction", 13000, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    want_fail(g, "cuMemAllocAsync", 11000, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    p = (void *)1;
    if (g1("cuMemAlloc", &p, 12000, 0) || p != dlsym(lib, "cuMemAlloc_v2")) {
        fprintf(stderr, "v1 cuGetProcAddress cuMemAlloc mismatch\n");
        fails++;
    }
    if (g1("cuNoSuchFunction", &p, 12000, 0) != CUDA_ERROR_NOT_FOUND || p) {
        fprintf(stderr, "v1 unknown symbol not NOT_FOUND\n");
        fails++;
    }
    if (fails) return 1;
    printf("gpa_check ok\n");
    return 0;
}
