// Where the stream-ordered allocator's extra device memory comes from (issue #10): on the
// H200, a PyTorch process in backend:cudaMallocAsync mode used 70 MiB more (NVML, per
// process) than in the other two modes, beyond everything its pool reserved. This probe
// takes PyTorch out: one bare scenario per process, through the driver API only (dlopen,
// no CUDA headers, so it builds with gcc anywhere and runs on the simulated driver too).
// After each step it prints one JSON line: the device's free bytes (cuMemGetInfo), this
// process's bytes by NVML (where there is NVML), and the pool's reserved and used bytes.
//   gcc -O2 -o overhead_probe overhead_probe.c -ldl
//   ./overhead_probe SCENARIO    (malloc | async | async-threshold | pool | malloc-then-async |
//                                  streams | priority-streams)
// "streams" makes 128 streams and no allocation, then destroys them; "priority-streams" the
// same with cuStreamCreateWithPriority, 32 per priority level, as PyTorch's stream pool
// does (c10's getStreamFromPool, which its async backend calls when it starts on a device
// and the other two modes only when the program asks for a stream). The steps give the
// bytes per stream, then all are destroyed and 128 made again. Measured on the H200 (driver
// 580): 64 streams 34 MiB, 128 70 MiB (PyTorch's stream pool: the 70 MiB its async mode used
// beyond its pool), and destroying them gave nothing back.
// The probe's own allocations are 2 MiB (and one of 64 MiB), so every other byte that a
// step adds to the device's used memory is the driver's.
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUmemoryPool;

typedef struct {
    int allocType;   // CU_MEM_ALLOCATION_TYPE_PINNED = 1
    int handleTypes; // CU_MEM_HANDLE_TYPE_NONE = 0
    int locationType; // CU_MEM_LOCATION_TYPE_DEVICE = 1
    int locationId;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} PoolProps;
_Static_assert(sizeof(PoolProps) == 88, "CUmemPoolProps is 88 bytes");

enum { ATTR_RELEASE_THRESHOLD = 4, ATTR_RESERVED_MEM_CURRENT = 5, ATTR_USED_MEM_CURRENT = 7 };

// nvmlProcessInfo_t as nvmlDeviceGetComputeRunningProcesses_v3 fills it.
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} NvmlProcess;

static struct {
    CUresult (*cuInit)(unsigned);
    CUresult (*cuDeviceGet)(int *, int);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, int);
    CUresult (*cuCtxSetCurrent)(CUcontext);
    CUresult (*cuMemGetInfo)(size_t *, size_t *);
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
    CUresult (*cuMemFree)(CUdeviceptr);
    CUresult (*cuStreamCreate)(CUstream *, unsigned);
    CUresult (*cuStreamCreateWithPriority)(CUstream *, unsigned, int);
    CUresult (*cuStreamDestroy)(CUstream);
    CUresult (*cuStreamSynchronize)(CUstream);
    CUresult (*cuDeviceGetDefaultMemPool)(CUmemoryPool *, int);
    CUresult (*cuMemPoolCreate)(CUmemoryPool *, const PoolProps *);
    CUresult (*cuMemPoolGetAttribute)(CUmemoryPool, int, void *);
    CUresult (*cuMemPoolSetAttribute)(CUmemoryPool, int, void *);
    CUresult (*cuMemPoolTrimTo)(CUmemoryPool, size_t);
    CUresult (*cuMemAllocAsync)(CUdeviceptr *, size_t, CUstream);
    CUresult (*cuMemAllocFromPoolAsync)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*cuMemFreeAsync)(CUdeviceptr, CUstream);
} D;

static struct {
    int ok;
    void *device;
    int (*get_processes)(void *, unsigned *, NvmlProcess *);
} nvml;

static const char *scenario = "";
static CUmemoryPool pool;
// The probe's own cuMemAlloc bytes still allocated.
static size_t malloc_live;

static void *need(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "overhead_probe: libcuda has no %s\n", name);
        exit(2);
    }
    return p;
}

static void check(CUresult r, const char *what) {
    if (r != 0) {
        fprintf(stderr, "overhead_probe: %s failed: CUresult %d\n", what, r);
        exit(3);
    }
}

static void load(void) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) {
        fprintf(stderr, "overhead_probe: %s\n", dlerror());
        exit(2);
    }
    *(void **)&D.cuInit = need(cuda, "cuInit");
    *(void **)&D.cuDeviceGet = need(cuda, "cuDeviceGet");
    *(void **)&D.cuDevicePrimaryCtxRetain = need(cuda, "cuDevicePrimaryCtxRetain");
    *(void **)&D.cuCtxSetCurrent = need(cuda, "cuCtxSetCurrent");
    *(void **)&D.cuMemGetInfo = need(cuda, "cuMemGetInfo_v2");
    *(void **)&D.cuMemAlloc = need(cuda, "cuMemAlloc_v2");
    *(void **)&D.cuMemFree = need(cuda, "cuMemFree_v2");
    *(void **)&D.cuStreamCreate = need(cuda, "cuStreamCreate");
    *(void **)&D.cuStreamCreateWithPriority = need(cuda, "cuStreamCreateWithPriority");
    *(void **)&D.cuStreamDestroy = need(cuda, "cuStreamDestroy_v2");
    *(void **)&D.cuStreamSynchronize = need(cuda, "cuStreamSynchronize");
    *(void **)&D.cuDeviceGetDefaultMemPool = need(cuda, "cuDeviceGetDefaultMemPool");
    *(void **)&D.cuMemPoolCreate = need(cuda, "cuMemPoolCreate");
    *(void **)&D.cuMemPoolGetAttribute = need(cuda, "cuMemPoolGetAttribute");
    *(void **)&D.cuMemPoolSetAttribute = need(cuda, "cuMemPoolSetAttribute");
    *(void **)&D.cuMemPoolTrimTo = need(cuda, "cuMemPoolTrimTo");
    *(void **)&D.cuMemAllocAsync = need(cuda, "cuMemAllocAsync");
    *(void **)&D.cuMemAllocFromPoolAsync = need(cuda, "cuMemAllocFromPoolAsync");
    *(void **)&D.cuMemFreeAsync = need(cuda, "cuMemFreeAsync");

    void *ml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (ml) {
        int (*init)(void) = (int (*)(void))dlsym(ml, "nvmlInit_v2");
        int (*handle)(unsigned, void **) = (int (*)(unsigned, void **))dlsym(ml, "nvmlDeviceGetHandleByIndex_v2");
        *(void **)&nvml.get_processes = dlsym(ml, "nvmlDeviceGetComputeRunningProcesses_v3");
        nvml.ok = init && handle && nvml.get_processes && init() == 0 && handle(0, &nvml.device) == 0;
    }
}

// This process's bytes by NVML; -1 where there is no NVML or it does not list us.
static long long nvml_used(void) {
    if (!nvml.ok) return -1;
    NvmlProcess procs[64];
    unsigned n = 64;
    if (nvml.get_processes(nvml.device, &n, procs) != 0) return -1;
    for (unsigned i = 0; i < n && i < 64; i++)
        if (procs[i].pid == (unsigned)getpid()) return (long long)procs[i].usedGpuMemory;
    return -1;
}

static long long pool_attr(int attr) {
    uint64_t v = 0;
    if (!pool || D.cuMemPoolGetAttribute(pool, attr, &v) != 0) return -1;
    return (long long)v;
}

static void sample(const char *step) {
    size_t free = 0, total = 0;
    check(D.cuMemGetInfo(&free, &total), "cuMemGetInfo");
    printf("{\"scenario\":\"%s\",\"step\":\"%s\",\"device_free\":%zu,\"device_total\":%zu,"
           "\"nvml_used\":%lld,\"pool_reserved\":%lld,\"pool_used\":%lld,\"malloc_live\":%zu}\n",
           scenario, step, free, total, nvml_used(), pool_attr(ATTR_RESERVED_MEM_CURRENT),
           pool_attr(ATTR_USED_MEM_CURRENT), malloc_live);
    fflush(stdout);
}

// One allocation from the pool in play and its free: cuMemAllocAsync (the current
// device's pool, as cudaMallocAsync) unless the pool is one the probe created.
static void async_round(CUstream s, size_t size, int created, const char *allocated, const char *freed) {
    CUdeviceptr p = 0;
    if (created)
        check(D.cuMemAllocFromPoolAsync(&p, size, pool, s), "cuMemAllocFromPoolAsync");
    else
        check(D.cuMemAllocAsync(&p, size, s), "cuMemAllocAsync");
    check(D.cuStreamSynchronize(s), "cuStreamSynchronize");
    sample(allocated);
    check(D.cuMemFreeAsync(p, s), "cuMemFreeAsync");
    check(D.cuStreamSynchronize(s), "cuStreamSynchronize");
    sample(freed);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: overhead_probe malloc|async|async-threshold|pool|malloc-then-async|streams|priority-streams\n");
        return 1;
    }
    scenario = argv[1];
    load();
    int dev = 0;
    CUcontext ctx = 0;
    check(D.cuInit(0), "cuInit");
    check(D.cuDeviceGet(&dev, 0), "cuDeviceGet");
    // The primary context, as the runtime (and so PyTorch) uses it.
    check(D.cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    check(D.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    sample("context");
    CUstream s = 0;
    check(D.cuStreamCreate(&s, 0), "cuStreamCreate");
    sample("stream");
    const size_t two_mib = 2u << 20;

    if (!strcmp(scenario, "streams") || !strcmp(scenario, "priority-streams")) {
        // PyTorch's stream pool: cudaStreamCreateWithPriority, 32 per priority level.
        int with_priority = !strcmp(scenario, "priority-streams");
        static CUstream made[128];
        char step[40];
        for (int i = 1; i <= 128; i++) {
            if (with_priority)
                check(D.cuStreamCreateWithPriority(&made[i - 1], 1, -((i - 1) / 32)), "cuStreamCreateWithPriority");
            else
                check(D.cuStreamCreate(&made[i - 1], 0), "cuStreamCreate");
            // Every count for plain streams (where the driver's chunks begin), a few with priorities.
            if (!with_priority || i <= 5 || i == 8 || i == 9 || i == 16 || i == 17 || i == 32 || i == 33 || i == 64 ||
                i == 96 || i == 128) {
                snprintf(step, sizeof step, "streams made: %d", i);
                sample(step);
            }
        }
        for (int i = 0; i < 128; i++) check(D.cuStreamDestroy(made[i]), "cuStreamDestroy_v2");
        sample("all 128 destroyed");
        // Whether the driver gives their memory to new streams or takes more.
        for (int i = 0; i < 128; i++) check(D.cuStreamCreate(&made[i], 0), "cuStreamCreate");
        sample("made again: 128");
        return 0;
    }
    if (!strcmp(scenario, "malloc") || !strcmp(scenario, "malloc-then-async")) {
        CUdeviceptr p = 0;
        check(D.cuMemAlloc(&p, two_mib), "cuMemAlloc_v2");
        malloc_live += two_mib;
        sample("malloc 2 MiB");
        if (!strcmp(scenario, "malloc")) {
            check(D.cuMemFree(p), "cuMemFree_v2");
            malloc_live -= two_mib;
            sample("freed");
            return 0;
        }
    }
    if (!strcmp(scenario, "pool")) {
        PoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = 1;
        props.locationType = 1;
        props.locationId = dev;
        check(D.cuMemPoolCreate(&pool, &props), "cuMemPoolCreate");
        sample("pool created");
    } else {
        check(D.cuDeviceGetDefaultMemPool(&pool, dev), "cuDeviceGetDefaultMemPool");
        sample("default pool asked for");
    }
    if (!strcmp(scenario, "async-threshold")) {
        // What PyTorch's backend:cudaMallocAsync does: the pool keeps what is freed.
        uint64_t keep = UINT64_MAX;
        check(D.cuMemPoolSetAttribute(pool, ATTR_RELEASE_THRESHOLD, &keep), "cuMemPoolSetAttribute");
        sample("release threshold max");
    }
    if (!strcmp(scenario, "async") || !strcmp(scenario, "async-threshold") || !strcmp(scenario, "malloc-then-async") ||
        !strcmp(scenario, "pool")) {
        int created = !strcmp(scenario, "pool");
        async_round(s, two_mib, created, "async 2 MiB", "async freed");
        async_round(s, 64u << 20, created, "async 64 MiB", "async 64 MiB freed");
        check(D.cuMemPoolTrimTo(pool, 0), "cuMemPoolTrimTo");
        sample("trimmed to 0");
        return 0;
    }
    fprintf(stderr, "overhead_probe: unknown scenario %s\n", scenario);
    return 1;
}
